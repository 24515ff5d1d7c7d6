"""The embedding gather and SiLU·mul kernels under Numba's CUDA simulator (no GPU), against
their NumPy references: the gather bit for bit, the activation within bf16 rounding.

Run it from the repository root: python docs/examples/elementwise_kernels.py
"""

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before anything imports numba.cuda

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from tinyvllm.kernels import reference  # noqa: E402
from tinyvllm.kernels.activation import silu_mul  # noqa: E402
from tinyvllm.kernels.embedding import embedding  # noqa: E402

rng = np.random.default_rng(0)
table = reference.to_bf16(rng.standard_normal((16, 32)))  # vocabulary 16, hidden 32
token_ids = np.array([3, 0, 15, 3], dtype=np.int32)
rows = cuda.to_device(np.full((4, 32), 0x7FC0, dtype=np.uint16))  # poisoned with bf16 NaN
embedding(token_ids, cuda.to_device(table), rows)
assert np.array_equal(rows.copy_to_host(), reference.embedding(token_ids, table))
print("embedding: rows", token_ids.tolist(), "gathered bit for bit")

gate_up = reference.to_bf16(rng.standard_normal((2, 32)) * 3)  # 2 tokens, 16 (gate, up) pairs each
out = cuda.to_device(np.full((2, 16), 0x7FC0, dtype=np.uint16))
silu_mul(cuda.to_device(gate_up), out)
got = reference.from_bf16(out.copy_to_host())
want = reference.silu_mul(reference.from_bf16(gate_up).astype(np.float64))
print(f"silu_mul: largest relative difference {np.abs(got - want).max() / np.abs(want).max():.1e}")
assert np.allclose(got, want, rtol=2.0**-8, atol=1e-6)  # one bf16 rounding of the float32 result

try:  # an id past the vocabulary would read memory that is not the table
    embedding(np.array([16], dtype=np.int32), cuda.to_device(table), rows[:1])
except ValueError as problem:
    print("refused:", problem)
