#!/usr/bin/python3
"""CTest check of Trident's C++ tokenizer (lib/tokenizer, `trident tokenize`) against Hugging
Face `tokenizers` (tests/tools/CMakeLists.txt runs one case per tokenizer):

  prepare-text  the byte-level BPE data_tools/prepare_text.py --train-tokenizer trains (GPT-2's
                ByteLevel pre-tokenizer; merges as ["a", "b"] arrays, as `tokenizers` writes)
  gpt2          a GPT-2-style tokenizer.json: ByteLevel(add_prefix_space=False) with its GPT-2
                regex, ByteLevel post-processor, '<|endoftext|>' added last as in GPT-2, merges
                rewritten as "a b" strings (the older form, as GPT-2's own file has them)
  llama3        a Llama-3-style one: Sequence [Split(Llama 3's regex, Isolated), ByteLevel
                (use_regex=False)], ignore_merges, special tokens, a TemplateProcessing
                post-processor that puts '<|begin_of_text|>' first

Each tokenizer is trained here on the fortunes corpus (no network). The texts: the whole
corpus as one text, a file of tricky text (CJK, emoji, combining marks, right-to-left
scripts, numbers, whitespace runs, newlines, tabs, contractions in both cases, special tokens
inside text), and each line of that file as a text of its own (`tokenize --lines`). The ids
must equal HF's encode(text).ids (add_special_tokens=True) token for token, and decoding them
must give the text back (with the template's special tokens in front), as HF's
decode(ids, skip_special_tokens=False) does. The gpt2 case also runs its file with ByteLevel's
add_prefix_space = true (decoded: the text with those spaces, as HF decodes it). The figures
compared are printed; comparing nothing fails.

Usage: test_tokenizer.py CASE --trident BIN --python VENV_PYTHON [--fortunes DIR]
Without the venv's `tokenizers` or the fortunes corpus the case exits 77 (CTest: skipped).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREPARE_TEXT = os.path.join(REPO, "data_tools", "prepare_text.py")
SKIP = 77

# Llama 3's pre-tokenizer pattern (its tokenizer.json's Split regex).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TRICKY_LINES = [
    "Hello, world! How's it going?",
    "I'm sure you're right, we've seen it, he'd know, they'll come, it's done, don't.",
    "I'M SURE YOU'RE RIGHT, WE'VE SEEN IT, HE'D KNOW, THEY'LL COME, IT'S DONE, DON'T.",
    "Mixed: I'M you'Re We'VE he'D They'Ll IT's dOn'T 'S 'T 'RE 'VE 'M 'LL 'D 's 't",
    "'s at the start, and quotes 'quoted' \"double\" `back`",
    "日本語のテキスト、中文文本，한국어 텍스트。",
    "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🇫🇷 🏳️‍🌈 ❤️ 🎉🎉🎉",
    "Combining: e\u0301 a\u0308 n\u0303 Z\u0351\u0357\u0336a\u0347\u0353l\u0328g\u0315o\u0336",
    "RTL: مرحبا بالعالم שלום עולם ‏mixed‏ עברית123",
    "Numbers: 0 1 12 123 1234 12345 1234567890 3.14159 -42 1,000,000 1e-10 0x1F",
    "Other digits: ٣٤٥ ① ½ Ⅻ ²³ 四五六 ０１２",
    "Whitespace:   three  two\tone\t\ttabs \u00a0nbsp\u2003em\u3000ideographic",
    "   leading spaces",
    "trailing spaces   ",
    "\ttab first",
    "tab last\t",
    " ",
    "",
    "Punctuation!!! ??? ... --- *** ((())) [[]] {{}} <<>> @@ ## $$ %% ^^ && __",
    "Mixed123abc ABC123 a1b2c3 hello_world foo.bar(baz) x+=1; y==2",
    "Special <|endoftext|> inside and <|begin_of_text|> and <|eot_id|> and <|endof partial",
    "<|endoftext|>",
    "Accents: café naïve résumé Ångström Ærø Øre straße ÇÃÕ ĳ ŉ ǅ",
    "Greek Ελληνικά, Cyrillic Кириллица, Devanagari देवनागरी, Thai ภาษาไทย",
    "Math: ∀x∈ℝ, ∃y: x²+y²≤1 ⇒ √(x) ∞ ≠ ≈ ∑ ∏ ∫",
    "Line separator\u2028paragraph\u2029next line\u0085nel",
    "Zero width: a\u200bb\u200cc\u200dd\ufeffe",
    "Windows line\r",
    "CR\rin the\rmiddle",
]
# The whole file adds what lines cannot hold: newline runs, blank lines, CRLF, indentation.
TRICKY_TEXT = ("\n".join(TRICKY_LINES) + "\n\n\n  \n\t\n" + "Para one.\n\nPara two.\r\n\r\n"
               + "    indented\n        more\n" + "end without newline   ")


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def read_fortunes(root):
    """The corpus as prepare_text.py reads it: each file once (the .u8 links and strfile
    indexes skipped), in sorted order, as UTF-8 (invalid bytes replaced)."""
    seen, parts = set(), []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            real = os.path.realpath(path)
            if name.endswith(".dat") or real in seen or not os.path.isfile(real):
                continue
            seen.add(real)
            with open(real, "rb") as f:
                data = f.read()
            if b"\0" in data[:8192]:
                continue
            parts.append(data.decode("utf-8", errors="replace"))
    return "\n".join(parts)


def train_gpt2_style(corpus, path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=2048, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([corpus], trainer=trainer)
    tok.add_special_tokens(["<|endoftext|>"])  # the last id, as GPT-2's 50256
    spec = json.loads(tok.to_str())
    merges = spec["model"]["merges"]
    if merges and isinstance(merges[0], list):
        spec["model"]["merges"] = [f"{a} {b}" for a, b in merges]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False)
    check_merge_form(path, str)


def check_merge_form(path, form):
    """Both forms of merges are covered: `form` is str ("a b") or list (["a", "b"])."""
    with open(path, encoding="utf-8") as f:
        merges = json.load(f)["model"]["merges"]
    if not merges or not all(isinstance(m, form) for m in merges):
        fail(f"{path}: expected merges in the {form.__name__} form")


def train_llama3_style(corpus, path):
    from tokenizers import (Regex, Tokenizer, decoders, models, pre_tokenizers, processors,
                            trainers)
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|reserved_0|>"]
    trainer = trainers.BpeTrainer(vocab_size=3000, show_progress=False, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([corpus], trainer=trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    tok.save(path)


def trident(args, stdin_bytes, binary):
    p = subprocess.run([binary, "tokenize"] + args, input=stdin_bytes, capture_output=True,
                       timeout=600)
    if p.returncode != 0:
        fail(f"trident tokenize {' '.join(args)} exited {p.returncode}: "
             f"{p.stderr.decode(errors='replace')}")
    return p.stdout


def parse_id_lines(out):
    return [[int(x) for x in line.split()] for line in out.decode().split("\n")[:-1]]


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare(name, tok, path, texts, binary, round_trip=True):
    """Encodes `texts` (one per line with --lines when there are several) with both and
    decodes the ids with `trident tokenize --decode`: the text again (round_trip; else, as
    add_prefix_space adds spaces, what tokenizers' decode gives). Returns the tokens compared."""
    many = len(texts) > 1
    data = ("\n".join(texts) + ("\n" if many else "")).encode()
    ours = parse_id_lines(trident(["--tokenizer", path] + (["--lines"] if many else []),
                                  data, binary))
    if len(ours) != len(texts):
        fail(f"{name}: {len(ours)} id lines for {len(texts)} texts")
    prefix = tok.decode(tok.encode("").ids, skip_special_tokens=False)
    compared = 0
    expected = ""
    for text, mine in zip(texts, ours):
        theirs = tok.encode(text).ids
        if mine != theirs:
            i = first_difference(mine, theirs)
            fail(f"{name}: ids differ at token {i} of {len(theirs)} for text "
                 f"{text[:60]!r}...: trident {mine[max(0, i - 3):i + 5]} "
                 f"(= {[tok.id_to_token(t) for t in mine[max(0, i - 3):i + 5]]}), "
                 f"tokenizers {theirs[max(0, i - 3):i + 5]} "
                 f"(= {[tok.id_to_token(t) for t in theirs[max(0, i - 3):i + 5]]})")
        compared += len(theirs)
        theirs_decoded = tok.decode(theirs, skip_special_tokens=False)
        if round_trip and theirs_decoded != prefix + text:
            fail(f"{name}: tokenizers' own decode does not give the text back: {text[:60]!r}")
        expected += theirs_decoded + ("\n" if many else "")
    # decode(encode(x)) == x, through `trident tokenize --decode`.
    ids_text = "\n".join(" ".join(map(str, ids)) for ids in ours) + ("\n" if many else "")
    decoded = trident(["--tokenizer", path, "--decode"] + (["--lines"] if many else []),
                      ids_text.encode(), binary).decode()
    if decoded != expected:
        i = first_difference(decoded, expected)
        fail(f"{name}: decode(encode(text)) differs at character {i}: "
             f"{decoded[max(0, i - 20):i + 20]!r} vs {expected[max(0, i - 20):i + 20]!r}")
    return compared


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=["prepare-text", "gpt2", "llama3"])
    parser.add_argument("--trident", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--fortunes", default="/usr/share/games/fortunes")
    args = parser.parse_args()
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        # Run again under the venv's interpreter, which has it (scripts/install_deps.sh).
        # (The venv's python links to the system's: the environment marks the second run.)
        if not os.environ.get("TRIDENT_TOKENIZER_TEST_IN_VENV") and \
                os.access(args.python, os.X_OK):
            os.environ["TRIDENT_TOKENIZER_TEST_IN_VENV"] = "1"
            os.execv(args.python, [args.python] + sys.argv)
        print(f"SKIPPED: the Python package 'tokenizers' is missing ({args.python}); run "
              "scripts/install_deps.sh", file=sys.stderr)
        return SKIP
    if not os.path.isdir(args.fortunes):
        print(f"SKIPPED: no fortunes corpus at {args.fortunes} (Debian package 'fortunes'; "
              "scripts/install_deps.sh)", file=sys.stderr)
        return SKIP
    from tokenizers import Tokenizer

    corpus = read_fortunes(args.fortunes)
    with tempfile.TemporaryDirectory(prefix="trident_tokenizer_") as tmp:
        path = os.path.join(tmp, "tokenizer.json")
        if args.case == "prepare-text":
            p = subprocess.run([sys.executable, PREPARE_TEXT, args.fortunes, "--out-dir", tmp,
                                "--train-tokenizer", "4096", "--quiet"],
                               capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                fail(f"prepare_text.py failed: {p.stdout}{p.stderr}")
            check_merge_form(path, list)
        elif args.case == "gpt2":
            train_gpt2_style(corpus, path)
        else:
            train_llama3_style(corpus, path)
        variants = [(args.case, path)]
        if args.case == "gpt2":
            # ByteLevel's add_prefix_space, which puts a space before each stretch of text
            # between added tokens.
            with open(path, encoding="utf-8") as f:
                spec = json.load(f)
            spec["pre_tokenizer"]["add_prefix_space"] = True
            prefixed = os.path.join(tmp, "tokenizer_prefix_space.json")
            with open(prefixed, "w", encoding="utf-8") as f:
                json.dump(spec, f, ensure_ascii=False)
            variants.append(("gpt2 add_prefix_space", prefixed))
        total = 0
        for variant, variant_path in variants:
            tok = Tokenizer.from_file(variant_path)
            for name, texts in (("fortunes corpus", [corpus]), ("tricky file", [TRICKY_TEXT]),
                                ("tricky lines", TRICKY_LINES)):
                round_trip = variant_path == path
                n = compare(f"{variant}: {name}", tok, variant_path, texts, args.trident,
                            round_trip)
                print(f"{variant}: {name}: {len(texts)} text(s), {n} tokens identical to "
                      f"tokenizers {tokenizers.__version__}; " +
                      ("decode(encode(x)) == x" if round_trip else "decodes as tokenizers'"))
                total += n
        if total == 0:
            fail("no tokens compared")
        print(f"{args.case}: {total} tokens compared, all identical "
              f"(vocabulary {tok.get_vocab_size()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
