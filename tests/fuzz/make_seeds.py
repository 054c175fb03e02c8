#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora, tests/fuzz/corpus/<target>/ (docs/fuzzing.md).

Small valid inputs of every layout a reader accepts, and near-valid ones (one field wrong),
so that libFuzzer starts next to the checks. Deterministic: rerunning rewrites the same
bytes. Inputs that once crashed a target are kept beside them as crash-<what> (never written
here; this script removes nothing).
    /usr/bin/python3 tests/fuzz/make_seeds.py
"""
import json
import pathlib
import struct

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"


def put(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


# ---- config: TOML text, then overrides, separated by NUL bytes (fuzz_config.cpp).
TINY = """[model]
layers = 2
heads = 4
width = 64
vocab_size = 256
seq_len = 64
[parallel]
tensor = 1
pipeline_layers = [1, 1]
[train]
steps = 10
micro_batch = 2
global_batch = 8
[optim]
lr = 1e-3
[data]
train = ["0.7:data/a_*.bin", "0.3:data/b"]
val = "data/val.bin"
[checkpoint]
dir = "ckpt"
"""
put("config", "tiny.toml", TINY)
put("config", "llama.toml", '[model]\narch = "llama"\nlayers = 1\nheads = 4\nkv_heads = 2\n'
    'width = 32\nrope_theta = 5e5\ntie_embeddings = false\n')
put("config", "overrides", TINY + "\0parallel.data=2\0train.global_batch=16\0model.arch=llama"
    "\0data.train=[\"1:x\", \"2:y\"]")
put("config", "empty_with_override", "\0log.dir=runs/x")
put("config", "unknown_key", "[model]\nlayerz = 2\n")
put("config", "wrong_type", "[train]\nsteps = \"ten\"\n")
put("config", "bad_override", "\0model=3\0=\0train.steps")


# ---- token shards: llm.c's 256-int32 header, then the tokens (fuzz_token_shard.cpp).
def shard(magic, version, tokens, count=None, fmt="H"):
    header = struct.pack("<3i", magic, version, len(tokens) if count is None else count)
    return header + bytes(1024 - 12) + struct.pack("<%d%s" % (len(tokens), fmt), *tokens)


toks = [1, 2, 3, 250, 7, 0, 65, 66, 67, 68, 69, 10, 11, 299, 12]
put("token_shard", "u16_v1", shard(20240520, 1, toks))
put("token_shard", "u32_v7", shard(20240801, 7, toks + [69999, 70000], fmt="I"))
put("token_shard", "u16_truncated", shard(20240520, 1, toks, count=len(toks) + 1))
put("token_shard", "u32_wrong_version", shard(20240801, 1, toks, fmt="I"))
put("token_shard", "u16_empty", shard(20240520, 1, []))


# ---- indexed datasets: uint16 length of the .idx, the .idx, the .bin (fuzz_indexed_dataset.cpp).
def indexed(docs, dtype=8, version=1, lengths=None, pointers=None, doc_index=None):
    item, fmt = (2, "H") if dtype == 8 else (4, "i")
    lengths = lengths if lengths is not None else [len(d) for d in docs]
    if pointers is None:
        pointers, at = [], 0
        for n in lengths:
            pointers.append(at)
            at += n * item
    doc_index = doc_index if doc_index is not None else list(range(len(docs) + 1))
    idx = b"MMIDIDX\0\0" + struct.pack("<QBQQ", version, dtype, len(lengths), len(doc_index))
    idx += struct.pack("<%di" % len(lengths), *lengths)
    idx += struct.pack("<%dq" % len(pointers), *pointers)
    idx += struct.pack("<%dq" % len(doc_index), *doc_index)
    bin_ = b"".join(struct.pack("<%d%s" % (len(d), fmt), *d) for d in docs)
    return struct.pack("<H", len(idx)) + idx + bin_


docs = [[1, 2, 3, 4], [5, 6], [7, 8, 9, 299, 10]]
put("indexed_dataset", "uint16", indexed(docs))
put("indexed_dataset", "int32", indexed(docs + [[69999, 3]], dtype=4))
put("indexed_dataset", "bad_pointer", indexed(docs, pointers=[0, 8, 13]))
put("indexed_dataset", "bad_doc_index", indexed(docs, doc_index=[0, 2, 1, 3]))
put("indexed_dataset", "negative_length", indexed(docs, lengths=[4, -2, 5]))
put("indexed_dataset", "bad_dtype", indexed(docs, dtype=3))


# ---- safetensors: 8-byte header length, JSON header, data (fuzz_safetensors.cpp).
def safetensors(tensors, meta=True, raw_header=None, pad=True):
    header, data = {}, b""
    if meta:
        header["__metadata__"] = {"format": "pt"}
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    text = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":"))
    if pad:
        text += " " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text.encode() + data


f32 = struct.pack("<6f", 1, -2, 0.5, 3, 4, 5)
put("safetensors", "f32_bf16_f16", safetensors([
    ("a.weight", "F32", [2, 3], f32),
    ("b.bias", "BF16", [3], bytes([0x80, 0x3f, 0, 0xc0, 0x80, 0x7f])),
    ("c", "F16", [1, 2], bytes([0, 0x3c, 0, 0x7c]))]))
put("safetensors", "unsupported_dtype", safetensors([("i", "I64", [1], bytes(8)),
                                                     ("s", "F32", [], f32[:4])]))
put("safetensors", "scalar_and_empty", safetensors([("e", "F32", [0, 5], b""),
                                                    ("s", "F32", [], f32[:4])], meta=False))
# Empty: a size of 0 after one past any file (the harness once took it for a broken promise).
put("safetensors", "empty_after_huge_size", safetensors([("e", "F32", [9999999999, 0], b"")]))
put("safetensors", "offsets_past_end", safetensors([("a", "F32", [2, 3], f32[:8])],
    raw_header='{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}'))
put("safetensors", "huge_shape", safetensors([("a", "F32", [2, 3], f32)],
    raw_header='{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,24]}}'))
put("safetensors", "offsets_wrap", safetensors([("i", "I64", [1], bytes(8))],
    raw_header='{"i":{"dtype":"I64","shape":[1],'
               '"data_offsets":[18446744073709551615,18446744073709551615]}}'))
put("safetensors", "newline_in_name", safetensors([], pad=True,
    raw_header='{"a\\nb":{"dtype":"F32","shape":[2],"data_offsets":[0,99]}}') + bytes(8))
put("safetensors", "not_json", safetensors([], raw_header='{"a": [1, 2'))


# ---- tokenizer: tokenizer.json, a NUL byte, the text to encode (fuzz_tokenizer.cpp).
def byte_alphabet():
    """GPT-2's bytes_to_unicode: the character each byte stands for in a byte-level vocab."""
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174]
    chars, extra = {}, 256
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(extra)
            extra += 1
    return chars


def tokenizer(pre_tokenizer, merges, extra=(), added=(), post=None, ignore_merges=False):
    vocab = {c: b for b, c in byte_alphabet().items()}
    for token in extra:
        vocab[token] = len(vocab)
    return json.dumps({
        "version": "1.0", "normalizer": None, "pre_tokenizer": pre_tokenizer,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for c, i in added],
        "post_processor": post, "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
                  "vocab": vocab, "merges": merges}}, ensure_ascii=False)


GPT2_PRE = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
            "use_regex": True}
LLAMA_PRE = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?"
                                           r"\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                                           r"\s*[\r\n]+|\s+(?!\S)|\s+"},
     "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
TEXT = "Hello world, it's 2024! \u00e9\u00e8 \u4e16\u754c \U0001F600\n\tdone  "
put("tokenizer", "gpt2_strings", tokenizer(GPT2_PRE, ["\u0120 w", "o r", "\u0120w or"],
                                           ["\u0120w", "or", "\u0120wor"],
                                           [("<|endoftext|>", 259)]) + "\0" + TEXT
    + "<|endoftext|>")
put("tokenizer", "llama_arrays_template", tokenizer(
    LLAMA_PRE, [["l", "l"], ["e", "ll"]], ["ll", "ell"], [("<|begin_of_text|>", 258)],
    post={"type": "TemplateProcessing",
          "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}}],
          "pair": [], "special_tokens": {"<|begin_of_text|>": {
              "id": "<|begin_of_text|>", "ids": [258], "tokens": ["<|begin_of_text|>"]}}},
    ignore_merges=True) + "\0" + TEXT)
put("tokenizer", "invalid_utf8", tokenizer(GPT2_PRE, []).encode() + b"\0abc\xff\xfe")
put("tokenizer", "bad_merge", tokenizer(GPT2_PRE, ["x y"]) + "\0xy")
# Found by the target's first run: an id of 3.3e128 (UB converting it to int) and two vocab
# entries sharing an id (decode gave the other one back).
put("tokenizer", "float_id", tokenizer(GPT2_PRE, []).replace('"a": 97', '"a": 3.3e128')
    + "\0abc")
put("tokenizer", "duplicate_id", tokenizer(GPT2_PRE, []).replace('"\u00de": 222', '"\u00de": 111')
    + "\0Hello world")
# Found in CI: a vocab entry holding a newline was named raw, an error of two lines.
put("tokenizer", "newline_in_vocab_entry", tokenizer(GPT2_PRE, [], ["a\nb"]) + "\0ab")
# add_prefix_space puts a space before each stretch of text between added tokens, which
# decoding keeps (the harness's exact-size check did not allow for it).
put("tokenizer", "add_prefix_space", tokenizer(dict(GPT2_PRE, add_prefix_space=True),
                                               ["\u0120 w"], ["\u0120w"],
                                               [("<|endoftext|>", 257)])
    + "\0" + "world<|endoftext|>wide<|endoftext|> web")
put("tokenizer", "not_json", '{"model": {"type": "BPE", "vocab": {"a": 0}\0a')


# ---- checkpoint: bytes that steer what a valid HDF5 checkpoint holds (fuzz_checkpoint.cpp),
# in the order the harness reads them: config op (2: the length byte and the text appended to
# the stored config follow it), step, one op per root attribute (ROOT_KEYS, kRootKeys there;
# op 4, a string, is followed by its length byte and text), seal op, one op per dataset
# (DATASETS: the 1-layer GPT-2's 16 tensors under /model, /optim/exp_avg, /optim/exp_avg_sq;
# op 4 is followed by 4 bytes per element), extra, tamper.
ROOT_KEYS = 25
DATASETS = 48


def checkpoint(config_op=0, step=3, attribute_ops=(), seal=0, dataset_ops=(), tail=b"",
               config_tail=None):
    """attribute_ops: an op per attribute from the first, each an int or (op, payload bytes)."""
    head = bytes([config_op])
    if config_tail is not None:
        head += bytes([len(config_tail)]) + config_tail
    ops = b"".join(bytes([op]) if isinstance(op, int) else bytes([op[0]]) + op[1]
                   for op in attribute_ops) + bytes(ROOT_KEYS - len(attribute_ops))
    return head + bytes([step]) + ops + bytes([seal] + list(dataset_ops)) + tail


def string_attribute(text):
    return (4, bytes([len(text)]) + text)


put("checkpoint", "valid", checkpoint())
put("checkpoint", "missing_step", checkpoint(attribute_ops=[0, 1]))
put("checkpoint", "step_as_string", checkpoint(attribute_ops=[0, string_attribute(b"abc")]))
put("checkpoint", "unsealed", checkpoint(seal=1))
put("checkpoint", "missing_dataset", checkpoint(dataset_ops=[0, 1]))
put("checkpoint", "nan_values", checkpoint(dataset_ops=[4]) + b"\x00\x00\xc0\x7f" * 40)
put("checkpoint", "config_appended", checkpoint(config_op=2, config_tail=b"[model]\nx=1"))
# No dataset changed (DATASETS ops, then no extra), then tamper op 1: the byte at offset 7 of
# the token embedding's data (/model/embedding/token/weight) XOR 0x55, after its checksum was
# written.
put("checkpoint", "flipped_byte",
    checkpoint(dataset_ops=[0] * DATASETS) + b"\x00\x01\x07\x00\x00\x00\x55")
# The same after all the checksums: a byte of the token embedding's second moment flipped
# (tamper op 2); the position embedding's checksum attribute made a double (tamper op 5).
put("checkpoint", "flipped_moment_byte",
    checkpoint(dataset_ops=[0] * DATASETS) + b"\x00\x02\x07\x00\x00\x00\x55")
put("checkpoint", "checksum_of_another_type", checkpoint(dataset_ops=[0] * DATASETS) + b"\x00\x05")
# model_arch (root attribute 16) written as a string with a newline in it: its mismatch with
# the stored config's model.arch was reported with the raw text, on two lines.
put("checkpoint", "newline_in_model_arch",
    checkpoint(attribute_ops=[0] * 16 + [string_attribute(b"l]\nx")]))
# guard_losses (root attribute 22) not a list of numbers: one line naming the attribute.
put("checkpoint", "guard_losses_not_a_list",
    checkpoint(attribute_ops=[0] * 22 + [string_attribute(b"[3.5,\nx]")]))
# A stored config of 10^8 layers, consistent with the root attributes (model_layers set to
# it): check_checkpoint built that model's parameter list before it noticed the file.
HUGE = (b'[model]\nlayers = 100000003\nheads = 2\nwidth = 4\nvocab_size = 8\nseq_len = 4\n'
        b'[train]\nsteps = 10\nmicro_batch = 1\nglobal_batch = 2\n[data]\ntrain = "x"\n')
put("checkpoint", "huge_stored_model",
    bytes([1, len(HUGE)]) + HUGE + bytes([0]) + bytes(11) + bytes([2]) +
    struct.pack("<I", 100000003) + bytes(8) + bytes([0]))
