#!/usr/bin/env python3
"""Writes what PyTorch's float8 casts give (torch.float8_e4m3fn, torch.float8_e5m2, on the CPU), for
weft's float8 types (include/weft/core/float8.hpp, tests/core/float8.cpp) to match byte for byte.

Inputs, which tests/core/float8.cpp makes again the same way:
  A  every bf16 bit pattern b (0 .. 65535) as the float32 of bits b << 16: zeros, subnormals, every
     exponent, +-inf and NaNs;
  B  10^6 float32 bit patterns from splitmix64 (state seed + i, seed 0x5eed): the high 32 bits of
     each output; the odd i keep them raw (every exponent), the even i have their exponent field
     replaced by 107 + (field mod 41) (|x| from 2^-20 to 2^20: float8's subnormals, normals and
     values past the maximum, densely).

Writes --out/casts.bin, little-endian:
  8 bytes   "WEFTFP8\\x01"
  65536     A cast to e4m3fn (bytes)       65536   A cast to e5m2
  256 x 4   each e4m3fn byte as float32    256 x 4 each e5m2 byte as float32
  2 x 1000 x 8   B cast to e4m3fn, then to e5m2: the FNV-1a 64-bit hash of each 1000 values' bytes
  3 x 4     the counts of B: e4m3fn NaN outputs, e5m2 NaN outputs, e5m2 infinite outputs (uint32)

Usage: python3 tools/reference/float8_casts.py --out tests/fixtures/float8
Needs PyTorch (2.1 or later) and numpy.
"""
import argparse
import os
import struct

import numpy as np
import torch

MASK = (1 << 64) - 1


def splitmix64(x):
    """splitmix64 of each uint64 state in x (numpy wraps on overflow, as C++'s uint64_t does)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def fnv1a(data):
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & MASK
    return h


def random_patterns(n, seed=0x5EED):
    bits = (splitmix64(np.arange(n, dtype=np.uint64) + np.uint64(seed)) >> np.uint64(32)).astype(np.uint32)
    field = (bits >> np.uint32(23)) & np.uint32(0xFF)
    dense = (bits & np.uint32(0x807FFFFF)) | ((np.uint32(107) + field % np.uint32(41)) << np.uint32(23))
    even = (np.arange(n) % 2) == 0
    return np.where(even, dense, bits).astype(np.uint32)


def cast(bits, dtype):
    x = torch.from_numpy(bits.view(np.float32).copy())
    return x.to(dtype).view(torch.uint8).numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    A = (np.arange(65536, dtype=np.uint32) << np.uint32(16)).astype(np.uint32)
    B = random_patterns(1_000_000)
    out = bytearray(b"WEFTFP8\x01")
    out += cast(A, e4).tobytes() + cast(A, e5).tobytes()
    for dt in (e4, e5):
        decoded = torch.arange(256, dtype=torch.uint8).view(dt).float().numpy()
        out += decoded.astype("<f4").tobytes()
    b4, b5 = cast(B, e4), cast(B, e5)
    for b in (b4, b5):
        for c in range(1000):
            out += struct.pack("<Q", fnv1a(b[c * 1000:(c + 1) * 1000].tobytes()))
    nan4 = int(np.count_nonzero((b4 & 0x7F) == 0x7F))
    nan5 = int(np.count_nonzero(((b5 & 0x7C) == 0x7C) & ((b5 & 0x03) != 0)))
    inf5 = int(np.count_nonzero((b5 & 0x7F) == 0x7C))
    out += struct.pack("<III", nan4, nan5, inf5)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "casts.bin"), "wb") as f:
        f.write(out)
    print(f"{len(out)} bytes into {a.out}/casts.bin (torch {torch.__version__}); of B: {nan4} e4m3fn NaNs, "
          f"{nan5} e5m2 NaNs, {inf5} e5m2 infinities")


if __name__ == "__main__":
    main()
