#!/usr/bin/python3
"""Text files -> train/val token files for Trident: byte-level (vocab 256, token = byte value)
or tokenized with a Hugging Face tokenizer (given, or trained here as a byte-level BPE), written
as llm.c shards or as Megatron-LM indexed datasets (.bin + .idx).

Usage:
  /usr/bin/python3 data_tools/prepare_text.py INPUT... --out-dir OUT
      [--format auto|plain|fortune] [--val-fraction 0.05] [--prefix NAME_]
      [--shard-tokens 100000000] [--doc-separator '\\n'] [--output-format llmc|megatron]
  .venv/bin/python data_tools/prepare_text.py INPUT... --out-dir OUT
      (--tokenizer tokenizer.json | --train-tokenizer N) [--eod-token TOKEN]
      [--output-format llmc|megatron] [other options as above]

INPUTs are files or directories (walked recursively, in sorted order). The text is split into
documents, every k-th document (k = round(1 / val_fraction); documents k-1, 2k-1, ...) goes to
the validation split, the rest to the training split. Documents are written in order.

Documents:
  fortune  a fortune(6) database: entries separated by lines holding only '%'; each entry is
           one document and the '%' lines are dropped.
  plain    paragraphs: blocks of lines separated by one or more blank lines.
  auto     (default) fortune if the file has a line holding only '%' or a strfile index
           NAME.dat next to it, else plain.
Skipped while walking: strfile indexes (NAME.dat next to NAME), binary files (a NUL byte in
the first 8 KiB), and paths that resolve to a file already read (e.g. the NAME.u8 symlinks
of Debian's fortunes), so /usr/share/games/fortunes can be given as it is.
Each document ends with exactly one newline.

Tokens:
  byte-level (default; standard library only, runs with /usr/bin/python3): token = byte
           value, vocab 256; each document is followed by --doc-separator (default: one more
           newline, so documents are separated by a blank line).
  --tokenizer FILE  a Hugging Face tokenizer.json, applied with the `tokenizers` library (run
           with the repository's .venv/bin/python; scripts/install_deps.sh makes it). Each
           document is decoded as UTF-8 (invalid bytes become U+FFFD, counted on stderr),
           encoded as Megatron-LM's tools/preprocess_data.py does (the tokenizer's own special
           tokens included, i.e. add_special_tokens=True) and followed by the end-of-document
           token, as Megatron's --append-eod does: --eod-token, default '<|endoftext|>'.
  --train-tokenizer N  first trains a byte-level BPE with a vocabulary of N on the training
           split (the GPT-2 pre-tokenizer regex, ByteLevel decoder, '<|endoftext|>' as the one
           special token, id 0), saves it as OUT/{prefix}tokenizer.json and then tokenizes with
           it. Deterministic: the same corpus gives the same tokenizer.json byte for byte.

Output (--output-format):
  llmc     (default) OUT/{prefix}train_000.bin ... and OUT/{prefix}val_000.bin ..., a new shard
           every --shard-tokens tokens, in llm.c's layout (dev/data/data_common.py): 256 int32
           header (magic, version, token count), then the tokens: uint16 (magic 20240520,
           version 1) when the vocabulary has at most 65536 ids, else uint32 (magic 20240801,
           version 7). Train with data.train = "OUT/{prefix}train_*.bin".
  megatron OUT/{prefix}train.bin + .idx and OUT/{prefix}val.bin + .idx, byte-identical to what
           Megatron-LM's IndexedDatasetBuilder writes for the same tokens with one sequence per
           document: uint16 tokens when the vocabulary has fewer than 65500 ids, else int32
           (Megatron's DType.optimal_dtype). Train with data.train = "OUT/{prefix}train".
Outputs of an earlier run with the same prefix that this run did not rewrite (shards, .bin/.idx
pairs of either format) are removed, so a glob or prefix never picks up stale files.

OUT/{prefix}stats.json holds train_tokens, val_tokens, unigram_entropy_nats (the entropy
H = -sum p log p of the training split's token frequencies: the loss of a model that only knows
token frequencies, the baseline to beat), vocab_size, format, token_dtype, tokenizer, the
end-of-document token, data_train / data_val (the values for the config's data.train and
data.val) and the file names; the same figures are printed. See docs/data.md.
"""

import argparse
import codecs
import collections
import glob
import json
import math
import os
import struct
import sys
import time
from array import array

HEADER_INTS = 256
MAX_SHARD_TOKENS = 2**31 - 1  # the header's count is an int32
# llm.c's shard headers (dev/data/data_common.py, HEADERS_INFO): "gpt-2" and "llama-3".
LLMC_UINT16 = (20240520, 1)
LLMC_UINT32 = (20240801, 7)
# Megatron-LM's index (megatron/core/datasets/indexed_dataset.py): _INDEX_HEADER, version 1,
# DType codes, and DType.optimal_dtype's bound (uint16 below it, int32 from it on).
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_VERSION = 1
MEGATRON_DTYPE_CODE = {"uint16": 8, "int32": 4}
MEGATRON_UINT16_BELOW = 65500
DEFAULT_EOD = "<|endoftext|>"
# array typecodes of the token dtypes; 'I' and 'i' are 4 bytes on every platform CPython runs
# on that we care about, checked below rather than assumed.
ARRAY_CODE = {"uint16": "H", "uint32": "I", "int32": "i"}
for _code, _size in (("H", 2), ("I", 4), ("i", 4), ("q", 8)):
    assert array(_code).itemsize == _size, f"array('{_code}') is not {_size} bytes here"


def fail(message):
    """One error line naming the file or option, exit status 1."""
    sys.exit(f"prepare_text.py: error: {message}")


def token_bytes(tokens, dtype):
    """Little-endian bytes of `tokens` (bytes: the byte-level path; or a sequence of ints)."""
    if isinstance(tokens, (bytes, bytearray)):
        assert dtype == "uint16"
        # uint16 little-endian of byte values: each byte followed by a zero byte.
        body = bytearray(2 * len(tokens))
        body[0::2] = tokens
        return bytes(body)
    a = tokens if isinstance(tokens, array) and tokens.typecode == ARRAY_CODE[dtype] \
        else array(ARRAY_CODE[dtype], tokens)
    if sys.byteorder == "big":
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def write_atomically(path, chunks):
    """Writes the byte strings `chunks` to path through a temporary name, so that a killed
    run never leaves a half-written file under the real name."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
    os.replace(tmp, path)


def write_shard(path, tokens, dtype="uint16"):
    """Writes an llm.c shard: 256 int32 header (magic, version, count), then the tokens."""
    n = len(tokens)
    if n > MAX_SHARD_TOKENS:
        raise ValueError(f"{path}: {n} tokens do not fit an int32 count")
    magic, version = LLMC_UINT16 if dtype == "uint16" else LLMC_UINT32
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = magic, version, n
    write_atomically(path, [struct.pack(f"<{HEADER_INTS}i", *header), token_bytes(tokens, dtype)])


def write_megatron(prefix, tokens, doc_lengths, dtype):
    """Writes PREFIX.bin and PREFIX.idx as Megatron-LM's IndexedDatasetBuilder does when
    tools/preprocess_data.py adds each document as one sequence (add_document(ids, [len])):
    the .bin is the tokens back to back; the .idx is the header (magic, version, dtype code,
    sequence count S, document-index count D), int32 lengths[S], int64 byte pointers[S],
    int64 document_indices[D] = 0 then the sequence count after each document. A document
    with no tokens adds no sequence but still an index (add_document with lengths [])."""
    itemsize = 2 if dtype == "uint16" else 4
    lengths, document_indices = array("i"), array("q", [0])
    for n in doc_lengths:
        if n > 2**31 - 1:
            raise ValueError(f"{prefix}.idx: a document of {n} tokens does not fit int32")
        if n:
            lengths.append(n)
        document_indices.append(len(lengths))
    pointers, offset = array("q"), 0
    for n in lengths:
        pointers.append(offset)
        offset += n * itemsize
    for a in (lengths, pointers, document_indices):
        if sys.byteorder == "big":
            a.byteswap()
    header = (MEGATRON_MAGIC + struct.pack("<Q", MEGATRON_VERSION)
              + struct.pack("<B", MEGATRON_DTYPE_CODE[dtype])
              + struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(document_indices)))
    write_atomically(prefix + ".bin", [token_bytes(tokens, dtype)])
    write_atomically(prefix + ".idx", [header, lengths.tobytes(), pointers.tobytes(),
                                      document_indices.tobytes()])


def is_binary(path):
    with open(path, "rb") as f:
        return b"\0" in f.read(8192)


def collect_files(inputs):
    """Input files in order: directories walked recursively and sorted; duplicates (by real
    path), strfile indexes and binary files skipped. Returns (files, skipped)."""
    candidates = []
    for inp in inputs:
        if os.path.isdir(inp):
            for root, dirs, names in os.walk(inp, followlinks=False):
                dirs.sort()
                for name in sorted(names):
                    candidates.append((os.path.join(root, name), False))
        elif os.path.exists(inp):
            candidates.append((inp, True))
        else:
            fail(f"input '{inp}' does not exist")
    files, skipped, seen = [], [], set()
    for path, explicit in candidates:
        real = os.path.realpath(path)
        if not os.path.isfile(real):
            skipped.append((path, "not a regular file"))
            continue
        if real in seen:
            skipped.append((path, "duplicate of a file already read"))
            continue
        if path.endswith(".dat") and os.path.isfile(path[:-4]) and not explicit:
            skipped.append((path, "strfile index"))
            continue
        if is_binary(real):
            skipped.append((path, "binary"))
            continue
        seen.add(real)
        files.append(path)
    # A symlink listed before its target (e.g. x.u8 -> x sorts after x, but other names may
    # not): the dedup above keeps whichever came first, which is all that matters.
    return files, skipped


def split_lines(data):
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def fortune_documents(data):
    docs, cur = [], []
    for line in split_lines(data):
        if line.rstrip(b"\r") == b"%":
            docs.append(cur)
            cur = []
        else:
            cur.append(line)
    docs.append(cur)
    out = []
    for lines in docs:
        # Drop blank lines at the edges; keep the inside byte for byte.
        while lines and lines[0].strip() == b"":
            lines = lines[1:]
        while lines and lines[-1].strip() == b"":
            lines = lines[:-1]
        if lines:
            out.append(b"\n".join(lines) + b"\n")
    return out


def plain_documents(data):
    out, cur = [], []
    for line in split_lines(data):
        if line.strip() == b"":
            if cur:
                out.append(b"\n".join(cur) + b"\n")
                cur = []
        else:
            cur.append(line)
    if cur:
        out.append(b"\n".join(cur) + b"\n")
    return out


def detect_format(path, data):
    if os.path.isfile(path + ".dat"):
        return "fortune"
    if any(line.rstrip(b"\r") == b"%" for line in split_lines(data)):
        return "fortune"
    return "plain"


def entropy_nats(counts, total):
    if total == 0:
        return 0.0
    h = 0.0
    for c in counts:
        if c:
            p = c / total
            h -= p * math.log(p)
    return h


def remove_stale(out_dir, prefix, keep):
    """Removes what an earlier run with this prefix wrote (llm.c shards, Megatron .bin/.idx
    pairs) and this run did not rewrite: a glob or prefix must not pick up stale files."""
    keep = {os.path.realpath(p) for p in keep}
    d = glob.escape(out_dir)
    removed = []
    for split in ("train", "val"):
        stem = glob.escape(prefix + split)
        paths = glob.glob(os.path.join(d, f"{stem}_[0-9][0-9][0-9]*.bin"))
        paths += [p for p in (os.path.join(out_dir, f"{prefix}{split}{ext}")
                              for ext in (".bin", ".idx")) if os.path.isfile(p)]
        for path in sorted(paths):
            if os.path.realpath(path) not in keep:
                os.remove(path)
                removed.append(path)
    return removed


def write_split(out_dir, prefix, split, data, shard_tokens, dtype="uint16"):
    paths = []
    n_shards = max(1, -(-len(data) // shard_tokens))
    for i in range(n_shards):
        path = os.path.join(out_dir, f"{prefix}{split}_{i:03d}.bin")
        write_shard(path, data[i * shard_tokens:(i + 1) * shard_tokens], dtype)
        paths.append(path)
    return paths


def import_tokenizers(option):
    """The `tokenizers` library, imported only when a tokenizer is asked for, so that the
    byte-level path runs with the plain system interpreter."""
    try:
        import tokenizers
    except ImportError:
        fail(f"{option} needs the Python package 'tokenizers' (not found by {sys.executable}); "
             "run scripts/install_deps.sh and use .venv/bin/python")
    return tokenizers


def train_bpe(texts, vocab_size, path):
    """Trains a byte-level BPE (GPT-2's pre-tokenizer and decoder) on `texts` and saves it to
    `path`. Deterministic: the trainer breaks ties between equally frequent pairs by the pair
    itself and the file lists the vocabulary by id, so the same texts give the same file
    (tests/tools/test_prepare_text.py checks it across processes and thread counts)."""
    import_tokenizers("--train-tokenizer")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[DEFAULT_EOD], show_progress=False,
        # All 256 byte symbols, so that any text (not only the training split's) encodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tmp = path + ".tmp"
    tokenizer.save(tmp, pretty=True)
    os.replace(tmp, path)
    return path


def load_tokenizer(path, option):
    import_tokenizers(option)
    from tokenizers import Tokenizer
    if not os.path.isfile(path):
        fail(f"{option} '{path}' does not exist or is not a file")
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # the library raises a bare Exception on a malformed file
        first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
        fail(f"{option} '{path}' is not a Hugging Face tokenizer.json: {first_line}")


def encode_documents(tokenizer, texts, eod_id, dtype):
    """Token ids of the documents in order, each followed by eod_id (skipped for a document
    with no tokens, as Megatron's --append-eod does). Returns (stream array, lengths)."""
    stream, lengths = array(ARRAY_CODE[dtype]), []
    batch = 4096  # documents per encode_batch call: parallel inside, bounded memory outside
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    for i in range(0, len(texts), batch):
        for enc in encode(texts[i:i + batch]):
            ids = enc.ids
            if ids:
                stream.extend(ids)
                stream.append(eod_id)
            lengths.append(len(ids) + 1 if ids else 0)
    return stream, lengths


def decode_documents(docs, counter):
    """UTF-8 text of each document; invalid bytes become U+FFFD (counted in counter[0])."""
    texts = []
    for doc in docs:
        try:
            texts.append(doc.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(doc.decode("utf-8", errors="replace"))
            counter[0] += 1
    return texts


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Text files -> train/val token files (byte-level or a Hugging Face "
                    "tokenizer; llm.c shards or Megatron .bin/.idx).",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("inputs", nargs="+", help="text files or directories (recursive)")
    ap.add_argument("--out-dir", required=True, help="output directory (created)")
    ap.add_argument("--format", choices=("auto", "plain", "fortune"), default="auto",
                    help="how files split into documents (default: auto)")
    ap.add_argument("--val-fraction", type=float, default=0.05,
                    help="every round(1/f)-th document goes to val; 0: no val (default 0.05)")
    ap.add_argument("--prefix", default="", help="prefix of the output file names")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000,
                    help="llmc: start a new shard after this many tokens (default 1e8)")
    ap.add_argument("--quiet", action="store_true",
                    help="one line for the skipped files instead of one per file")
    ap.add_argument("--doc-separator", default=None,
                    help="byte-level only: bytes after each document, Python escapes allowed "
                         "(default '\\n')")
    tok = ap.add_mutually_exclusive_group()
    tok.add_argument("--tokenizer", metavar="FILE",
                     help="tokenize with this Hugging Face tokenizer.json (needs the "
                          "'tokenizers' package: .venv/bin/python); default: byte-level")
    tok.add_argument("--train-tokenizer", type=int, metavar="N",
                     help="train a byte-level BPE with vocabulary N (>= 257) on the training "
                          "split, save it as OUT/{prefix}tokenizer.json, tokenize with it")
    ap.add_argument("--eod-token", metavar="TOKEN",
                    help="with a tokenizer: the token appended after each document (default "
                         f"'{DEFAULT_EOD}')")
    ap.add_argument("--output-format", choices=("llmc", "megatron"), default="llmc",
                    help="llmc: llm.c shards NAME_train_000.bin ...; megatron: NAME_train.bin "
                         "+ .idx as Megatron-LM's preprocess_data.py (default: llmc)")
    args = ap.parse_args(argv)

    if not 0.0 <= args.val_fraction <= 0.5:
        ap.error("--val-fraction must be in [0, 0.5]")
    if not 0 < args.shard_tokens <= MAX_SHARD_TOKENS:
        ap.error(f"--shard-tokens must be in [1, {MAX_SHARD_TOKENS}]")
    byte_level = args.tokenizer is None and args.train_tokenizer is None
    if byte_level and args.eod_token is not None:
        ap.error("--eod-token needs --tokenizer or --train-tokenizer")
    if not byte_level and args.doc_separator is not None:
        ap.error("--doc-separator is for the byte-level path; with a tokenizer each document "
                 "is followed by the --eod-token")
    if args.train_tokenizer is not None and args.train_tokenizer < 257:
        ap.error(f"--train-tokenizer {args.train_tokenizer}: the vocabulary must hold the 256 "
                 "byte symbols and <|endoftext|>, so N >= 257")
    sep = codecs.escape_decode(
        (args.doc_separator if args.doc_separator is not None else "\\n").encode("utf-8"))[0]
    k = round(1.0 / args.val_fraction) if args.val_fraction > 0 else 0

    files, skipped = collect_files(args.inputs)
    if args.quiet and skipped:
        print(f"skipped {len(skipped)} files (strfile indexes, duplicates, binaries)",
              file=sys.stderr)
    else:
        for path, why in skipped:
            print(f"skip {path} ({why})", file=sys.stderr)
    if not files:
        fail("no text file among the inputs")

    train_docs, val_docs = [], []
    n_docs = 0
    formats = {"fortune": 0, "plain": 0}
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        fmt = args.format if args.format != "auto" else detect_format(path, data)
        formats[fmt] += 1
        docs = fortune_documents(data) if fmt == "fortune" else plain_documents(data)
        for doc in docs:
            (val_docs if k and n_docs % k == k - 1 else train_docs).append(doc)
            n_docs += 1
    n_val_docs = len(val_docs)
    if not train_docs:
        fail("the inputs hold no text")
    if k and not val_docs:
        print(f"warning: only {n_docs} documents, the validation split is empty "
              "(no val file written)", file=sys.stderr)
    os.makedirs(args.out_dir, exist_ok=True)

    timings = {}
    tokenizer_path, eod, eod_id = None, None, None
    if byte_level:
        vocab_size = 256
        train = b"".join(doc + sep for doc in train_docs)
        val = b"".join(doc + sep for doc in val_docs)
        train_lengths = [len(doc) + len(sep) for doc in train_docs]
        val_lengths = [len(doc) + len(sep) for doc in val_docs]
    else:
        bad = [0]
        train_texts = decode_documents(train_docs, bad)
        val_texts = decode_documents(val_docs, bad)
        if bad[0]:
            print(f"warning: {bad[0]} documents are not valid UTF-8; their invalid bytes were "
                  "replaced by U+FFFD", file=sys.stderr)
        if args.train_tokenizer is not None:
            tokenizer_path = os.path.join(args.out_dir, f"{args.prefix}tokenizer.json")
            t0 = time.perf_counter()
            train_bpe(train_texts, args.train_tokenizer, tokenizer_path)
            timings["train_tokenizer_s"] = time.perf_counter() - t0
            option = "--train-tokenizer"
        else:
            tokenizer_path, option = args.tokenizer, "--tokenizer"
        tokenizer = load_tokenizer(tokenizer_path, option)
        vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        eod = args.eod_token if args.eod_token is not None else DEFAULT_EOD
        eod_id = tokenizer.token_to_id(eod)
        if eod_id is None:
            fail(f"{option} '{tokenizer_path}' has no token '{eod}'"
                 + ("; name the end-of-document token with --eod-token"
                    if args.eod_token is None else " (--eod-token)"))
        t0 = time.perf_counter()
        train, train_lengths = encode_documents(tokenizer, train_texts, eod_id, "uint32")
        val, val_lengths = encode_documents(tokenizer, val_texts, eod_id, "uint32")
        timings["encode_s"] = time.perf_counter() - t0
        # The dtype follows the vocabulary (as Megatron's does); a tokenizer whose ids have
        # gaps can emit an id >= its vocabulary size, and the model needs every id below it.
        max_id = max(max(train, default=0), max(val, default=0))
        if max_id >= vocab_size:
            vocab_size = max_id + 1

    if args.output_format == "llmc":
        dtype = "uint16" if vocab_size <= 65536 else "uint32"
    else:
        dtype = "uint16" if vocab_size < MEGATRON_UINT16_BELOW else "int32"
    if dtype == "int32" and vocab_size > 2**31:
        fail(f"vocabulary of {vocab_size} ids does not fit Megatron's int32 tokens")

    t0 = time.perf_counter()
    if args.output_format == "llmc":
        train_paths = write_split(args.out_dir, args.prefix, "train", train, args.shard_tokens,
                                  dtype)
        val_paths = write_split(args.out_dir, args.prefix, "val", val, args.shard_tokens,
                                dtype) if len(val) else []
        written = train_paths + val_paths
        data_train = os.path.join(args.out_dir, f"{args.prefix}train_*.bin")
        data_val = os.path.join(args.out_dir, f"{args.prefix}val_*.bin") if val_paths else ""
    else:
        train_prefix = os.path.join(args.out_dir, f"{args.prefix}train")
        val_prefix = os.path.join(args.out_dir, f"{args.prefix}val")
        write_megatron(train_prefix, train, train_lengths, dtype)
        train_paths = [train_prefix + ".bin", train_prefix + ".idx"]
        val_paths = []
        if len(val):
            write_megatron(val_prefix, val, val_lengths, dtype)
            val_paths = [val_prefix + ".bin", val_prefix + ".idx"]
        written = train_paths + val_paths
        data_train, data_val = train_prefix, (val_prefix if val_paths else "")
    timings["write_s"] = time.perf_counter() - t0
    for path in remove_stale(args.out_dir, args.prefix, written):
        print(f"removed stale {path}", file=sys.stderr)

    if byte_level:
        # bytes.count per value: fast, and the summation order the byte-level figures have
        # always had (stats.json stays identical).
        counts = _byte_counts(train)
    else:
        counter = collections.Counter(train)
        counts = [counter[t] for t in sorted(counter)]
    h = entropy_nats(counts, len(train))
    stats = {
        "train_tokens": len(train),
        "val_tokens": len(val),
        "unigram_entropy_nats": h,
        "unigram_entropy_bits": h / math.log(2),
        "vocab_size": vocab_size,
        "distinct_tokens": sum(1 for c in counts if c),
        "files": len(files),
        "documents": n_docs,
        "val_documents": n_val_docs,
        "val_every": k,
    }
    if args.output_format == "llmc" and byte_level:
        # The byte-level llm.c stats keep their earlier keys (and only add the ones below).
        stats["train_shards"] = [os.path.basename(p) for p in train_paths]
        stats["val_shards"] = [os.path.basename(p) for p in val_paths]
    stats.update({
        "format": args.output_format,
        "token_dtype": dtype,
        "tokenizer": tokenizer_path,  # null: byte-level
        "eod_token": eod,
        "eod_id": eod_id,
        "data_train": data_train,
        "data_val": data_val,
        "train_files": [os.path.basename(p) for p in train_paths],
        "val_files": [os.path.basename(p) for p in val_paths],
    })
    stats_path = os.path.join(args.out_dir, f"{args.prefix}stats.json")
    with open(stats_path, "w") as f:
        json.dump(stats, f, indent=2)
        f.write("\n")

    print(f"files:     {len(files)} ({formats['fortune']} fortune, {formats['plain']} plain), "
          f"{n_docs} documents, "
          + (f"every k-th to val (k = {k}): {n_val_docs} val documents" if k else "no val split"))
    if not byte_level:
        how = (f"trained in {timings['train_tokenizer_s']:.2f} s"
               if "train_tokenizer_s" in timings else "given")
        print(f"tokenizer: {tokenizer_path} ({how}), vocab {vocab_size}, "
              f"end of document '{eod}' = {eod_id}; encoded in {timings['encode_s']:.2f} s")
    unit = "shard(s)" if args.output_format == "llmc" else "files"
    print(f"train:     {len(train)} tokens in {len(train_paths)} {unit}: "
          + ", ".join(train_paths))
    print(f"val:       {len(val)} tokens in {len(val_paths)} {unit}"
          + (": " + ", ".join(val_paths) if val_paths else ""))
    if not byte_level or args.output_format != "llmc":
        print(f"format:    {args.output_format}, {dtype} tokens; data.train = \"{data_train}\""
              + (f", data.val = \"{data_val}\"" if data_val else ""))
    what = "bytes" if byte_level else "tokens"
    print(f"unigram entropy of train: {h:.4f} nats ({h / math.log(2):.4f} bits) per token, "
          f"{stats['distinct_tokens']} distinct {what}")
    print(f"stats:     {stats_path}")
    return 0


def _byte_counts(data):
    """Counts of each byte value (bytes.count per value: fast, no third-party code)."""
    data = bytes(data)
    return [data.count(bytes((b,))) for b in range(256)]


if __name__ == "__main__":
    sys.exit(main())
