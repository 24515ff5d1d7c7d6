"""The matrix product through cuBLAS (tensor cores), on a handle of our own.

    Y[M, N] = X[M, K] @ W[N, K]^T        (X, W bf16; float32 accumulation; Y bf16 or float32)

cuBLAS is column-major. A row-major [R, C] matrix is, to cuBLAS, its [C, R] transpose,
so it computes the transpose of the whole product instead: Y^T[N, M] = W[N, K] X^T[K, M].
W (column-major K x N, leading dimension K) is taken with op T, X (column-major K x M)
as it is, and Y comes out column-major N x M with leading dimension N, which is exactly
row-major Y[M, N]:

    cublasGemmEx(h, T, N, m=N, n=M, k=K, 1, W, bf16, K, X, bf16, K, 0, Y, bf16|f32, N, f32)

(with beta 1 instead of 0 to accumulate: Y += the product).

CuPy's own binding refuses to run while a stream is being captured into a CUDA graph, so
this module calls the C library directly through ctypes. It uses the very libcublas that
CuPy loaded: the symbols are looked up through CuPy's cuBLAS extension module, whose
dynamic-link dependencies include it (that works for any CuPy wheel, cupy-cuda12x or 13x,
wherever the library came from). The handle gets its stream and a fixed workspace before
every launch on a new stream (cublasSetStream resets the workspace), so no launch
allocates memory and every launch can be captured. The first call creates the handle and
allocates the workspace: make it before capturing (the engine's warm-up forward does).

CuPy is imported on first use only: the simulator and CI have no CuPy and no GPU.
"""

import ctypes
import functools
import importlib.util

import numpy as np
from numba import cuda

from tinyvllm.hardware import has_cuda_gpu
from tinyvllm.kernels.device.simulator import SIMULATOR
from tinyvllm.kernels.device.vector_io import data_address
from tinyvllm.kernels.gemm import check_linear

CUBLAS_OP_N = 0
CUBLAS_OP_T = 1
CUDA_R_32F = 0
CUDA_R_16BF = 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 * 1024 * 1024
"""cuBLAS asks for 32 MiB of workspace on Hopper."""

OUTPUT_TYPES = {np.dtype(np.uint16): CUDA_R_16BF, np.dtype(np.float32): CUDA_R_32F}
_ONE = ctypes.c_float(1.0)
_ZERO = ctypes.c_float(0.0)


class CublasError(RuntimeError):
    """A cuBLAS call returned a status other than CUBLAS_STATUS_SUCCESS."""


@functools.cache
def available() -> bool:
    """cuBLAS runs here: a real GPU (not the simulator) and CuPy installed."""
    return not SIMULATOR and has_cuda_gpu() and importlib.util.find_spec("cupy") is not None


def _declare(library: ctypes.CDLL) -> ctypes.CDLL:
    handle, pointer, integer = ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int
    gemm_ex = [handle, integer, integer, integer, integer, integer]  # handle, transa, transb, m, n, k
    gemm_ex += [pointer, pointer, integer, integer]  # alpha, A, A type, lda
    gemm_ex += [pointer, integer, integer]  # B, B type, ldb
    gemm_ex += [pointer, pointer, integer, integer]  # beta, C, C type, ldc
    gemm_ex += [integer, integer]  # compute type, algorithm
    signatures = {
        "cublasCreate_v2": [ctypes.POINTER(handle)],
        "cublasSetStream_v2": [handle, pointer],
        "cublasSetWorkspace_v2": [handle, pointer, ctypes.c_size_t],
        "cublasGemmEx": gemm_ex,
    }
    for name, argtypes in signatures.items():
        function = getattr(library, name)
        function.argtypes = argtypes
        function.restype = ctypes.c_int
    library.cublasGetStatusName.argtypes = [ctypes.c_int]
    library.cublasGetStatusName.restype = ctypes.c_char_p
    return library


class _Cublas:
    """One cuBLAS handle with its workspace, and the stream it was last given."""

    def __init__(self):
        import cupy

        self.library = _declare(ctypes.CDLL(cupy.cuda.cublas.__file__))
        self.handle = ctypes.c_void_p()
        self.call("cublasCreate_v2", ctypes.byref(self.handle))
        self.workspace = cuda.device_array(WORKSPACE_BYTES, dtype=np.uint8)
        self.stream = None

    def call(self, name: str, *args) -> None:
        status = getattr(self.library, name)(*args)
        if status != 0:
            status_name = self.library.cublasGetStatusName(status).decode()
            raise CublasError(f"{name} failed: {status_name} ({status})")

    # --8<-- [start:stream]
    def use_stream(self, stream: int) -> None:
        if stream != self.stream:
            self.call("cublasSetStream_v2", self.handle, stream)
            self.call("cublasSetWorkspace_v2", self.handle, data_address(self.workspace), WORKSPACE_BYTES)
            self.stream = stream

    # --8<-- [end:stream]


@functools.cache
def _cublas() -> _Cublas:
    if not available():
        raise RuntimeError("cuBLAS needs a CUDA GPU and CuPy (pip install tinyvllm[cuda12] or [cuda13])")
    return _Cublas()


def stream_pointer(stream) -> int:
    """The cudaStream_t of 0, a Numba stream (`int()` gives its handle) or a CuPy stream (`.ptr`)."""
    return stream.ptr if hasattr(stream, "ptr") else int(stream)


# --8<-- [start:gemm-ex]
def cublas_gemm(x, weight, out, *, accumulate: bool = False, stream=0) -> None:
    """out[M, N] = x[M, K] @ weight[N, K]^T with cublasGemmEx; any CUDA-array-interface arrays.
    With `accumulate`, out += the product (beta = 1; bf16 out only)."""
    m, n, k = check_linear(x, weight, out, accumulate=accumulate)
    blas = _cublas()
    blas.use_stream(stream_pointer(stream))
    blas.call(
        "cublasGemmEx",
        blas.handle,
        CUBLAS_OP_T,
        CUBLAS_OP_N,
        n,
        m,
        k,
        ctypes.byref(_ONE),
        data_address(weight),
        CUDA_R_16BF,
        k,
        data_address(x),
        CUDA_R_16BF,
        k,
        ctypes.byref(_ONE if accumulate else _ZERO),
        data_address(out),
        OUTPUT_TYPES[np.dtype(out.dtype)],
        n,
        CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT,
    )


# --8<-- [end:gemm-ex]
