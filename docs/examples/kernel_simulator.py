"""Run a real tinyvllm kernel, RMSNorm, on a laptop: Numba's CUDA simulator executes the
@cuda.jit source on the CPU, one Python thread per CUDA thread. Its output is checked against
the NumPy reference, and a bad argument is refused by the launcher before anything runs.

Run it from the repository root: python docs/examples/kernel_simulator.py
"""

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before anything imports numba.cuda

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from tinyvllm.kernels import reference  # noqa: E402
from tinyvllm.kernels.rmsnorm import rmsnorm  # noqa: E402

rng = np.random.default_rng(0)
x = reference.to_bf16(rng.standard_normal((3, 64)))  # 3 tokens of hidden 64, bf16 bits as uint16
weight = reference.to_bf16(1.0 + 0.1 * rng.standard_normal(64))
out = cuda.to_device(np.full((3, 64), 0x7FC0, dtype=np.uint16))  # poisoned: bf16 NaN everywhere
rmsnorm(cuda.to_device(x), cuda.to_device(weight), 1e-5, out)  # one block of threads per token

got = reference.from_bf16(out.copy_to_host())
want = reference.rmsnorm(reference.from_bf16(x).astype(np.float64), reference.from_bf16(weight), 1e-5)
error = np.linalg.norm(got - want) / np.linalg.norm(want)
print(f"kernel against the float64 reference: relative error {error:.1e} (bf16 keeps 8 bits)")
assert np.isfinite(got).all() and error < 1e-2

try:  # a float32 x would be read as the wrong bytes: the launcher refuses it and names it
    rmsnorm(cuda.to_device(x.astype(np.float32)), cuda.to_device(weight), 1e-5, out)
except ValueError as problem:
    print("refused:", problem)
