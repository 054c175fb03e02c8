#!/usr/bin/python3
"""CTest checks of data_tools/prepare_text.py (tests/tools/CMakeLists.txt runs one per case):

  byte-level          the byte-level path is unchanged (shards byte for byte as before the
                      tokenizer options existed, same stats figures; fortunes: 3.3055 nats),
                      and it runs on the system interpreter even where `tokenizers` cannot be
                      imported (it is imported lazily).
  megatron-reader     .bin/.idx written with a trained tokenizer (uint16) and with a large
                      tokenizer (int32) read back by Trident's C++ reader (tests/tools/
                      read_tokens.cpp): documents equal the token lists computed here with
                      `tokenizers`; windows through TokenDataset (the data.train prefix path).
  megatron-identity   byte identity with Megatron-LM's IndexedDatasetBuilder: a minimal
                      reimplementation below written from megatron/core/datasets/
                      indexed_dataset.py (not from the tool), uint16 and int32, and byte-level.
  determinism         --train-tokenizer: the same corpus gives the same tokenizer.json byte for
                      byte (another process, one thread); a different corpus does not.
  llmc                llm.c shards: uint16 (magic 20240520, version 1) and uint32 (20240801, 7)
                      headers and contents, as llm.c's dev/data/data_common.py writes them.
  errors              bad options and inputs: one error line naming the file or option, exit 1.

Usage: test_prepare_text.py CASE --python VENV_PYTHON [--reader READ_TOKENS]
All cases but byte-level need the venv's `tokenizers` and numpy; without them the case exits
77, which CTest reports as skipped (SKIP_RETURN_CODE).
"""

import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, "data_tools", "prepare_text.py")
SKIP = 77
FORTUNES = "/usr/share/games/fortunes"


class Failure(Exception):
    pass


def check(cond, message):
    if not cond:
        raise Failure(message)


def run_tool(python, args, env_extra=None, expect_ok=True):
    env = dict(os.environ)
    env.update(env_extra or {})
    p = subprocess.run([python, TOOL] + args, capture_output=True, text=True, env=env,
                       timeout=300)
    if expect_ok and p.returncode != 0:
        raise Failure(f"prepare_text.py {' '.join(args)} failed ({p.returncode}):\n"
                      f"{p.stdout}{p.stderr}")
    return p


# ---------------------------------------------------------------------------------------------
# The corpus: one fortune database and one plain-text file, with non-ASCII UTF-8. The golden
# hashes of the byte-level case were made from exactly this corpus by the tool as it was before
# the tokenizer options (commit 2da0b1a), so this function must not change.

WORDS = ("the cat sat on a mat while the dog ate the hat; "
         "caf\u00e9 na\u00efve \u00fcber \u65e5\u672c 42 tokens, then more text").split()


def corpus_documents():
    """(fortune entries, plain paragraphs), each document's text ending with one newline."""
    fortunes = []
    for i in range(60):
        n = 3 + (i * 7) % 11
        line = " ".join(WORDS[(i + j * 3) % len(WORDS)] for j in range(n))
        fortunes.append(f"{line}.\n\t\t-- author {i % 5}\n" if i % 4 == 0 else line + "\n")
    paras = []
    for i in range(25):
        n = 5 + (i * 5) % 13
        paras.append(" ".join(WORDS[(i * 2 + j) % len(WORDS)] for j in range(n)) + "\n"
                     + "second line of paragraph " + str(i) + "\n")
    return fortunes, paras


def write_corpus(d):
    os.makedirs(d, exist_ok=True)
    fortunes, paras = corpus_documents()
    with open(os.path.join(d, "quotes"), "w", encoding="utf-8") as f:
        f.write("%\n".join(fortunes))
    with open(os.path.join(d, "story.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(paras))
    # Files are read in sorted order: quotes, then story.txt.
    return fortunes + paras


def split_documents(docs, k):
    """(train, val): every k-th document (k-1, 2k-1, ...) to val, as the tool documents."""
    train = [d for i, d in enumerate(docs) if not (k and i % k == k - 1)]
    val = [d for i, d in enumerate(docs) if k and i % k == k - 1]
    return train, val


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# ---------------------------------------------------------------------------------------------
# byte-level

GOLDEN_SMALL = {  # --shard-tokens 3000 --val-fraction 0.1 --prefix s_, before the change
    "s_train_000.bin": "c2475c5f07672ad88f69e2da09528fce27f4e9b25fc33a67298d12ba4da3ce9f",
    "s_train_001.bin": "6519793defc51978d5327903eb9883a01561f397f497567cb23f7b5b17e8ebae",
    "s_val_000.bin": "3c5ada8607f7b2e06d148b939c3f18581168b07627551e1e07bd922df38eba7a",
}
GOLDEN_SMALL_STATS = {
    "train_tokens": 4200, "val_tokens": 390, "unigram_entropy_nats": 3.149574454781223,
    "unigram_entropy_bits": 4.5438754468234315, "vocab_size": 256, "distinct_tokens": 47,
    "files": 2, "documents": 85, "val_documents": 8, "val_every": 10,
    "train_shards": ["s_train_000.bin", "s_train_001.bin"], "val_shards": ["s_val_000.bin"],
}
GOLDEN_FORTUNES = {  # Debian's fortunes, default options (the README demo's figures)
    "train_000.bin": "8420d817d8266a65971ec23368ede81a00b7c872d78f65146cd0ead299176619",
    "val_000.bin": "ab9ea9ea5e8e8686d8f9d5fc5fc0fcd778653093c1cfc72fd40bd62e195660ea",
}
GOLDEN_FORTUNES_STATS = {"train_tokens": 2430909, "val_tokens": 130535,
                         "unigram_entropy_nats": 3.305478897333195}


def case_byte_level(tmp, args):
    # CTest runs this case with the system interpreter (TRIDENT_SYSTEM_PYTHON, /usr/bin/python3):
    # the tool runs on it too, as the demo runs it.
    system_python = sys.executable
    corpus = os.path.join(tmp, "corpus")
    write_corpus(corpus)
    # A `tokenizers` that cannot be imported: the byte-level path must not import it.
    poison = os.path.join(tmp, "poison")
    os.makedirs(poison)
    with open(os.path.join(poison, "tokenizers.py"), "w") as f:
        f.write("raise ImportError('tokenizers must not be imported on the byte-level path')\n")
    env = {"PYTHONPATH": poison}
    out = os.path.join(tmp, "out")
    run_tool(system_python, [corpus, "--out-dir", out, "--shard-tokens", "3000",
                             "--val-fraction", "0.1", "--prefix", "s_"], env)
    written = sorted(n for n in os.listdir(out) if n.endswith(".bin"))
    check(written == sorted(GOLDEN_SMALL), f"shards {written}, expected {sorted(GOLDEN_SMALL)}")
    for name, digest in GOLDEN_SMALL.items():
        check(sha256(os.path.join(out, name)) == digest, f"{name} differs from before")
    stats = json.load(open(os.path.join(out, "s_stats.json")))
    for key, value in GOLDEN_SMALL_STATS.items():
        check(stats.get(key) == value, f"stats {key} = {stats.get(key)!r}, was {value!r}")
    check(stats["format"] == "llmc" and stats["tokenizer"] is None
          and stats["data_train"] == os.path.join(out, "s_train_*.bin"),
          f"new stats keys: {stats}")

    # The byte-level path also writes Megatron's format: documents + separator as sequences.
    p = run_tool(system_python, [corpus, "--out-dir", out, "--val-fraction", "0.1",
                                 "--prefix", "s_", "--output-format", "megatron"], env)
    check(sorted(os.listdir(out)) == ["s_stats.json", "s_train.bin", "s_train.idx",
                                      "s_val.bin", "s_val.idx"],
          f"megatron outputs (stale llm.c shards removed): {sorted(os.listdir(out))}\n{p.stderr}")
    train, _ = split_documents(write_corpus(corpus), 10)
    data = open(os.path.join(out, "s_train.bin"), "rb").read()
    expected = b"".join(b"".join(bytes((c, 0)) for c in d.encode() + b"\n") for d in train)
    check(data == expected, "byte-level megatron .bin is not the documents + '\\n' as uint16")

    if not os.path.isdir(FORTUNES):
        print(f"note: {FORTUNES} missing (Debian package fortunes): the fortunes figures "
              "were not checked")
        return
    out = os.path.join(tmp, "fortunes")
    p = run_tool(system_python, [FORTUNES, "--out-dir", out, "--quiet"], env)
    for name, digest in GOLDEN_FORTUNES.items():
        check(sha256(os.path.join(out, name)) == digest, f"fortunes {name} differs from before")
    stats = json.load(open(os.path.join(out, "stats.json")))
    for key, value in GOLDEN_FORTUNES_STATS.items():
        check(stats[key] == value, f"fortunes stats {key} = {stats[key]!r}, was {value!r}")
    check("unigram entropy of train: 3.3055 nats" in p.stdout, p.stdout)
    print("fortunes: 3.3055 nats, shards unchanged")


# ---------------------------------------------------------------------------------------------
# Tokenizers (venv only from here on)

BIG_EOD = "</doc>"


BIG_VOCAB = 70004


def make_big_tokenizer(path):
    """A byte-level BPE with 70004 ids, so Megatron writes int32 and llm.c uint32 tokens, whose
    text actually uses ids above 65535: merges 'th' (70000), 'the' (70001), the special
    '</doc>' (70002) and a beginning-of-text '<s>' (70003) that its post-processor puts before
    every text, as Llama 3's does (Megatron's HuggingFace tokenizer encodes with the special
    tokens, so the tool must too). Ids 256..69999 are fillers that no merge reaches. It has no
    '<|endoftext|>', so --eod-token must name '</doc>'."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for i in range(len(vocab), 70000):
        vocab[f"<filler_{i}>"] = i
    vocab["th"], vocab["the"] = 70000, 70001
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("t", "h"), ("th", "e")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([BIG_EOD, "<s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 70003)])
    tok.save(path)
    check(tok.token_to_id(BIG_EOD) == 70002 and tok.encode("the").ids == [70003, 70001]
          and tok.get_vocab_size(True) == BIG_VOCAB, "big tokenizer layout")
    return path


def expected_tokens(tokenizer_path, docs, eod):
    """Token lists of the documents computed here: encode (special tokens as Megatron's
    HuggingFace tokenizer adds them), then the end-of-document id."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_path)
    eod_id = tok.token_to_id(eod)
    check(eod_id is not None, f"{tokenizer_path} has no {eod}")
    return [tok.encode(d).ids + [eod_id] for d in docs], tok.get_vocab_size(True)


def read_with_trident(reader, prefix):
    p = subprocess.run([reader, "indexed", prefix], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"read_tokens indexed {prefix}: {p.stdout}{p.stderr}")
    lines = p.stdout.splitlines()
    head = dict(line.split(" ", 1) for line in lines[:4])
    docs = [[int(t) for t in line.split(":", 1)[1].split()] for line in lines[4:]]
    return {k: int(v) for k, v in head.items()}, docs


def case_megatron_reader(tmp, args):
    corpus = os.path.join(tmp, "corpus")
    train_docs, val_docs = split_documents(write_corpus(corpus), 10)
    big = make_big_tokenizer(os.path.join(tmp, "big.json"))
    out = os.path.join(tmp, "out")
    runs = [("trained", ["--train-tokenizer", "300"], "<|endoftext|>", 8),
            ("big", ["--tokenizer", big, "--eod-token", BIG_EOD], BIG_EOD, 4)]
    for name, options, eod, dtype_code in runs:
        run_tool(args.python, [corpus, "--out-dir", out, "--val-fraction", "0.1", "--prefix",
                               name + "_", "--output-format", "megatron"] + options)
        tok_path = (os.path.join(out, name + "_tokenizer.json") if name == "trained" else big)
        for split, docs in (("train", train_docs), ("val", val_docs)):
            expected, vocab = expected_tokens(tok_path, docs, eod)
            prefix = os.path.join(out, f"{name}_{split}")
            head, got = read_with_trident(args.reader, prefix)
            n_tokens = sum(map(len, expected))
            check(head == {"dtype": dtype_code, "sequences": len(docs),
                           "documents": len(docs), "tokens": n_tokens},
                  f"{prefix}: Trident read {head}, expected dtype {dtype_code}, "
                  f"{len(docs)} documents, {n_tokens} tokens")
            for i, (g, e) in enumerate(zip(got, expected)):
                check(g == e, f"{prefix}: document {i}: Trident read {g[:20]}..., "
                              f"expected {e[:20]}...")
            check(len(got) == len(expected), f"{prefix}: {len(got)} documents read")
            if name == "big":
                check(max(max(d) for d in got) > 65535, "big tokenizer: no id above 65535")
            # data.train = PREFIX, as a training run opens it (windows of the one stream).
            stream = [t for d in expected for t in d]
            seq_len = 16
            p = subprocess.run([args.reader, "windows", prefix, str(seq_len), str(vocab)],
                               capture_output=True, text=True, timeout=60)
            check(p.returncode == 0, f"read_tokens windows {prefix}: {p.stdout}{p.stderr}")
            lines = p.stdout.splitlines()
            check(lines[0] == f"windows {(len(stream) - 1) // seq_len}", lines[0])
            check(lines[1] == "window 0: " + " ".join(map(str, stream[:seq_len])), lines[1])
            check(lines[2] == "targets 0: " + " ".join(map(str, stream[1:seq_len + 1])),
                  lines[2])
        stats = json.load(open(os.path.join(out, name + "_stats.json")))
        check(stats["data_train"] == os.path.join(out, name + "_train")
              and stats["format"] == "megatron", f"stats: {stats}")
        print(f"{name}: vocab {stats['vocab_size']}, dtype {stats['token_dtype']}, "
              f"{stats['train_tokens']} train tokens read back by Trident")

    # An llm.c uint16 shard of the trained tokenizer through trident::TokenShard.
    run_tool(args.python, [corpus, "--out-dir", out, "--val-fraction", "0.1", "--prefix",
                           "trained_", "--tokenizer", os.path.join(out, "trained_tokenizer.json")])
    expected, _ = expected_tokens(os.path.join(out, "trained_tokenizer.json"), train_docs,
                                  "<|endoftext|>")
    p = subprocess.run([args.reader, "shard", os.path.join(out, "trained_train_000.bin")],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, p.stdout + p.stderr)
    check(p.stdout.splitlines()[1] == "shard: " + " ".join(str(t) for d in expected for t in d),
          "llm.c shard read by Trident differs from the expected tokens")


class MegatronBuilderReference:
    """Megatron-LM's IndexedDatasetBuilder + _IndexWriter (megatron/core/datasets/
    indexed_dataset.py), reduced to what tools/preprocess_data.py uses without
    --split-sentences: add_document(ids, [len(ids)]) per document, then finalize(idx_path)."""
    HEADER = b"MMIDIDX\x00\x00"
    CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6,
             "float32": 7, "uint16": 8}  # DType

    @staticmethod
    def optimal_dtype(cardinality):
        import numpy
        return numpy.uint16 if cardinality is not None and cardinality < 65500 else numpy.int32

    def __init__(self, bin_path, dtype):
        import numpy
        self.np = numpy
        self.data_file = open(bin_path, "wb")
        self.dtype = dtype
        self.sequence_lengths = []
        self.document_indices = [0]

    def add_document(self, tensor, lengths):
        np_array = self.np.array(tensor, dtype=self.dtype)
        self.data_file.write(np_array.tobytes(order="C"))
        self.sequence_lengths.extend(lengths)
        self.document_indices.append(len(self.sequence_lengths))

    def finalize(self, idx_path):
        np = self.np
        self.data_file.close()
        with open(idx_path, "wb") as f:
            f.write(self.HEADER)
            f.write(struct.pack("<Q", 1))
            f.write(struct.pack("<B", self.CODES[np.dtype(self.dtype).name]))
            itemsize = np.int64(np.dtype(self.dtype).itemsize)
            pointers, cur = [], np.int64(0)
            for length in self.sequence_lengths:
                pointers.append(cur.item())
                cur += length * itemsize
            f.write(struct.pack("<Q", len(self.sequence_lengths)))
            f.write(struct.pack("<Q", len(self.document_indices)))
            f.write(np.array(self.sequence_lengths, dtype=np.int32).tobytes(order="C"))
            f.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
            f.write(np.array(self.document_indices, dtype=np.int64).tobytes(order="C"))


def megatron_reference(prefix, docs, vocab_size):
    builder = MegatronBuilderReference(
        prefix + ".bin", MegatronBuilderReference.optimal_dtype(vocab_size))
    for ids in docs:
        if ids:  # preprocess_data.py: an empty document adds no sequence, only an index
            builder.add_document(ids, [len(ids)])
        else:
            builder.add_document([], [])
    builder.finalize(prefix + ".idx")


def same_bytes(a, b):
    da, db = open(a, "rb").read(), open(b, "rb").read()
    if da == db:
        return
    first = next((i for i in range(min(len(da), len(db))) if da[i] != db[i]), min(len(da), len(db)))
    raise Failure(f"{a} differs from the Megatron reference {b}: sizes {len(da)} / {len(db)}, "
                  f"first difference at byte {first}")


def case_megatron_identity(tmp, args):
    corpus = os.path.join(tmp, "corpus")
    docs = write_corpus(corpus)
    train_docs, val_docs = split_documents(docs, 10)
    big = make_big_tokenizer(os.path.join(tmp, "big.json"))
    out, ref = os.path.join(tmp, "out"), os.path.join(tmp, "ref")
    os.makedirs(ref)
    runs = [("trained", ["--train-tokenizer", "300"], "<|endoftext|>", 8),
            ("big", ["--tokenizer", big, "--eod-token", BIG_EOD], BIG_EOD, 4)]
    for name, options, eod, code in runs:
        run_tool(args.python, [corpus, "--out-dir", out, "--val-fraction", "0.1", "--prefix",
                               name + "_", "--output-format", "megatron"] + options)
        tok_path = os.path.join(out, name + "_tokenizer.json") if name == "trained" else big
        for split, split_docs in (("train", train_docs), ("val", val_docs)):
            expected, vocab = expected_tokens(tok_path, split_docs, eod)
            megatron_reference(os.path.join(ref, f"{name}_{split}"), expected, vocab)
            for ext in (".bin", ".idx"):
                same_bytes(os.path.join(out, f"{name}_{split}{ext}"),
                           os.path.join(ref, f"{name}_{split}{ext}"))
            with open(os.path.join(out, f"{name}_{split}.idx"), "rb") as f:
                check(f.read(18)[17] == code, f"{name}: dtype code is not {code}")
        print(f"{name}: .bin/.idx byte-identical to the Megatron reference (dtype code {code})")
    # Byte-level: vocab 256, each document + '\n' one sequence.
    run_tool(args.python, [corpus, "--out-dir", out, "--val-fraction", "0.1", "--prefix",
                           "bytes_", "--output-format", "megatron"])
    megatron_reference(os.path.join(ref, "bytes_train"),
                       [list(d.encode() + b"\n") for d in train_docs], 256)
    for ext in (".bin", ".idx"):
        same_bytes(os.path.join(out, "bytes_train" + ext), os.path.join(ref, "bytes_train" + ext))
    print("byte-level: .bin/.idx byte-identical to the Megatron reference")


def case_determinism(tmp, args):
    corpus = os.path.join(tmp, "corpus")
    write_corpus(corpus)
    outs = []
    for i, env in enumerate([{}, {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
                             {"PYTHONHASHSEED": "12345"}]):
        out = os.path.join(tmp, f"out{i}")
        run_tool(args.python, [corpus, "--out-dir", out, "--train-tokenizer", "400",
                               "--output-format", "megatron"], env)
        outs.append(out)
    first = open(os.path.join(outs[0], "tokenizer.json"), "rb").read()
    tok = json.loads(first)
    n_vocab = len(tok["model"]["vocab"])
    check(300 < n_vocab <= 400, f"trained vocabulary of {n_vocab}, expected (300, 400]")
    check(tok["added_tokens"][0]["content"] == "<|endoftext|>"
          and tok["added_tokens"][0]["id"] == 0 and tok["pre_tokenizer"]["type"] == "ByteLevel"
          and tok["decoder"]["type"] == "ByteLevel", "trained tokenizer layout")
    for out in outs[1:]:
        for name in ("tokenizer.json", "train.bin", "train.idx", "val.bin", "val.idx"):
            same_bytes(os.path.join(out, name), os.path.join(outs[0], name))
    # The comparison can fail: another training split gives another tokenizer.
    other = os.path.join(tmp, "other")
    run_tool(args.python, [corpus, "--out-dir", other, "--train-tokenizer", "400",
                           "--val-fraction", "0.25"])
    check(open(os.path.join(other, "tokenizer.json"), "rb").read() != first,
          "a different training split gave the same tokenizer.json")
    print(f"tokenizer.json ({len(first)} bytes, vocab {n_vocab}) identical over 3 runs "
          "(default threads, 1 thread, another hash seed)")


def llmc_reference(path, tokens, model_desc):
    """llm.c's dev/data/data_common.py write_datafile (HEADERS_INFO 'gpt-2' / 'llama-3')."""
    import numpy as np
    info = {"gpt-2": (20240520, 1, np.uint16), "llama-3": (20240801, 7, np.uint32)}[model_desc]
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = info[0], info[1], len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.array(tokens, dtype=info[2]).tobytes())


def case_llmc(tmp, args):
    corpus = os.path.join(tmp, "corpus")
    train_docs, val_docs = split_documents(write_corpus(corpus), 10)
    big = make_big_tokenizer(os.path.join(tmp, "big.json"))
    out, ref = os.path.join(tmp, "out"), os.path.join(tmp, "ref")
    os.makedirs(ref)
    shard_tokens = 700
    runs = [("trained", ["--train-tokenizer", "300"], "<|endoftext|>", "gpt-2", 20240520, 1, 2),
            ("big", ["--tokenizer", big, "--eod-token", BIG_EOD], BIG_EOD, "llama-3",
             20240801, 7, 4)]
    for name, options, eod, desc, magic, version, itemsize in runs:
        run_tool(args.python, [corpus, "--out-dir", out, "--val-fraction", "0.1", "--prefix",
                               name + "_", "--shard-tokens", str(shard_tokens)] + options)
        tok_path = os.path.join(out, name + "_tokenizer.json") if name == "trained" else big
        stats = json.load(open(os.path.join(out, name + "_stats.json")))
        for split, docs in (("train", train_docs), ("val", val_docs)):
            expected, vocab = expected_tokens(tok_path, docs, eod)
            stream = [t for d in expected for t in d]
            chunks = [stream[i:i + shard_tokens] for i in range(0, len(stream), shard_tokens)]
            names = [f"{name}_{split}_{i:03d}.bin" for i in range(len(chunks))]
            check(stats[f"{split}_files"] == names, f"{name} {split} shards {stats}")
            check(stats[f"{split}_tokens"] == len(stream), f"{name} {split}_tokens")
            for shard, chunk in zip(names, chunks):
                path = os.path.join(out, shard)
                with open(path, "rb") as f:
                    head = struct.unpack("<3i", f.read(12))
                check(head == (magic, version, len(chunk)),
                      f"{shard}: header {head}, expected {(magic, version, len(chunk))}")
                check(os.path.getsize(path) == 1024 + itemsize * len(chunk), f"{shard}: size")
                llmc_reference(os.path.join(ref, shard), chunk, desc)
                same_bytes(path, os.path.join(ref, shard))
        if name == "big":
            check(stats["token_dtype"] == "uint32" and stats["vocab_size"] == BIG_VOCAB, stats)
        # The unigram entropy of the training stream (the demo's baseline).
        import collections
        import math
        expected, _ = expected_tokens(tok_path, train_docs, eod)
        counts = collections.Counter(t for d in expected for t in d)
        n = sum(counts.values())
        h = -sum(c / n * math.log(c / n) for c in counts.values())
        check(abs(stats["unigram_entropy_nats"] - h) < 1e-12,
              f"entropy {stats['unigram_entropy_nats']} != {h}")
        print(f"{name}: {desc} shards ({magic}, v{version}, {8 * itemsize}-bit) as llm.c "
              f"writes them; entropy {h:.4f} nats")


def case_errors(tmp, args):
    corpus = os.path.join(tmp, "corpus")
    write_corpus(corpus)
    out = os.path.join(tmp, "out")
    bad_json = os.path.join(tmp, "bad.json")
    with open(bad_json, "w") as f:
        f.write("{not json")
    big = make_big_tokenizer(os.path.join(tmp, "big.json"))
    cases = [
        (["--tokenizer", os.path.join(tmp, "missing.json")], "--tokenizer", "missing.json"),
        (["--tokenizer", bad_json], "--tokenizer", "bad.json"),
        (["--tokenizer", big], "'<|endoftext|>'", "big.json"),
        (["--tokenizer", big, "--eod-token", "<nope>"], "--eod-token", "big.json"),
        (["--train-tokenizer", "100"], "--train-tokenizer", "257"),
        (["--eod-token", "x"], "--eod-token", "--tokenizer"),
        (["--train-tokenizer", "300", "--doc-separator", "\\n"], "--doc-separator", "byte-level"),
    ]
    for options, *needles in cases:
        p = run_tool(args.python, [corpus, "--out-dir", out] + options, expect_ok=False)
        lines = p.stderr.strip().splitlines()
        check(p.returncode != 0 and lines, f"{options}: exit {p.returncode}, no error")
        check(all(n in lines[-1] for n in needles),
              f"{options}: error line {lines[-1]!r} should name {needles}")
        check(not any("Traceback" in line for line in lines), f"{options}: a traceback")
    print(f"{len(cases)} bad inputs: one error line each")


CASES = {"byte-level": case_byte_level, "megatron-reader": case_megatron_reader,
         "megatron-identity": case_megatron_identity, "determinism": case_determinism,
         "llmc": case_llmc, "errors": case_errors}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--python", required=True, help="the tools' venv interpreter")
    ap.add_argument("--reader", help="the read_tokens binary (megatron-reader)")
    args = ap.parse_args()
    if args.case != "byte-level":
        # Checked by the venv's interpreter itself; run here by it so that numpy and
        # tokenizers are importable in this process too.
        if not os.path.isfile(args.python):
            print(f"SKIPPED: {args.python} missing (scripts/install_deps.sh makes the venv)")
            return SKIP
        # (The venv's python is a symlink to the system one: compare environments, not
        # paths; the variable marks the re-executed process.)
        if os.environ.get("TRIDENT_TEST_IN_VENV") != "1":
            probe = subprocess.run([args.python, "-c", "import tokenizers, numpy"],
                                   capture_output=True, text=True)
            if probe.returncode != 0:
                print(f"SKIPPED: {args.python} cannot import tokenizers and numpy: "
                      f"{probe.stderr.strip().splitlines()[-1:]}")
                return SKIP
            env = dict(os.environ, TRIDENT_TEST_IN_VENV="1")
            return subprocess.run([args.python, os.path.abspath(__file__)] + sys.argv[1:],
                                  env=env).returncode
        if args.case == "megatron-reader" and not (args.reader and os.path.isfile(args.reader)):
            print(f"FAILED: --reader {args.reader} is not a file")
            return 1
    tmp = tempfile.mkdtemp(prefix="trident_prepare_text_")
    try:
        CASES[args.case](tmp, args)
    except Failure as e:
        print(f"FAILED: {e}")
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"PASSED: {args.case}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
