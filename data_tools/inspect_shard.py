#!/usr/bin/python3
"""Inspect Trident token shards and reproduce the training sample order.

Usage:
  /usr/bin/python3 data_tools/inspect_shard.py SHARD_OR_GLOB [--seq-len T]
      [--window K] [--windows N] [--ids]
  /usr/bin/python3 data_tools/inspect_shard.py [SHARD_OR_GLOB | --num-windows W] --order
      --steps S --global-batch G [--start-step S0] [--shuffle --seed X] [--seq-len T]
  /usr/bin/python3 data_tools/inspect_shard.py --order --weights W0 W1 ... --num-windows N0 N1 ...
      --steps S --global-batch G [--start-step S0] [--shuffle --seed X]

Shards: llm.c's uint16 layout (magic 20240520, version 1) and uint32 layout (magic 20240801,
version 7) are both read.

Without --order: prints each matched shard's header (magic, version, token count, file size
and whether they are consistent), then N windows (default 1) of T+1 tokens starting at
window id K (default 0), decoded byte-level (token = byte, UTF-8 with errors='replace'; ids
are printed instead when a token is >= 256). Window ids are global over the shards sorted by
name, as in Trident: shard with n tokens holds (n-1)//T windows, window w covers tokens
[w*T, w*T + T + 1) of its shard.

With --order: prints, for each step s in [S0, S0 + S), the window ids of the global batch's
samples 0..G-1, one line per step ("step s: id id ..."), computed with the sampler of
docs/data.md (identical to trident::BatchSampler). W is the dataset's number of windows
for --seq-len (default 64), or --num-windows. --seed takes any integer; it is reduced
modulo 2^64 (so -1 is 2^64-1), as the trainer converts train.seed to uint64.

With --order --weights (a blend, data.train = ["W0:...", "W1:...", ...]): --num-windows gives
each dataset's window count, in the blend's order, and each sample prints as "d:w" (dataset d,
its window w): position p = s*G + i draws from the dataset with the largest
w[d] * max(p, 1) - count[d] (Megatron-LM's rule; weights normalised by their sum; ties: lowest
d), and that dataset's sample count[d] is its window by the order above with the seed
seed ^ (0xD1B54A32D192ED03 * d) (docs/data.md, "Blends"). Identical to trident::BlendedSampler.

Exit status: 0, or 1 when a shard is inconsistent.
"""

import argparse
import glob
import os
import struct
import sys

MAGIC = 20240520          # llm.c "gpt-2": uint16 tokens
VERSION = 1
MAGIC_U32 = 20240801      # llm.c "llama-3": uint32 tokens
VERSION_U32 = 7
TOKEN_BYTES = {MAGIC: 2, MAGIC_U32: 4}
VERSIONS = {MAGIC: VERSION, MAGIC_U32: VERSION_U32}
BLEND_SEED_MULTIPLIER = 0xD1B54A32D192ED03
HEADER_INTS = 256
HEADER_BYTES = 4 * HEADER_INTS
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


# ---- the sampling order (docs/data.md, "Sampling order") ----------------------------------

class SplitMix64:
    def __init__(self, state):
        self.state = state & MASK64

    def next(self):
        self.state = (self.state + GOLDEN) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)


def epoch_permutation(num_windows, seed, epoch):
    """Fisher-Yates over [0, W) driven by SplitMix64(seed ^ (GOLDEN * (epoch + 1)))."""
    rng = SplitMix64((seed & MASK64) ^ ((GOLDEN * (epoch + 1)) & MASK64))
    perm = list(range(num_windows))
    for i in range(num_windows - 1, 0, -1):
        j = rng.next() % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


class Sampler:
    """Window id of sample i of step s: p = s*G + i, epoch e = p // W, k = p % W;
    window k without shuffle, perm_e[k] with shuffle."""

    def __init__(self, num_windows, global_batch, shuffle, seed):
        if num_windows <= 0 or global_batch <= 0:
            raise ValueError("num_windows and global_batch must be positive")
        self.W, self.G, self.shuffle, self.seed = num_windows, global_batch, shuffle, seed
        self._epoch, self._perm = -1, None

    def window_id(self, step, sample):
        p = step * self.G + sample
        epoch, k = divmod(p, self.W)
        if not self.shuffle:
            return k
        if epoch != self._epoch:
            self._perm, self._epoch = epoch_permutation(self.W, self.seed, epoch), epoch
        return self._perm[k]


    def window_at(self, p):
        """The window at stream position p (a blended dataset's own sample p)."""
        return self.window_id(p // self.G, p % self.G)


def normalised(weights):
    total = 0.0
    for w in weights:          # summed in order, as trident::normalised_weights
        total += w
    return [w / total for w in weights]


class BlendedSampler:
    """(dataset, window) of sample i of step s in a blend (docs/data.md, "Blends")."""

    def __init__(self, num_windows, weights, global_batch, shuffle, seed):
        if len(num_windows) != len(weights):
            raise ValueError("one --num-windows per --weights entry")
        if any(not (w > 0 and w != float("inf")) for w in weights):
            raise ValueError("weights must be finite and > 0")
        self.G = global_batch
        self.weights = normalised(weights)
        self.datasets = [
            Sampler(W, 1, shuffle, (seed & MASK64) ^ ((BLEND_SEED_MULTIPLIER * d) & MASK64))
            for d, W in enumerate(num_windows)]
        self.position, self.counts = 0, [0] * len(weights)

    def _choose(self):
        # Megatron-LM's build_blending_indices: largest error, strict '>' (ties: lowest d).
        p = float(max(self.position, 1))
        best, best_error = 0, self.weights[0] * p - float(self.counts[0])
        for d in range(1, len(self.weights)):
            error = self.weights[d] * p - float(self.counts[d])
            if error > best_error:
                best, best_error = d, error
        return best

    def sample(self, step, i):
        p = step * self.G + i
        if p < self.position:
            self.position, self.counts = 0, [0] * len(self.weights)
        while self.position < p:
            self.counts[self._choose()] += 1
            self.position += 1
        d = self._choose()
        return d, self.datasets[d].window_at(self.counts[d])


# ---- shards -------------------------------------------------------------------------------

class Shard:
    def __init__(self, path):
        self.path = path
        self.size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
        self.problems = []
        if len(raw) < HEADER_BYTES:
            self.header = None
            self.count = 0
            self.problems.append(f"file is {self.size} bytes, smaller than the "
                                 f"{HEADER_BYTES}-byte header")
            return
        self.header = struct.unpack(f"<{HEADER_INTS}i", raw)
        self.magic, self.version, self.count = self.header[:3]
        self.token_bytes = TOKEN_BYTES.get(self.magic, 2)
        if self.magic not in TOKEN_BYTES:
            self.problems.append(f"wrong magic {self.magic} (expected {MAGIC} or {MAGIC_U32})")
        elif self.version != VERSIONS[self.magic]:
            self.problems.append(f"wrong version {self.version} for magic {self.magic} "
                                 f"(expected {VERSIONS[self.magic]})")
        if self.count < 0:
            self.problems.append(f"negative token count {self.count}")
        self.expected_size = HEADER_BYTES + self.token_bytes * max(self.count, 0)
        if self.size != self.expected_size:
            kind = "truncated" if self.size < self.expected_size else "oversized"
            self.problems.append(f"{kind}: expected {self.expected_size} bytes, "
                                 f"file has {self.size}")
        nonzero = [i for i in range(3, HEADER_INTS) if self.header[i] != 0]
        if nonzero:
            self.problems.append(f"reserved header ints not zero at {nonzero[:8]}")

    @property
    def ok(self):
        return not self.problems

    def windows(self, T):
        return (self.count - 1) // T if self.ok and self.count > 0 else 0

    def tokens(self, start, n):
        with open(self.path, "rb") as f:
            f.seek(HEADER_BYTES + self.token_bytes * start)
            raw = f.read(self.token_bytes * n)
        code = "H" if self.token_bytes == 2 else "I"
        return list(struct.unpack(f"<{len(raw) // self.token_bytes}{code}", raw))

    def describe(self):
        lines = [f"{self.path}:"]
        if self.header is None:
            lines.append(f"  file size  {self.size} bytes")
        else:
            lines.append(f"  magic      {self.magic}" + (
                "" if self.magic in TOKEN_BYTES else f"  (expected {MAGIC} or {MAGIC_U32})"))
            width = {2: "uint16", 4: "uint32"}[self.token_bytes]
            lines.append(f"  version    {self.version}" + (
                f" ({width} tokens)" if self.magic in TOKEN_BYTES else ""))
            lines.append(f"  tokens     {self.count}")
            lines.append(f"  file size  {self.size} bytes (expected {self.expected_size} = "
                         f"{HEADER_BYTES} + {self.token_bytes} x {self.count})")
        lines.append("  check      " + ("OK" if self.ok else "FAILED: " + "; ".join(self.problems)))
        return "\n".join(lines)


def expand(pattern):
    if any(c in pattern for c in "*?["):
        paths = sorted(glob.glob(pattern))  # byte-wise order for ASCII names, as in Trident
        if not paths:
            sys.exit(f"inspect_shard.py: error: no file matches '{pattern}'")
        return paths
    if not os.path.isfile(pattern):
        sys.exit(f"inspect_shard.py: error: cannot open '{pattern}'")
    return [pattern]


def decode(tokens):
    if all(t < 256 for t in tokens):
        return bytes(tokens).decode("utf-8", errors="replace")
    return None


def print_blended_order(ap, args):
    if args.num_windows is None or len(args.num_windows) != len(args.weights):
        ap.error("--weights needs --num-windows with one count per weight")
    if any(w <= 0 for w in args.num_windows):
        ap.error("every --num-windows count must be positive")
    try:
        sampler = BlendedSampler(args.num_windows, args.weights, args.global_batch,
                                 args.shuffle, args.seed)
    except ValueError as e:
        ap.error(str(e))
    for s in range(args.start_step, args.start_step + args.steps):
        pairs = (sampler.sample(s, i) for i in range(args.global_batch))
        print(f"step {s}: " + " ".join(f"{d}:{w}" for d, w in pairs))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Inspect token shards and reproduce the training sample order.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("shard", nargs="?", help="a shard path or a glob (quote it)")
    ap.add_argument("--seq-len", "-T", type=int, default=64, help="T (default 64)")
    ap.add_argument("--window", "-k", type=int, default=0, help="first window id (default 0)")
    ap.add_argument("--windows", "-n", type=int, default=1, help="windows to show (default 1)")
    ap.add_argument("--ids", action="store_true", help="also print the token ids")
    ap.add_argument("--order", action="store_true", help="print the sample order")
    ap.add_argument("--steps", type=int, default=1, help="steps to print (default 1)")
    ap.add_argument("--start-step", type=int, default=0, help="first step (default 0)")
    ap.add_argument("--global-batch", "-G", type=int, help="G, windows per step")
    ap.add_argument("--shuffle", action="store_true", help="data.shuffle = true")
    ap.add_argument("--seed", type=int, default=1234, help="train.seed (default 1234)")
    ap.add_argument("--num-windows", "-W", type=int, nargs="+",
                    help="number of windows W (instead of reading the shards); with --weights "
                         "one per dataset of the blend")
    ap.add_argument("--weights", type=float, nargs="+",
                    help="a blend's weights (data.train = [\"W0:...\", ...]); prints d:w")
    args = ap.parse_args(argv)
    if args.seq_len <= 0:
        ap.error("--seq-len must be positive")
    try:
        sys.stdout.reconfigure(errors="replace")
    except AttributeError:
        pass

    shards = []
    if args.shard is not None:
        shards = [Shard(p) for p in expand(args.shard)]

    if args.order:
        if args.global_batch is None or args.global_batch <= 0:
            ap.error("--order needs a positive --global-batch")
        if args.steps < 0 or args.start_step < 0:
            ap.error("--steps and --start-step must be >= 0")
        if args.weights is not None:
            return print_blended_order(ap, args)
        if args.num_windows is not None:
            if len(args.num_windows) != 1:
                ap.error("--num-windows takes one count without --weights")
            W = args.num_windows[0]
        elif shards:
            bad = [s for s in shards if not s.ok]
            for s in bad:
                print(s.describe(), file=sys.stderr)
            if bad:
                return 1
            W = sum(s.windows(args.seq_len) for s in shards)
        else:
            ap.error("--order needs SHARD_OR_GLOB or --num-windows")
        if W <= 0:
            sys.exit(f"inspect_shard.py: error: no window of T+1 = {args.seq_len + 1} tokens")
        sampler = Sampler(W, args.global_batch, args.shuffle, args.seed)
        for s in range(args.start_step, args.start_step + args.steps):
            ids = (sampler.window_id(s, i) for i in range(args.global_batch))
            print(f"step {s}: " + " ".join(str(i) for i in ids))
        return 0

    if not shards:
        ap.error("give SHARD_OR_GLOB (or --order with --num-windows)")
    status = 0
    for s in shards:
        print(s.describe())
        if not s.ok:
            status = 1
    if status:
        return status
    T = args.seq_len
    first = []
    total = 0
    for s in shards:
        first.append(total)
        total += s.windows(T)
    print(f"windows    {total} of T+1 = {T + 1} tokens (T = {T})")
    if args.windows <= 0:
        return 0
    if not 0 <= args.window < total:
        print(f"inspect_shard.py: error: window {args.window} out of range [0, {total})",
              file=sys.stderr)
        return 1
    for w in range(args.window, min(total, args.window + args.windows)):
        idx = max(i for i in range(len(shards)) if first[i] <= w and shards[i].windows(T) > 0
                  and w < first[i] + shards[i].windows(T))
        shard, local = shards[idx], w - first[idx]
        toks = shard.tokens(local * T, T + 1)
        print(f"---- window {w}: {shard.path} window {local}, tokens "
              f"[{local * T}, {local * T + T + 1}) ----")
        text = decode(toks)
        if text is not None:
            print(text)
        if args.ids or text is None:
            print("ids: " + " ".join(str(t) for t in toks))
    print("----")
    return 0


if __name__ == "__main__":
    sys.exit(main())
