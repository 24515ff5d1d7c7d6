"""The linear layer, y = x @ W^T: one entry point over the matrix-product kernels.

    backend   kernel
    "cublas"  cuBLAS cublasGemmEx on tensor cores (kernels/cublas.py)
    "tiled"   the tiled Numba GEMM, for many rows of x (kernels/gemm.py)
    "gemv"    the Numba matrix-vector kernel, for at most gemv.MAX_ROWS rows (kernels/gemv.py)
    "numba"   gemv up to GEMV_ROWS rows of x, tiled above
    "auto"    on a real GPU with CuPy installed: gemv for one row of x, cuBLAS above;
              else "numba"

The product is arithmetic-bound only when x has many rows; for a handful of rows (decode)
it is bound by reading W, which is what the GEMV kernel is built for.
"""

from tinyvllm.kernels import cublas
from tinyvllm.kernels.gemm import check_linear, gemm
from tinyvllm.kernels.gemv import MAX_ROWS, gemv

GEMV_ROWS = MAX_ROWS
""""numba" uses the GEMV kernel up to this many rows of x (confirm with perf/bench_gemm.py)."""
AUTO_GEMV_ROWS = 1
""""auto" uses the GEMV kernel up to this many rows: at M = 1 it reads the weights as fast
as cuBLAS or faster on every Llama 3.2 1B layer (H200, perf/bench_gemm.py), above it
cuBLAS pulls ahead."""

LAUNCHERS = {"cublas": cublas.cublas_gemm, "tiled": gemm, "gemv": gemv}
BACKENDS = ("auto", "numba", *LAUNCHERS)


# --8<-- [start:dispatch]
def linear(x, weight, out, *, backend: str = "auto", stream=0) -> None:
    """out[M, N] = x[M, K] @ weight[N, K]^T (bf16 in, float32 sums, bf16 or float32 out)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    m, _, _ = check_linear(x, weight, out)
    if backend == "auto" and cublas.available():
        backend = "gemv" if m <= AUTO_GEMV_ROWS else "cublas"
    elif backend == "auto":
        backend = "numba"
    if backend == "numba":
        backend = "gemv" if m <= GEMV_ROWS else "tiled"
    LAUNCHERS[backend](x, weight, out, stream=stream)
# --8<-- [end:dispatch]
