"""Candidate tile configurations of the tiled GEMM (`kernels/gemm_tiles.py`) against cuBLAS.

    python3 -m perf.experiments.gemm_variants [--repeats 10] [--variants a,b]   (GPU)
    NUMBA_ENABLE_CUDASIM=1 python3 -m perf.experiments.gemm_variants --quick      (CPU)
    PATH=$CUDA/bin:$PATH LD_LIBRARY_PATH=$CUDA/lib python3 -m perf.experiments.gemm_variants --ptxas

Every variant of VARIANTS runs 4096^3 and Llama 3.2 1B's five linear layers at M = 4096
(perf/bench_gemm.py's LAYERS; bf16 out, the LM head's float32). On each shape cuBLAS runs
first; each variant's output (poisoned before) is compared with it on its first and last 64
rows (relative error, bar 1e-2: those rows span every column of tiles of the first and the
last row of tiles), then timed with perf/timing.py (CUDA events, cold L2, median). A
variant that fails to compile or computes a wrong product is reported and dropped; the run
goes on. The table gives us, TFLOP/s and cuBLAS time / variant time; the JSON
(result_header, then one row per variant and shape, with the kernel's registers and local
memory as the driver reports them) goes to perf/results/experiments/gemm_variants.json.

`--quick` (for the simulator) runs two tiny shapes, one ragged (M, N, K off the tile) and
one aligned, against the NumPy float64 product, and one wall-clock run each
(the simulator's: nothing like a GPU's time).
`--ptxas` compiles every variant for sm_90 offline (perf/experiments/mma_sass.py's way) and
prints ptxas's registers, spills and shared memory, no GPU needed.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from numba import cuda, types
from numba.core.errors import NumbaError
from numba.cuda.cudadrv.driver import CudaAPIError, LinkerError

from tinyvllm.kernels.device.simulator import SIMULATOR
from tinyvllm.kernels.gemm import gemm, gemm_kernel
from tinyvllm.kernels.gemm_copies import stage_chunk_async
from tinyvllm.kernels.gemm_stores import store_bf16, store_bf16x2, store_f32
from tinyvllm.kernels.gemm_tiles import GemmShape
from tinyvllm.kernels.reference import from_bf16, to_bf16

VARIANTS = {
    "baseline": GemmShape(),
    "uniform": GemmShape(uniform=True),
    "swizzle2": GemmShape(swizzle=True, uniform=True),
    "swizzle3": GemmShape(swizzle=True, stages=3, uniform=True),
    "swizzle3_dbuf": GemmShape(swizzle=True, stages=3, uniform=True, double_buffer=True),
    "swizzle3_raster8": GemmShape(swizzle=True, stages=3, uniform=True, group_m=8),
    "swizzle3_packed": GemmShape(swizzle=True, stages=3, uniform=True, packed=True),
    "swizzle3_raster8_packed": GemmShape(swizzle=True, stages=3, uniform=True, group_m=8, packed=True),
    "wide_packed": GemmShape(block_n=256, swizzle=True, uniform=True, blocks_per_sm=1, packed=True),
    "wide_raster8_packed": GemmShape(block_n=256, swizzle=True, uniform=True, blocks_per_sm=1, group_m=8, packed=True),
    "wide_dbuf_raster8_packed": GemmShape(
        block_n=256, swizzle=True, uniform=True, double_buffer=True, blocks_per_sm=1, group_m=8, packed=True
    ),
    # past 48 KB: dynamic shared memory (gemm_tiles.allow_dynamic_shared)
    "swizzle4_raster8_packed": GemmShape(swizzle=True, stages=4, uniform=True, group_m=8, packed=True),
    "swizzle4_dbuf_raster8_packed": GemmShape(
        swizzle=True, stages=4, uniform=True, double_buffer=True, group_m=8, packed=True
    ),
    "k64_swizzle3_raster8_packed": GemmShape(block_k=64, swizzle=True, stages=3, uniform=True, group_m=8, packed=True),
    "wide3_raster8_packed": GemmShape(
        block_n=256, swizzle=True, stages=3, uniform=True, blocks_per_sm=1, group_m=8, packed=True
    ),
    "wide4_raster8_packed": GemmShape(
        block_n=256, swizzle=True, stages=4, uniform=True, blocks_per_sm=1, group_m=8, packed=True
    ),
    # 128 x 256 tiles walking K 64 at a time: warps of 64 x 64, a third fewer ldmatrix an mma than 64 x 32
    "wide_k64_swizzle3_raster8_packed": GemmShape(
        block_n=256, block_k=64, swizzle=True, stages=3, uniform=True, blocks_per_sm=1, group_m=8, packed=True
    ),
    "wide_k64_swizzle4_raster8_packed": GemmShape(
        block_n=256, block_k=64, swizzle=True, stages=4, uniform=True, blocks_per_sm=1, group_m=8, packed=True
    ),
    "k64_swizzle4_raster8_packed": GemmShape(block_k=64, swizzle=True, stages=4, uniform=True, group_m=8, packed=True),
    # 256 x 128 tiles of 16 warps, one block an SM
    "tall_k64_swizzle3_raster8_packed": GemmShape(
        block_m=256, block_k=64, swizzle=True, stages=3, uniform=True, blocks_per_sm=1, group_m=8, packed=True
    ),
    "tall_k64_swizzle4_raster8_packed": GemmShape(
        block_m=256, block_k=64, swizzle=True, stages=4, uniform=True, blocks_per_sm=1, group_m=8, packed=True
    ),
    "tall_swizzle4_raster8_packed": GemmShape(
        block_m=256, swizzle=True, stages=4, uniform=True, blocks_per_sm=1, group_m=8, packed=True
    ),
    # 128 x 128 tiles of 4 warps of 64 x 64, two blocks an SM of up to 255 registers
    "quad_k64_swizzle3_raster8_packed": GemmShape(
        block_k=64, swizzle=True, stages=3, uniform=True, group_m=8, packed=True, warps_n=2
    ),
    "quad_k64_swizzle3_dbuf_raster8_packed": GemmShape(
        block_k=64, swizzle=True, stages=3, uniform=True, double_buffer=True, group_m=8, packed=True, warps_n=2
    ),
    "quad_swizzle4_raster8_packed": GemmShape(swizzle=True, stages=4, uniform=True, group_m=8, packed=True, warps_n=2),
}
"""Name -> shape (gemm_tiles.py: what each field changes); `quad_k64_swizzle3_dbuf_raster8_packed` is the
library's GEMM_SHAPE. The 128 x 256 tiles come packed only: with per-element bf16 stores LLVM
leaves the epilogue's loop rolled and the 128 accumulators on the stack (ptxas: a 512-byte
frame). The 256 x 128 tiles (`block_m`) use 512 threads of at most 128 registers: their
warps' pieces are the 128 x 128 tile's."""
LAYERS = {"qkv_proj": (2048, 3072), "o_proj": (2048, 2048), "gate|up_proj": (2048, 8192), "down_proj": (8192, 2048)}
LAYERS["lm_head"] = (2048, 128256)
"""K, N as in perf/bench_gemm.py."""
M = 4096
SHAPES = [("square", M, M, M, np.uint16)] + [
    (layer, M, n, k, np.float32 if layer == "lm_head" else np.uint16) for layer, (k, n) in LAYERS.items()
]
QUICK_SHAPES = [("ragged", 72, 72, 40, np.uint16), ("aligned", 64, 64, 32, np.float32)]
"""Small for the simulator, yet with warps wholly inside Y (the branch-free path) and at its edges."""
CHECKED_ROWS = 64
ERROR_BAR = 1e-2
FAILURES = (NumbaError, CudaAPIError, LinkerError)
"""What a variant that does not compile or launch raises; it is reported and skipped."""
if not SIMULATOR:  # the simulator's cudadrv has no NVVM
    from numba.cuda.cudadrv.error import NvvmError

    FAILURES = (*FAILURES, NvvmError)
RESULTS = Path(__file__).resolve().parents[1] / "results" / "experiments" / "gemm_variants.json"


def host_bf16(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return to_bf16(rng.uniform(-2.0, 2.0, shape).astype(np.float32))


def checked_rows(out) -> np.ndarray:
    """Y's first and last CHECKED_ROWS rows (all of Y if it is small), as float64."""
    rows = (
        out.copy_to_host()
        if out.shape[0] <= 2 * CHECKED_ROWS
        else np.concatenate([out[:CHECKED_ROWS].copy_to_host(), out[-CHECKED_ROWS:].copy_to_host()])
    )
    return (from_bf16(rows) if rows.dtype == np.uint16 else rows).astype(np.float64)


def poison(out) -> None:
    """NaN everywhere (bf16 and float32 alike: all bits set), so rows left unwritten show."""
    if SIMULATOR:
        out.copy_to_device(np.full((*out.shape, out.dtype.itemsize), 0xFF, np.uint8).view(out.dtype)[..., 0])
    else:
        from numba.cuda.cudadrv.driver import device_memset

        device_memset(out, 0xFF, out.nbytes)


def relative_error(actual: np.ndarray, truth: np.ndarray) -> float:
    if not np.all(np.isfinite(actual)):
        return float("inf")
    return float(np.linalg.norm(actual - truth) / np.linalg.norm(truth))


def milliseconds(call, repeats: int) -> float:
    """Median of CUDA-event timings with a cold L2 (perf/timing.py)."""
    from perf.timing import median_ms

    return median_ms(call, warmup=2, repeats=repeats)


def operands(m: int, n: int, k: int, quick: bool):
    if quick:
        rng = np.random.default_rng(m + n + k)
        return cuda.to_device(host_bf16(rng, m, k)), cuda.to_device(host_bf16(rng, n, k))
    from perf.timing import random_bf16

    return random_bf16(m, k), random_bf16(n, k)


def kernel_resources(shape: GemmShape, out_dtype) -> dict:
    """Registers and local memory a thread of the compiled kernel, as the driver reports them."""
    if SIMULATOR:
        return {}
    store = store_f32 if out_dtype == np.float32 else (store_bf16x2 if shape.packed else store_bf16)
    overload = next(iter(gemm_kernel(stage_chunk_async, store, shape).overloads.values()))
    return {
        "registers": overload.regs_per_thread,
        "local_bytes": overload.local_mem_per_thread,
        "shared_bytes": overload.shared_mem_per_block,
    }


HEADER = (
    f"{'variant':<30} {'shape':<13} {'M':>5} {'N':>6} {'K':>5} {'us':>9} {'TFLOP/s':>8} {'vs cuBLAS':>9} {'rel err':>8}"
)


def reference_rows(x, weight, out, repeats: int, rows: list, problem: tuple) -> tuple[np.ndarray, float | None]:
    """(the checked rows of the true product, cuBLAS's milliseconds or None): cuBLAS's on a
    GPU (its row appended to rows), else the NumPy float64 product."""
    from tinyvllm.kernels import cublas

    if not cublas.available():
        product = from_bf16(x.copy_to_host()).astype(np.float64) @ from_bf16(weight.copy_to_host()).astype(np.float64).T
        if product.shape[0] > 2 * CHECKED_ROWS:
            product = np.concatenate([product[:CHECKED_ROWS], product[-CHECKED_ROWS:]])
        return product, None
    poison(out)
    cublas.cublas_gemm(x, weight, out)
    truth = checked_rows(out)
    reference_ms = milliseconds(lambda: cublas.cublas_gemm(x, weight, out), repeats)
    rows.append(row("cublas", *problem, reference_ms, 1.0, 0.0))
    print_row(rows[-1])
    return truth, reference_ms


def measure_shape(names: list[str], problem: tuple, repeats: int, quick: bool, failed: dict) -> list[dict]:
    """Rows of cuBLAS and of each variant not yet in `failed` on one problem (label, M, N, K, out
    dtype); a variant that fails to compile or launch, or is wrong, goes into `failed` instead."""
    label, m, n, k, out_dtype = problem
    x, weight = operands(m, n, k, quick)
    out = cuda.device_array((m, n), dtype=out_dtype)
    rows = []
    truth, reference_ms = reference_rows(x, weight, out, repeats, rows, problem)
    for name in names:
        if name in failed:
            continue
        shape = VARIANTS[name]
        try:
            poison(out)
            started = time.perf_counter()
            gemm(x, weight, out, shape=shape)
            cuda.synchronize()
            wall_ms = (time.perf_counter() - started) * 1e3
        except FAILURES as error:
            failed[name] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            print(f"{name:<30} {label:<13} FAILED to compile or launch, skipped: {failed[name]}")
            continue
        error = relative_error(checked_rows(out), truth)
        if not error < ERROR_BAR:
            failed[name] = f"relative error {error:.2e} on {label}"
            print(f"{name:<30} {label:<13} WRONG (relative error {error:.2e}), skipped")
            continue
        # the simulator's one run (its wall clock) stands in for a timing
        ms = wall_ms if SIMULATOR else milliseconds(lambda shape=shape: gemm(x, weight, out, shape=shape), repeats)
        speed = reference_ms / ms if reference_ms else None
        rows.append(row(name, *problem, ms, speed, error, kernel_resources(shape, out_dtype)))
        print_row(rows[-1])
    return rows


def measure(names: list[str], problems: list, repeats: int, quick: bool) -> list[dict]:
    """One row per (variant or cuBLAS, problem); variants that fail are dropped from later problems."""
    failed: dict[str, str] = {}
    print(HEADER)
    rows = [r for problem in problems for r in measure_shape(names, problem, repeats, quick, failed)]
    return rows + [{"variant": name, "failed": reason} for name, reason in failed.items()]


def row(variant, label, m, n, k, out_dtype, ms, vs_cublas, error, resources=None) -> dict:
    return {
        "variant": variant,
        "shape": label,
        "m": m,
        "n": n,
        "k": k,
        "out_dtype": np.dtype(out_dtype).name,
        "median_us": ms * 1e3,
        "tflops": 2 * m * n * k / (ms * 1e-3) / 1e12,
        "vs_cublas": vs_cublas,
        "relative_error": error,
        **(resources or {}),
    }


def print_row(r: dict) -> None:
    speed = f"{r['vs_cublas']:>9.2f}" if r["vs_cublas"] is not None else f"{'-':>9}"
    print(
        f"{r['variant']:<30} {r['shape']:<13} {r['m']:>5} {r['n']:>6} {r['k']:>5} {r['median_us']:>9.1f} "
        f"{r['tflops']:>8.1f} {speed} {r['relative_error']:>8.1e}"
    )


def ptxas_report(names: list[str]) -> None:
    """Registers, spills and shared memory of each variant's sm_90 kernel (bf16 and float32 out)."""
    from perf.experiments.mma_sass import compile_for_sm90

    tile = types.uint16[:, ::1]
    for name in names:
        shape = VARIANTS[name]
        bf16 = ("bf16x2", store_bf16x2) if shape.packed else ("bf16", store_bf16)
        for label, store in (bf16, ("f32", store_f32)):
            out_type = types.float32[:, ::1] if store is store_f32 else (types.uint32[:, ::1] if shape.packed else tile)
            kernel = gemm_kernel(stage_chunk_async, store, shape)
            with tempfile.TemporaryDirectory() as folder:
                try:
                    _, report, _ = compile_for_sm90(kernel, (tile, tile, out_type), Path(folder))
                except FAILURES as error:
                    print(f"{name:<30} {label:<6} FAILED: {error}")
                    continue
            lines = [
                line.split(":", 1)[-1].strip() for line in report.splitlines() if "Used" in line or "spill" in line
            ]
            dynamic = f" | {shape.dynamic_bytes} bytes dynamic smem" if shape.dynamic_bytes else ""
            print(f"{name:<30} {label:<6} {' | '.join(lines)}{dynamic}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS")
    parser.add_argument("--quick", action="store_true", help="tiny shapes against NumPy (for the simulator)")
    parser.add_argument("--ptxas", action="store_true", help="compile for sm_90 offline and print ptxas -v")
    args = parser.parse_args()
    names = args.variants.split(",")
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    if args.ptxas:
        if SIMULATOR:
            raise SystemExit("--ptxas needs NVVM: run it without NUMBA_ENABLE_CUDASIM")
        ptxas_report(names)
        return
    if SIMULATOR and not args.quick:
        raise SystemExit("under the simulator only --quick runs")
    if SIMULATOR:
        sys.setswitchinterval(5e-5)  # as tests/conftest.py: the simulated threads get the GIL sooner
    started = time.perf_counter()
    rows = measure(names, QUICK_SHAPES if args.quick else SHAPES, args.repeats, args.quick)
    print(f"{time.perf_counter() - started:.0f} s in all")
    if args.quick:
        return
    from perf.timing import result_header

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({**result_header(), "results": rows}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
