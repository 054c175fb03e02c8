#!/usr/bin/env python3
"""Every code point through Trident's tokenizer (`trident tokenize`) and Hugging Face
`tokenizers`, in six contexts, with a GPT-2-style and a Llama-3-style pre-tokenizer: prints the
number of characters whose ids differ (and the first of them), exit 1 if any do.

The contexts of a character X (CONTEXTS below):
  alone              "X"
  between letters    "aXb"    a letter run through X: is X a letter?
  after a space      "a Xb"   ' ?\\p{L}+', ' ?[^\\s\\p{L}\\p{N}]+' and '\\s+(?!\\S)' meet at X
  between digits     "1X2"    is X a number?
  after punctuation  "!X"     Llama 3's '[^\\r\\n\\p{L}\\p{N}]?\\p{L}+' against ' ?[^\\s...]+'
  repeated           "XXX"    a run of X: one piece or several?

The pre-tokenizers:
  gpt2    ByteLevel (use_regex: GPT-2's regex), as GPT-2's tokenizer.json
  llama3  Sequence [Split (Llama 3's regex, Isolated), ByteLevel (use_regex = false)]

The ids show every piece the pre-tokenizer cuts: the vocabulary is the 256 byte tokens plus
every piece `tokenizers` cuts from the texts, with `ignore_merges` (a piece that is an entry is
that one token) and no merges, so `tokenizers` gives one id per piece, and Trident the same
ids only where it cuts the same pieces (a piece it cuts otherwise is not an entry and falls
apart into bytes, or is another entry). The code points are taken in chunks (a vocabulary
each). Surrogates (U+D800-U+DFFF) are not text and are left out: 1,112,064 characters.

  .venv/bin/python bench/tokenizer_unicode_scan.py --trident build/app/trident
  ... --slice        the blocks CI runs (tests/tools/CMakeLists.txt): seconds
  ... --first 0x31350 --last 0x3234F --pattern llama3

Without `tokenizers` it exits 77 (CTest: skipped). The whole scan: about 6 min per pattern
on 2 busy cores; the slice: seconds.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SKIP = 77
CONTEXTS = [("alone", "{0}"), ("between letters", "a{0}b"), ("after a space", "a {0}b"),
            ("between digits", "1{0}2"), ("after punctuation", "!{0}"),
            ("repeated", "{0}{0}{0}")]
# Llama 3's pre-tokenizer pattern (its tokenizer.json's Split regex).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# The CI slice: blocks where PCRE2's tables and Oniguruma's have differed (whitespace, U+180E,
# characters added in Unicode 15.0, 15.1 and 16.0), beside stable ones (ASCII, Latin-1).
SLICE_BLOCKS = [
    (0x0000, 0x00FF, "Basic Latin, Latin-1 (U+0085 NEL, U+00A0)"),
    (0x1800, 0x18AF, "Mongolian (U+180E, \\s in PCRE2, Cf in Oniguruma)"),
    (0x1C80, 0x1C8F, "Cyrillic Extended-C (U+1C89-1C8A: Unicode 16.0 in an older block)"),
    (0xA7C0, 0xA7FF, "Latin Extended-D, its end (U+A7CB-A7DC: Unicode 16.0)"),
    (0x2000, 0x206F, "General Punctuation (spaces, U+2028/2029)"),
    (0x3000, 0x303F, "CJK Symbols and Punctuation (U+3000)"),
    (0x11F00, 0x11F5F, "Kawi (Unicode 15.0)"),
    (0x1E030, 0x1E08F, "Cyrillic Extended-D (Unicode 15.0)"),
    (0x31350, 0x3144F, "CJK Extension H, first 256 (Unicode 15.0)"),
    (0x2EBF0, 0x2ECEF, "CJK Extension I, first 256 (Unicode 15.1)"),
    (0x10D40, 0x10D8F, "Garay (Unicode 16.0)"),
    (0x11380, 0x113FF, "Tulu-Tigalari (Unicode 16.0)"),
    (0x1E5D0, 0x1E5FF, "Ol Onal (Unicode 16.0)"),
    (0x1CC00, 0x1CEBF, "Symbols for Legacy Computing Supplement (Unicode 16.0: Nd, So)"),
]
CHUNK = 1 << 16


def code_points(first, last):
    return [c for c in range(first, last + 1) if not 0xD800 <= c <= 0xDFFF]


def pre_tokenizer(kind):
    from tokenizers import Regex, pre_tokenizers
    if kind == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])


def build_tokenizer(kind, texts, path):
    """A tokenizer whose vocabulary holds every piece `tokenizers` cuts from `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    pre = pre_tokenizer(kind)
    vocab = {}
    for token in pre_tokenizers.ByteLevel.alphabet():
        vocab.setdefault(token, len(vocab))
    for text in texts:
        for piece, _ in pre.pre_tokenize_str(text):
            vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], ignore_merges=True))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.save(path)
    return Tokenizer.from_file(path)


def trident_ids(binary, path, texts):
    """Trident's ids of each text: `--lines` for those without a newline, one call each for
    the others (a newline would end the line)."""
    out = [None] * len(texts)
    lined = [i for i, t in enumerate(texts) if "\n" not in t]
    data = "".join(texts[i] + "\n" for i in lined).encode()
    p = subprocess.run([binary, "tokenize", "--tokenizer", path, "--lines"], input=data,
                       capture_output=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"trident tokenize --lines exited {p.returncode}: "
                 f"{p.stderr.decode(errors='replace').strip()}")
    lines = p.stdout.decode().split("\n")[:-1]
    if len(lines) != len(lined):
        sys.exit(f"trident tokenize --lines: {len(lines)} id lines for {len(lined)} texts")
    for i, line in zip(lined, lines):
        out[i] = [int(x) for x in line.split()]
    for i, text in enumerate(texts):
        if out[i] is None:
            p = subprocess.run([binary, "tokenize", "--tokenizer", path],
                               input=text.encode(), capture_output=True, timeout=60)
            if p.returncode != 0:
                sys.exit(f"trident tokenize exited {p.returncode}: {p.stderr.decode().strip()}")
            out[i] = [int(x) for x in p.stdout.split()]
    return out


def scan(kind, cps, binary, tmp):
    """{code point: [contexts where the ids differ]} over `cps`, and the texts compared."""
    differing = {}
    compared = 0
    for start in range(0, len(cps), CHUNK):
        chunk = cps[start:start + CHUNK]
        texts = [form.format(chr(c)) for c in chunk for _, form in CONTEXTS]
        path = os.path.join(tmp, f"{kind}.json")
        tok = build_tokenizer(kind, texts, path)
        theirs = [e.ids for e in tok.encode_batch(texts, add_special_tokens=True)]
        ours = trident_ids(binary, path, texts)
        for i, (a, b) in enumerate(zip(ours, theirs)):
            if a != b:
                c = chunk[i // len(CONTEXTS)]
                differing.setdefault(c, []).append(CONTEXTS[i % len(CONTEXTS)][0])
        compared += len(texts)
        if len(cps) > CHUNK:
            print(f"{kind}: U+{chunk[0]:04X}..U+{chunk[-1]:04X} done, {len(differing)} "
                  "characters differ so far", file=sys.stderr, flush=True)
    return differing, compared


def describe(c):
    """U+XXXX and its name where this Python's Unicode data has one."""
    import unicodedata
    version = unicodedata.unidata_version
    return f"U+{c:04X} {unicodedata.name(chr(c), f'(unnamed in Python Unicode {version})')}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trident", required=True, help="the trident executable")
    parser.add_argument("--python", help="an interpreter with `tokenizers` (the venv's), "
                        "run instead when this one lacks it")
    parser.add_argument("--pattern", choices=["gpt2", "llama3", "both"], default="both")
    parser.add_argument("--slice", action="store_true", help="only the CI blocks")
    parser.add_argument("--first", type=lambda s: int(s, 0), default=0)
    parser.add_argument("--last", type=lambda s: int(s, 0), default=0x10FFFF)
    parser.add_argument("--show", type=int, default=20, help="differing characters listed")
    args = parser.parse_args()
    try:
        import tokenizers
    except ImportError:
        if args.python and not os.environ.get("TRIDENT_SCAN_IN_VENV") and \
                os.access(args.python, os.X_OK):
            os.environ["TRIDENT_SCAN_IN_VENV"] = "1"
            os.execv(args.python, [args.python] + sys.argv)
        print("SKIPPED: the Python package 'tokenizers' is missing (scripts/install_deps.sh)",
              file=sys.stderr)
        return SKIP
    if args.slice:
        cps = sorted({c for a, b, _ in SLICE_BLOCKS for c in code_points(a, b)})
        where = f"{len(SLICE_BLOCKS)} blocks"
    else:
        cps = code_points(args.first, args.last)
        where = f"U+{args.first:04X}..U+{args.last:04X}"
    kinds = ["gpt2", "llama3"] if args.pattern == "both" else [args.pattern]
    failed = False
    with tempfile.TemporaryDirectory(prefix="trident_unicode_scan_") as tmp:
        for kind in kinds:
            began = time.time()
            differing, compared = scan(kind, cps, args.trident, tmp)
            print(f"{kind}: {len(differing)} of {len(cps)} characters ({where}) differ from "
                  f"tokenizers {tokenizers.__version__} in at least one of {len(CONTEXTS)} "
                  f"contexts ({compared} texts, {time.time() - began:.0f} s)")
            for c in sorted(differing)[:args.show]:
                print(f"  {describe(c)}: {', '.join(differing[c])}")
            if len(differing) > args.show:
                print(f"  ... and {len(differing) - args.show} more")
            failed |= bool(differing)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
