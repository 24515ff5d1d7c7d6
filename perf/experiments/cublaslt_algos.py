"""cuBLASLt's other algorithms for decode-sized products, against cublasGemmEx's own choice.

    python -m perf.experiments.cublaslt_algos [--repeats 20] [--rows 1 8 64]      (GPU)

`kernels/cublas.py` calls cublasGemmEx, which runs the first algorithm of cuBLASLt's heuristic
for the shape. At a decode step's M (1 to 256 rows of X) a Llama 3.2 1B product is bound by
reading W, and cuBLAS streams it at 1.3 to 2.6 TB/s on the H100 (o at M = 64 the slowest,
perf/LOG.md 2026-12-06): few tiles of M, one wave or less. cuBLASLt's heuristic lists more
algorithms than the one it ranks first (other tiles, split-K with its reduction), and its
own ranking is a model, not a measurement: TensorRT-LLM times the candidates once per shape
and keeps the fastest. This asks the heuristic for up to CANDIDATES algorithms a shape, runs
each as a decode step would (a CUDA graph of launches over 512 MB of distinct copies of W,
`perf/bench_gemm.streamed_ms`), checks its output against cublasGemmEx's (outputs poisoned
first), and prints the fastest correct one against cublasGemmEx. o and down accumulate into
their output (beta = 1), as the engine's residual adds do. JSON to
perf/results/experiments/cublaslt_algos.json.
"""

import argparse
import ctypes
import json
import time
from pathlib import Path

import numpy as np
from numba import cuda

from tinyvllm.kernels.cublas import (
    CUBLAS_COMPUTE_32F,
    CUBLAS_OP_N,
    CUBLAS_OP_T,
    CUDA_R_16BF,
    CUDA_R_32F,
    WORKSPACE_BYTES,
    cublas_gemm,
    stream_pointer,
)
from tinyvllm.kernels.device.vector_io import data_address

LAYERS = {  # name: (N, K, accumulate)
    "qkv_proj": (3072, 2048, False),
    "o_proj": (2048, 2048, True),
    "gate|up_proj": (16384, 2048, False),
    "down_proj": (2048, 8192, True),
    "lm_head": (128256, 2048, False),
}
ROWS = (1, 8, 16, 32, 64, 128, 256)
CANDIDATES = 32
ERROR_BAR = 1e-2
"""Relative error against cublasGemmEx's output past which an algorithm is wrong (both sum in
float32; a split-K reduction adds in another order)."""
DESC_TRANSA, DESC_TRANSB, PREF_MAX_WORKSPACE_BYTES = 3, 4, 1
RESULTS = Path(__file__).resolve().parents[1] / "results" / "experiments" / "cublaslt_algos.json"


class HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t: the algorithm is 8 opaque 64-bit words."""

    _fields_ = [
        ("algo", ctypes.c_uint64 * 8),
        ("workspace_size", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("waves_count", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


def load_cublaslt() -> ctypes.CDLL:
    """The libcublasLt that CuPy's libcublas loaded (found in this process's memory map)."""
    import cupy

    ctypes.CDLL(cupy.cuda.cublas.__file__)  # libcublas, and with it libcublasLt

    maps = Path("/proc/self/maps").read_text().split("\n")
    path = next(line.split()[-1] for line in maps if "libcublasLt.so" in line)
    library = ctypes.CDLL(path)
    for name in (
        "cublasLtCreate",
        "cublasLtMatmulDescCreate",
        "cublasLtMatmulDescSetAttribute",
        "cublasLtMatrixLayoutCreate",
        "cublasLtMatmulPreferenceCreate",
        "cublasLtMatmulPreferenceSetAttribute",
        "cublasLtMatmulAlgoGetHeuristic",
        "cublasLtMatmul",
    ):
        getattr(library, name).restype = ctypes.c_int
    library.cublasLtMatrixLayoutCreate.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64]  # fmt: skip
    return library


def check(status: int, name: str) -> None:
    if status != 0:
        raise RuntimeError(f"{name} failed: status {status}")


class LtProduct:
    """Y[M, N] (+)= X[M, K] W[N, K]^T through cublasLtMatmul, laid out as kernels/cublas.py lays
    out cublasGemmEx (Y^T = W X^T in column-major), with any algorithm the heuristic lists."""

    def __init__(self, lt: ctypes.CDLL, handle: ctypes.c_void_p, workspace, m: int, n: int, k: int, accumulate: bool):
        self.lt, self.handle, self.workspace = lt, handle, workspace
        self.beta = ctypes.c_float(1.0 if accumulate else 0.0)
        self.alpha = ctypes.c_float(1.0)
        self.desc = ctypes.c_void_p()
        check(lt.cublasLtMatmulDescCreate(ctypes.byref(self.desc), CUBLAS_COMPUTE_32F, CUDA_R_32F), "DescCreate")
        for attribute, op in ((DESC_TRANSA, CUBLAS_OP_T), (DESC_TRANSB, CUBLAS_OP_N)):
            value = ctypes.c_int32(op)
            check(lt.cublasLtMatmulDescSetAttribute(self.desc, attribute, ctypes.byref(value), 4), "DescSetAttribute")
        self.a, self.b, self.c = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        for layout, rows, cols, lead in ((self.a, k, n, k), (self.b, k, m, k), (self.c, n, m, n)):
            check(lt.cublasLtMatrixLayoutCreate(ctypes.byref(layout), CUDA_R_16BF, rows, cols, lead), "LayoutCreate")

    def candidates(self, count: int) -> list[HeuristicResult]:
        preference = ctypes.c_void_p()
        check(self.lt.cublasLtMatmulPreferenceCreate(ctypes.byref(preference)), "PreferenceCreate")
        size = ctypes.c_uint64(WORKSPACE_BYTES)
        check(self.lt.cublasLtMatmulPreferenceSetAttribute(preference, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(size), 8),
              "PreferenceSetAttribute")  # fmt: skip
        results, found = (HeuristicResult * count)(), ctypes.c_int()
        check(self.lt.cublasLtMatmulAlgoGetHeuristic(self.handle, self.desc, self.a, self.b, self.c, self.c,
              preference, count, results, ctypes.byref(found)), "AlgoGetHeuristic")  # fmt: skip
        return [results[i] for i in range(found.value) if results[i].state == 0]

    def launcher(self, result: HeuristicResult):
        algo = ctypes.byref(result.algo)

        def launch(x, weight, out, *, stream=0) -> None:
            check(self.lt.cublasLtMatmul(
                self.handle, self.desc, ctypes.byref(self.alpha), ctypes.c_void_p(data_address(weight)), self.a,
                ctypes.c_void_p(data_address(x)), self.b, ctypes.byref(self.beta),
                ctypes.c_void_p(data_address(out)), self.c, ctypes.c_void_p(data_address(out)), self.c, algo,
                ctypes.c_void_p(data_address(self.workspace)), ctypes.c_size_t(WORKSPACE_BYTES),
                ctypes.c_void_p(stream_pointer(stream))), "Matmul")  # fmt: skip

        return launch


def output_of(launch, x, weight, out, accumulate: bool, residual: np.ndarray) -> np.ndarray:
    """One launch's output: from NaN, or (accumulating) from the same residual every time."""
    from perf.experiments.gemm_variants import poison
    from tinyvllm.kernels.reference import from_bf16

    if accumulate:
        out.copy_to_device(residual)
    else:
        poison(out)
    launch(x, weight, out)
    cuda.synchronize()
    return from_bf16(out.copy_to_host())


def measure_shape(lt, handle, workspace, weights: list, m: int, accumulate: bool, repeats: int) -> dict:
    """cublasGemmEx and every listed cuBLASLt algorithm at one shape."""
    from perf.bench_gemm import streamed_ms
    from perf.experiments.gemm_variants import relative_error
    from perf.timing import random_bf16

    n, k = weights[0].shape
    x, out = random_bf16(m, k), cuda.device_array((m, n), np.uint16)
    residual = random_bf16(m, n).copy_to_host()

    def gemm_ex(x, weight, out, *, stream=0) -> None:
        cublas_gemm(x, weight, out, accumulate=accumulate, stream=stream)

    truth = output_of(gemm_ex, x, weights[0], out, accumulate, residual)
    gemm_ex_us = streamed_ms(gemm_ex, x, weights, out, repeats) * 1e3
    product = LtProduct(lt, handle, workspace, m, n, k, accumulate)
    timings = []
    for index, result in enumerate(product.candidates(CANDIDATES)):
        launch = product.launcher(result)
        error = relative_error(output_of(launch, x, weights[0], out, accumulate, residual), truth)
        us = streamed_ms(launch, x, weights, out, repeats) * 1e3 if error < ERROR_BAR else None
        timings.append({"index": index, "us": us, "error": error, "waves": result.waves_count,
                        "workspace": result.workspace_size})  # fmt: skip
    best = min((t for t in timings if t["us"] is not None), key=lambda t: t["us"], default=None)
    return {"m": m, "n": n, "k": k, "accumulate": accumulate, "gemm_ex_us": gemm_ex_us,
            "lt_first_us": timings[0]["us"] if timings else None, "best": best, "candidates": timings}  # fmt: skip


def measure(rows_list: tuple[int, ...], repeats: int) -> list[dict]:
    from perf.bench_gemm import streamed_weights

    lt = load_cublaslt()
    handle = ctypes.c_void_p()
    check(lt.cublasLtCreate(ctypes.byref(handle)), "Create")
    workspace = cuda.device_array(WORKSPACE_BYTES, np.uint8)
    rows = []
    print(f"{'layer':<13} {'M':>4} {'GemmEx us':>9} {'TB/s':>5} {'Lt #0 us':>9} {'best us':>8} {'best #':>6} "
          f"{'speedup':>7} {'TB/s':>5} {'listed':>6}")  # fmt: skip
    for layer, (n, k, accumulate) in LAYERS.items():
        weights = streamed_weights(k, n)
        for m in rows_list:
            row = {"layer": layer} | measure_shape(lt, handle, workspace, weights, m, accumulate, repeats)
            rows.append(row)
            weight_bytes, best = n * k * 2, row["best"]
            best_us = best["us"] if best else float("nan")
            print(f"{layer:<13} {m:>4} {row['gemm_ex_us']:>9.2f} {weight_bytes / row['gemm_ex_us'] / 1e6:>5.2f} "
                  f"{row['lt_first_us'] or float('nan'):>9.2f} {best_us:>8.2f} {best['index'] if best else '-':>6} "
                  f"{row['gemm_ex_us'] / best_us:>7.2f} {weight_bytes / best_us / 1e6:>5.2f} "
                  f"{len(row['candidates']):>6}")  # fmt: skip
        weights.clear()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    args = parser.parse_args()
    from perf.timing import result_header

    started = time.perf_counter()
    rows = measure(tuple(args.rows), args.repeats)
    print(f"{time.perf_counter() - started:.0f} s in all")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({**result_header(), "candidates": CANDIDATES, "results": rows}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
