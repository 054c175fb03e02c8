#!/usr/bin/env bash
# Checkpoint bandwidth of trident on 1, 2 and 4 ranks (tensor parallel, each rank writing its
# shard of every dataset into one parallel HDF5 file), beside the raw sequential bandwidth of
# the same file system measured by dd in the same run. The model has GPT-2-124M's parameters
# (12 layers, width 768, vocabulary 50304; seq_len 64 keeps the one training step short), so a
# checkpoint holds 124 M parameters + 2 AdamW moments = ~1.5 GB.
#   bench/checkpoint_bench.sh [DIR]     DIR: where to write (default build/bench-ckpt)
# Reads are measured after dropping the page cache when that is permitted (root), else hot.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(realpath -m "${1:-build/bench-ckpt}")
trident=build/app/trident
[[ -x $trident ]] || { echo "no $trident: run scripts/build.sh first" >&2; exit 1; }
mkdir -p "$dir"
/usr/bin/python3 - "$dir/tokens.bin" <<'PY'
import struct, sys
n = 20000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *[(i * 7919) % 50304 for i in range(n)]))
PY

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null && echo cold || echo hot; }

model=(--set model.layers=12 --set model.heads=12 --set model.width=768
       --set model.vocab_size=50304 --set model.seq_len=64 --set model.vocab_multiple=128
       --set train.micro_batch=1 --set train.global_batch=1 --set train.steps=1
       --set optim.warmup_steps=0 --set eval.interval=0 --set train.threads=1
       --set data.train="$dir/tokens.bin" --set data.val=)
declare -A write_mbs read_mbs read_kind
for ranks in 1 2 4; do
  ck="$dir/ckpt_$ranks"
  rm -rf "$ck" "$dir/run_$ranks"
  out=$(timeout 900 mpiexec -n "$ranks" "$trident" train --config configs/tiny.toml "${model[@]}" \
          --set parallel.tensor="$ranks" --set checkpoint.dir="$ck" \
          --set log.dir="$dir/run_$ranks" 2>&1) || { echo "$out" >&2; exit 1; }
  write_mbs[$ranks]=$(grep -oP 'written \(step 1\): .* \K[\d.]+(?= MB/s)' <<<"$out")
  read_kind[$ranks]=$(drop_caches)
  out=$(timeout 900 mpiexec -n "$ranks" "$trident" train --config configs/tiny.toml "${model[@]}" \
          --set parallel.tensor="$ranks" --resume "$ck/step_00000001.h5" \
          --set log.dir="$dir/resume_$ranks" 2>&1) || { echo "$out" >&2; exit 1; }
  read_mbs[$ranks]=$(grep -oP ' read: .* \K[\d.]+(?= MB/s)' <<<"$out")
  size_mb=$(( $(stat -c %s "$ck/step_00000001.h5") / 1000000 ))
done

# The file system's raw sequential bandwidth, same size, same directory.
raw_write=$(dd if=/dev/zero of="$dir/raw.bin" bs=1M count="$size_mb" conv=fsync 2>&1 |
            grep -oP '[\d.]+ [MG]B/s' | awk '{print ($2=="GB/s") ? $1*1000 : $1}')
raw_kind=$(drop_caches)
raw_read=$(dd if="$dir/raw.bin" of=/dev/null bs=1M 2>&1 |
           grep -oP '[\d.]+ [MG]B/s' | awk '{print ($2=="GB/s") ? $1*1000 : $1}')
rm -f "$dir/raw.bin"

echo "checkpoint of $size_mb MB (124 M parameters + AdamW moments), directory $dir"
echo "raw sequential (dd, 1 MiB blocks): write $raw_write MB/s (fsync), read $raw_read MB/s ($raw_kind)"
echo
echo "| ranks (tensor parallel) | write MB/s | write / raw | read MB/s | read / raw | read cache |"
echo "|---|---|---|---|---|---|"
for ranks in 1 2 4; do
  awk -v r="$ranks" -v w="${write_mbs[$ranks]}" -v rd="${read_mbs[$ranks]}" -v rw="$raw_write" \
      -v rr="$raw_read" -v k="${read_kind[$ranks]}" \
      'BEGIN { printf "| %d | %.0f | %.2f | %.0f | %.2f | %s |\n", r, w, w / rw, rd, rd / rr, k }'
done
echo
echo "target: write / raw >= 0.5 (and read / raw)"
