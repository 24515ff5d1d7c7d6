"""Write a small safetensors file with tinyvllm's writer, then read its header by hand.

Run it from the repository root: python docs/examples/safetensors_header.py [FILE]
Given a FILE (a model.safetensors: the default model's is in its directory under
~/.cache/tinyvllm after the first `tinyvllm generate`), it reads that file's header instead.
"""

import json
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np

from tinyvllm.kernels.reference import to_bf16
from tinyvllm.model.weights import read_header, save_safetensors

scratch = tempfile.TemporaryDirectory()
if len(sys.argv) > 1:
    path = Path(sys.argv[1])
else:
    path = Path(scratch.name) / "model.safetensors"
    weights = {"embed": to_bf16(np.linspace(-1, 1, 4 * 8).reshape(4, 8)), "norm": to_bf16(np.ones(8))}
    save_safetensors(path, weights)

with open(path, "rb") as f:
    (header_len,) = struct.unpack("<Q", f.read(8))  # 8 bytes: the header's length, little-endian
    header = json.loads(f.read(header_len))  # then the JSON header itself
data_start = 8 + header_len
print(f"{path}: header of {header_len} bytes, tensor data from byte {data_start}")
for name, entry in list(header.items())[:8]:
    if name == "__metadata__":
        print(f"  metadata {entry}")
        continue
    begin, end = entry["data_offsets"]  # relative to the start of the data
    print(f"  {name}: {entry['dtype']} {entry['shape']}, file bytes {data_start + begin} to {data_start + end}")

# tinyvllm's own reader, which also checks every entry, finds the same tensors.
tensors = read_header(path)
assert set(tensors) == {name for name in header if name != "__metadata__"}
assert data_start % 8 == 0  # the writer pads the header so that the data starts aligned
scratch.cleanup()
