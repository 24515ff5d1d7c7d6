"""What bounds the tiled GEMM: its kernel whole, without its copies, and without its mmas.

    python3 -m perf.experiments.gemm_ablation [--size 4096] [--repeats 20]   (GPU)

The library's kernel (`gemm_kernel(stage_chunk_async, store_bf16x2, GEMM_SHAPE)`) runs an
M = N = K = size product of random bf16 operands, timed as perf/timing.py times (median of
CUDA events, cold L2). It is then compiled twice more: with a staging function that copies
nothing, so that the mmas multiply whatever the tiles hold (the compute side with its waits
and barriers, no global loads), and with a slice multiplier that multiplies nothing (the
copies, waits and barriers alone). Where the whole kernel takes about as long as one half,
that half bounds it; where it takes well over both, the halves overlap badly. The ablated
kernels compute wrong products; only their times are read. TFLOP/s is 2 M N K over a time.
Results: perf/results/experiments/gemm_ablation.json.
"""

import argparse
import json
from pathlib import Path

import numba
from numba import cuda

from perf.timing import median_ms, random_bf16, result_header
from tinyvllm.kernels import gemm as gemm_module
from tinyvllm.kernels import gemm_copies, gemm_multiply, gemm_stores, gemm_tiles
from tinyvllm.kernels.device.launch import launch_kernel
from tinyvllm.kernels.device.simulator import SIMULATOR

RESULTS = Path(__file__).resolve().parents[1] / "results" / "experiments" / "gemm_ablation.json"
SHAPE = gemm_module.GEMM_SHAPE


@cuda.jit(device=True, inline=True)
def copy_nothing(tiles, offset, source, row, col, index, inside):
    pass


def multiply_nothing(shape):
    @cuda.jit(device=True, inline=True)
    def multiply_slice(acc, a_frag, b_frag, a_tiles, b_tiles, a_base, b_base, a_chunk, b_chunk):
        pass

    return multiply_slice


def kernels() -> dict:
    """The whole kernel and its two ablations, each compiled on its own."""
    store, real_multiplier = gemm_stores.store_bf16x2, gemm_multiply.slice_multiplier
    gemm_copies.SOURCES[copy_nothing] = gemm_copies.SOURCES[gemm_copies.stage_chunk_async]
    built = {
        "whole": gemm_module.gemm_kernel(gemm_copies.stage_chunk_async, store, SHAPE),
        "no_copies": gemm_module.gemm_kernel(copy_nothing, store, SHAPE),
    }
    gemm_module.gemm_kernel.cache_clear()
    gemm_multiply.slice_multiplier = multiply_nothing
    try:
        built["no_mma"] = gemm_module.gemm_kernel(gemm_copies.stage_chunk_async, store, SHAPE)
    finally:
        gemm_multiply.slice_multiplier = real_multiplier
        gemm_module.gemm_kernel.cache_clear()
    return built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if SIMULATOR:
        raise SystemExit("gemm_ablation times real kernels: it needs a CUDA GPU, not the simulator")
    n = args.size
    x, w = random_bf16(n, n), random_bf16(n, n)
    out = cuda.device_array((n, n // 2), "uint32")  # bf16 pairs, as the packed store writes them
    grid, flops = gemm_tiles.grid(SHAPE, n, n), 2.0 * n**3
    rows = []
    for name, kernel in kernels().items():
        gemm_tiles.allow_dynamic_shared(kernel, tuple(numba.typeof(a) for a in (x, w, out)), SHAPE.dynamic_bytes)

        def launch(kernel=kernel):
            launch_kernel(kernel, grid, SHAPE.threads, 0, x, w, out, shared_bytes=SHAPE.dynamic_bytes)

        ms = median_ms(launch, repeats=args.repeats)
        rows.append({"kernel": name, "ms": ms, "tflops": flops / ms / 1e9})
        print(f"{name:<10} {ms:8.4f} ms {flops / ms / 1e9:8.1f} TFLOP/s")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result_header() | {"size": n, "shape": str(SHAPE), "rows": rows}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
