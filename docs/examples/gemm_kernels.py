"""The two Numba matrix-product kernels under the CUDA simulator (no GPU): the GEMV, built for
a few rows, and the tiled GEMM, built for many, both against Y = X W^T in float64.

Run it from the repository root: python docs/examples/gemm_kernels.py
"""

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before anything imports numba.cuda

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from tinyvllm.kernels import reference  # noqa: E402
from tinyvllm.kernels.gemm import gemm  # noqa: E402
from tinyvllm.kernels.gemv import gemv  # noqa: E402

rng = np.random.default_rng(0)
weight = reference.to_bf16(rng.standard_normal((24, 64)) / 8)  # W: [N, K], Hugging Face's orientation
for kernel, rows in ((gemv, 1), (gemm, 5)):  # a decode step's one row; a few prefill rows
    x = reference.to_bf16(rng.standard_normal((rows, 64)))
    out = cuda.to_device(np.full((rows, 24), 0x7FC0, dtype=np.uint16))  # poisoned with bf16 NaN
    kernel(cuda.to_device(x), cuda.to_device(weight), out)
    got = reference.from_bf16(out.copy_to_host())
    want = reference.from_bf16(x).astype(np.float64) @ reference.from_bf16(weight).astype(np.float64).T
    error = np.linalg.norm(got - want) / np.linalg.norm(want)
    print(f"{kernel.__name__}: M = {rows}, N = 24, K = 64: relative error {error:.1e}")
    assert error < 1e-2  # float32 sums, one bf16 rounding at the store
