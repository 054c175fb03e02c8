#!/usr/bin/env python3
"""util/fp8.hpp's float -> fp8 conversions against ml_dtypes' float8_e4m3fn and float8_e5m2
(an implementation outside this project, pinned in scripts/install_deps.sh), through the
fp8_codes tool: every float16 bit pattern's value (all 65,536, which cover both formats'
ranges, every midpoint neighbourhood at float16 resolution), every fp8 value, its midpoints
and the floats beside them, and 200,000 random floats with exponents over [-24, 20].

ml_dtypes rounds to nearest even like util/fp8.hpp but does not saturate (beyond the largest
finite value E4M3 gives NaN and E5M2 infinity); those inputs are checked against the saturating
rule instead (+-max, the sign kept). Exit 77 (SKIPPED) without ml_dtypes in the interpreter.

  test_fp8_reference.py --tool build/tests/tools/fp8_codes
"""
import argparse
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    args = ap.parse_args()
    try:
        import numpy as np
        import ml_dtypes
    except ImportError as e:
        print(f"SKIPPED: {e} (scripts/install_deps.sh installs ml_dtypes)")
        return 77
    rng = np.random.default_rng(7)
    parts = [np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)]
    for dt in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        v = np.arange(256, dtype=np.uint8).view(dt).astype(np.float32)
        v = np.sort(v[np.isfinite(v)])
        mid = (v[:-1] + v[1:]) / 2
        parts += [v, mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf))]
    mant = rng.uniform(1, 2, 200000).astype(np.float32)
    expo = rng.integers(-24, 21, 200000)
    sign = rng.choice([-1.0, 1.0], 200000).astype(np.float32)
    parts.append((sign * np.ldexp(mant, expo)).astype(np.float32))
    x = np.concatenate(parts).astype(np.float32)
    x = x[~np.isnan(x)]
    got = subprocess.run([args.tool], input=x.tobytes(), capture_output=True, check=True).stdout
    codes = np.frombuffer(got, dtype=np.uint8).reshape(-1, 2)
    if codes.shape[0] != x.size:
        print(f"FAIL: {codes.shape[0]} codes for {x.size} values")
        return 1
    failures = 0
    for col, dt, top in ((0, ml_dtypes.float8_e4m3fn, 448.0), (1, ml_dtypes.float8_e5m2, 57344.0)):
        name = np.dtype(dt).name
        with np.errstate(over="ignore", invalid="ignore"):
            ref = x.astype(dt).view(np.uint8)
        inside = np.abs(x) <= top
        diff = inside & (ref != codes[:, col])
        beyond = ~inside
        max_code = np.float32(top).astype(dt).view(np.uint8)
        want = np.where(np.signbit(x[beyond]), max_code | 0x80, max_code).astype(np.uint8)
        sat_bad = codes[beyond, col] != want
        n = int(diff.sum()) + int(sat_bad.sum())
        print(f"{name}: {int(inside.sum())} values against ml_dtypes {ml_dtypes.__version__}, "
              f"{int(beyond.sum())} beyond +-{top:g} against saturation: {n} differ")
        for i in np.flatnonzero(diff)[:5]:
            print(f"  {x[i]!r}: ours 0x{codes[i, col]:02x}, ml_dtypes 0x{ref[i]:02x}")
        failures += n
    if x.size == 0 or failures:
        print("FAIL")
        return 1
    print(f"PASS: {x.size} values, both formats")
    return 0


if __name__ == "__main__":
    sys.exit(main())
