#!/usr/bin/python3
"""Text files -> byte-level train/val token shards for Trident (vocab 256: token = byte value).

Usage:
  /usr/bin/python3 data_tools/prepare_text.py INPUT... --out-dir OUT
      [--format auto|plain|fortune] [--val-fraction 0.05] [--prefix NAME_]
      [--shard-tokens 100000000] [--doc-separator '\\n']

INPUTs are files or directories (walked recursively, in sorted order). The text is split into
documents, every k-th document (k = round(1 / val_fraction); documents k-1, 2k-1, ...) goes to
the validation split, the rest to the training split. Documents are written in order, each
ending with exactly one newline and followed by --doc-separator (default: one more newline,
so documents are separated by a blank line).

Documents:
  fortune  a fortune(6) database: entries separated by lines holding only '%'; each entry is
           one document and the '%' lines are dropped.
  plain    paragraphs: blocks of lines separated by one or more blank lines.
  auto     (default) fortune if the file has a line holding only '%' or a strfile index
           NAME.dat next to it, else plain.
Skipped while walking: strfile indexes (NAME.dat next to NAME), binary files (a NUL byte in
the first 8 KiB), and paths that resolve to a file already read (e.g. the NAME.u8 symlinks
of Debian's fortunes), so /usr/share/games/fortunes can be given as it is.

Writes OUT/{prefix}train_000.bin ... and OUT/{prefix}val_000.bin ... (llm.c shard layout, a
new shard every --shard-tokens tokens; stale shards with the same prefix are removed first)
and OUT/{prefix}stats.json with train_tokens, val_tokens and unigram_entropy_nats (the entropy
H = -sum p log p of the train split's byte frequencies, the loss of a model that only knows
byte frequencies), and prints the same figures. See docs/data.md.
"""

import argparse
import codecs
import glob
import json
import math
import os
import struct
import sys

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
MAX_SHARD_TOKENS = 2**31 - 1  # the header's count is an int32


def write_shard(path, data):
    """Writes bytes `data` as a shard of uint16 tokens (token = byte value)."""
    n = len(data)
    if n > MAX_SHARD_TOKENS:
        raise ValueError(f"{path}: {n} tokens do not fit an int32 count")
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = MAGIC, VERSION, n
    # uint16 little-endian: each byte followed by a zero byte.
    body = bytearray(2 * n)
    body[0::2] = data
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack(f"<{HEADER_INTS}i", *header))
        f.write(body)
    os.replace(tmp, path)


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
            sys.exit(f"prepare_text.py: error: input '{inp}' does not exist")
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
    keep = {os.path.realpath(p) for p in keep}
    removed = []
    for split in ("train", "val"):
        pattern = f"{glob.escape(prefix)}{split}_[0-9][0-9][0-9]*.bin"
        for path in sorted(glob.glob(os.path.join(glob.escape(out_dir), pattern))):
            if os.path.realpath(path) not in keep:
                os.remove(path)
                removed.append(path)
    return removed


def write_split(out_dir, prefix, split, data, shard_tokens):
    paths = []
    n_shards = max(1, -(-len(data) // shard_tokens))
    for i in range(n_shards):
        path = os.path.join(out_dir, f"{prefix}{split}_{i:03d}.bin")
        write_shard(path, data[i * shard_tokens:(i + 1) * shard_tokens])
        paths.append(path)
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Text files -> byte-level (vocab 256) train/val token shards.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("inputs", nargs="+", help="text files or directories (recursive)")
    ap.add_argument("--out-dir", required=True, help="output directory (created)")
    ap.add_argument("--format", choices=("auto", "plain", "fortune"), default="auto",
                    help="how files split into documents (default: auto)")
    ap.add_argument("--val-fraction", type=float, default=0.05,
                    help="every round(1/f)-th document goes to val; 0: no val (default 0.05)")
    ap.add_argument("--prefix", default="", help="prefix of the output file names")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000,
                    help="start a new shard after this many tokens (default 1e8)")
    ap.add_argument("--quiet", action="store_true",
                    help="one line for the skipped files instead of one per file")
    ap.add_argument("--doc-separator", default="\\n",
                    help="bytes after each document, Python escapes allowed (default '\\n')")
    args = ap.parse_args(argv)

    if not 0.0 <= args.val_fraction <= 0.5:
        ap.error("--val-fraction must be in [0, 0.5]")
    if not 0 < args.shard_tokens <= MAX_SHARD_TOKENS:
        ap.error(f"--shard-tokens must be in [1, {MAX_SHARD_TOKENS}]")
    sep = codecs.escape_decode(args.doc_separator.encode("utf-8"))[0]
    k = round(1.0 / args.val_fraction) if args.val_fraction > 0 else 0

    files, skipped = collect_files(args.inputs)
    if args.quiet and skipped:
        print(f"skipped {len(skipped)} files (strfile indexes, duplicates, binaries)",
              file=sys.stderr)
    else:
        for path, why in skipped:
            print(f"skip {path} ({why})", file=sys.stderr)
    if not files:
        sys.exit("prepare_text.py: error: no text file among the inputs")

    train, val = bytearray(), bytearray()
    n_docs = n_val_docs = 0
    formats = {"fortune": 0, "plain": 0}
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        fmt = args.format if args.format != "auto" else detect_format(path, data)
        formats[fmt] += 1
        docs = fortune_documents(data) if fmt == "fortune" else plain_documents(data)
        for doc in docs:
            if k and n_docs % k == k - 1:
                val += doc + sep
                n_val_docs += 1
            else:
                train += doc + sep
            n_docs += 1

    if not train:
        sys.exit("prepare_text.py: error: the inputs hold no text")
    if k and not val:
        print(f"warning: only {n_docs} documents, the validation split is empty "
              "(no val shard written)", file=sys.stderr)

    os.makedirs(args.out_dir, exist_ok=True)
    train_paths = write_split(args.out_dir, args.prefix, "train", bytes(train), args.shard_tokens)
    val_paths = write_split(args.out_dir, args.prefix, "val", bytes(val),
                            args.shard_tokens) if val else []
    # Shards of an earlier run that this one did not overwrite would be picked up by a glob.
    for path in remove_stale(args.out_dir, args.prefix, train_paths + val_paths):
        print(f"removed stale {path}", file=sys.stderr)

    counts = [0] * 256
    for b, c in enumerate(_byte_counts(train)):
        counts[b] = c
    h = entropy_nats(counts, len(train))
    stats = {
        "train_tokens": len(train),
        "val_tokens": len(val),
        "unigram_entropy_nats": h,
        "unigram_entropy_bits": h / math.log(2),
        "vocab_size": 256,
        "distinct_tokens": sum(1 for c in counts if c),
        "files": len(files),
        "documents": n_docs,
        "val_documents": n_val_docs,
        "val_every": k,
        "train_shards": [os.path.basename(p) for p in train_paths],
        "val_shards": [os.path.basename(p) for p in val_paths],
    }
    stats_path = os.path.join(args.out_dir, f"{args.prefix}stats.json")
    with open(stats_path, "w") as f:
        json.dump(stats, f, indent=2)
        f.write("\n")

    print(f"files:     {len(files)} ({formats['fortune']} fortune, {formats['plain']} plain), "
          f"{n_docs} documents, "
          + (f"every k-th to val (k = {k}): {n_val_docs} val documents" if k else "no val split"))
    print(f"train:     {len(train)} tokens in {len(train_paths)} shard(s): "
          + ", ".join(train_paths))
    print(f"val:       {len(val)} tokens in {len(val_paths)} shard(s)"
          + (": " + ", ".join(val_paths) if val_paths else ""))
    print(f"unigram entropy of train: {h:.4f} nats ({h / math.log(2):.4f} bits) per token, "
          f"{stats['distinct_tokens']} distinct bytes")
    print(f"stats:     {stats_path}")
    return 0


def _byte_counts(data):
    """Counts of each byte value (bytes.count per value: fast, no third-party code)."""
    data = bytes(data)
    return [data.count(bytes((b,))) for b in range(256)]


if __name__ == "__main__":
    sys.exit(main())
