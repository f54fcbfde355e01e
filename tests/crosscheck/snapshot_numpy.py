"""tests/crosscheck/snapshot_numpy.py: read a ddp.h snapshot the way the tutorial's Python does (struct, json,
numpy; no safetensors package) and compare it with the values the C side wrote.

usage: /usr/bin/python3 tests/crosscheck/snapshot_numpy.py SNAPSHOT VALUES.txt
VALUES.txt comes from tests/crosscheck/snapshot_dump.c. Prints the number of tensors checked and exits 0, or
prints what differs and exits 1."""
import json
import struct
import sys

import numpy as np


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main(path, values_path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), "header length %d does not fit in %d bytes" % (n, len(raw))
    assert n % 8 == 0, "header length %d is not a multiple of 8" % n
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    data = raw[8 + n :]
    meta = header.pop("__metadata__")
    assert all(isinstance(v, str) for v in meta.values()), "metadata values must be strings"

    # the checksum: FNV-1a-64 over the whole file with its 16 hex digits written as '0'
    key = b'"checksum":"'
    at = raw.index(key, 8, 8 + n) + len(key)
    assert raw[at : at + 16].decode() == meta["checksum"], "the checksum's digits are not where the JSON has them"
    zeroed = raw[:at] + b"0" * 16 + raw[at + 16 :]
    want = "%016x" % fnv1a64(zeroed)
    assert meta["checksum"] == want, "checksum %s, the file's bytes give %s" % (meta["checksum"], want)

    # the tensors tile the data section exactly, in order
    spans = sorted((t["data_offsets"][0], t["data_offsets"][1], name) for name, t in header.items())
    end = 0
    for b, e, name in spans:
        assert b == end, "%s starts at %d, not %d" % (name, b, end)
        end = e
    assert end == len(data), "tensors cover %d bytes, the data section has %d" % (end, len(data))

    expected, expected_meta = {}, {}
    for line in open(values_path):
        words = line.split()
        if not words:
            continue
        if words[0] == "tensor":
            colon = words.index(":")
            shape = [int(w) for w in words[2:colon]]
            expected[words[1]] = np.array([float(w) for w in words[colon + 1 :]], dtype=np.float32).reshape(shape)
        elif words[0] == "meta":
            expected_meta[words[1]] = " ".join(words[2:])

    problems = []
    if set(header) != set(expected):
        problems.append("tensors %s in the file, %s expected" % (sorted(header), sorted(expected)))
    for name, want_t in expected.items():
        if name not in header:
            continue
        t = header[name]
        b, e = t["data_offsets"]
        if t["dtype"] != "F32":
            problems.append("%s: dtype %s" % (name, t["dtype"]))
            continue
        got = np.frombuffer(data[b:e], dtype="<f4").reshape(t["shape"])
        if list(got.shape) != list(want_t.shape):
            problems.append("%s: shape %s, expected %s" % (name, list(got.shape), list(want_t.shape)))
        elif not np.array_equal(got.view(np.uint32), want_t.view(np.uint32)):
            i = int(np.argmax(got.ravel().view(np.uint32) != want_t.ravel().view(np.uint32)))
            problems.append("%s[%d]: %r in the file, %r from C" % (name, i, got.ravel()[i], want_t.ravel()[i]))
    for k, v in expected_meta.items():
        if meta.get(k) != v:
            problems.append("metadata %s: %r in the file, %r expected" % (k, meta.get(k), v))
    if problems:
        print("\n".join(problems))
        return 1
    print(len(expected))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
