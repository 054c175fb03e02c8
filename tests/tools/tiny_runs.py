"""Tiny Trident training runs for the Python tool tests: a synthetic llm.c shard corpus and
a small config, trained by the built binary on one rank (seconds)."""
import os
import struct
import subprocess
import sys

SHARD_MAGIC, SHARD_VERSION = 20240520, 1  # llm.c "gpt-2" shards: uint16 tokens


def write_shard(path, tokens):
    header = struct.pack("<256i", SHARD_MAGIC, SHARD_VERSION, len(tokens), *([0] * 253))
    with open(path, "wb") as f:
        f.write(header)
        f.write(struct.pack("<%dH" % len(tokens), *tokens))


def synthetic_tokens(n, salt):
    """Repeated phrases with some variation, so that the loss falls."""
    x = (88172645463325252 ^ salt) & 0xFFFFFFFFFFFFFFFF
    out = []
    for i in range(n):
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        out.append(x % 64 if i % 17 == 0 else ord("a") + (i * 7 + x % 3) % 26)
    return out


def make_corpus(directory):
    write_shard(os.path.join(directory, "train_000.bin"), synthetic_tokens(12000, 1))
    write_shard(os.path.join(directory, "val.bin"), synthetic_tokens(3000, 3))


def tiny_config(directory, log_dir, extra=""):
    return (
        "[model]\nlayers = 2\nheads = 4\nwidth = 32\nvocab_size = 256\nseq_len = 32\n"
        "vocab_multiple = 8\n"
        "[train]\nsteps = 6\nseed = 42\nmicro_batch = 2\nglobal_batch = 8\nthreads = 1\n"
        "[optim]\nlr = 1e-2\nmin_lr = 1e-3\nwarmup_steps = 2\n"
        f'[data]\ntrain = "{directory}/train_*.bin"\nval = "{directory}/val.bin"\n'
        "[eval]\ninterval = 3\nsteps = 1\n"
        f'[log]\ndir = "{log_dir}"\ninterval = 1\n' + extra)


def train(trident, config_path, sets=(), timeout=120):
    """Runs `trident train` on one rank; exits the test (failed) on a non-zero exit."""
    cmd = [trident, "train", "--config", config_path]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        print("FAILED: %s exited %d\n%s%s" % (" ".join(cmd), r.returncode, r.stdout, r.stderr))
        sys.exit(1)
    return r.stdout
