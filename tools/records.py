#!/usr/bin/env python3
"""Writes and reads weft's record files (include/weft/data/records.hpp; docs/training.md, "Data
formats") with the standard library alone: fixed-shape samples of one element type behind a
256-byte header, for inputs that are not tokens (latents, images, labels, timesteps).

  from records import write, read
  write("latents.bin", "f32", (4, 32, 32), samples)   # samples: a flat sequence of numbers
  dtype, dims, count, values = read("latents.bin")

  tools/records.py --fixture PATH    writes the fixture tests/data/records.cpp reads back:
                                     3 samples of (2, 2) f64, sample k's element e = k + e / 8,
                                     and -0.0, 1e300, 2^-1074 at the end
"""
import struct
import sys

MAGIC = b"WEFTRECS"
VERSION = 1
# The element types this writer knows (weft's reader also takes bf16, code 2).
CODES = {"f64": (0, "d"), "f32": (1, "f"), "i32": (4, "i"), "i64": (5, "q")}


def write(path, dtype, dims, values):
    code, fmt = CODES[dtype]
    dims = tuple(int(d) for d in dims)
    if not 1 <= len(dims) <= 8 or any(d < 1 for d in dims):
        raise ValueError(f"records.write({path}): a sample of dims {dims}; use 1 to 8 positive dims")
    per = 1
    for d in dims:
        per *= d
    values = list(values)
    if len(values) % per:
        raise ValueError(f"records.write({path}): {len(values)} values are not whole samples of {per}")
    header = bytearray(256)
    header[0:8] = MAGIC
    struct.pack_into("<III", header, 8, VERSION, code, len(dims))
    struct.pack_into(f"<{len(dims)}q", header, 24, *dims)
    struct.pack_into("<q", header, 88, len(values) // per)
    body = struct.pack(f"<{len(values)}{fmt}", *values)
    with open(path, "wb") as f:
        f.write(bytes(header) + body)


def read(path):
    data = open(path, "rb").read()
    if len(data) < 256 or data[0:8] != MAGIC:
        raise ValueError(f"records.read({path}): not a record file")
    version, code, rank = struct.unpack_from("<III", data, 8)
    dims = struct.unpack_from(f"<{rank}q", data, 24)
    (count,) = struct.unpack_from("<q", data, 88)
    found = [(k, v[1]) for k, v in CODES.items() if v[0] == code]
    if version != VERSION or not found:
        raise ValueError(f"records.read({path}): version {version}, element type code {code}: not one this reader knows")
    dtype, fmt = found[0]
    per = 1
    for d in dims:
        per *= d
    n = count * per
    values = list(struct.unpack_from(f"<{n}{fmt}", data, 256))
    return dtype, dims, count, values


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--fixture":
        sys.exit(__doc__)
    values = [k + e / 8 for k in range(3) for e in range(4)]
    values[-3:] = [-0.0, 1e300, 2.0 ** -1074]
    write(sys.argv[2], "f64", (2, 2), values)
    assert read(sys.argv[2]) == ("f64", (2, 2), 3, values)
