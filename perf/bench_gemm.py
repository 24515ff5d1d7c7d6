"""The matrix product y = x @ W^T: tiled Numba GEMM, Numba GEMV and cuBLAS on the GPU.

    python -m perf.bench_gemm [--repeats 50] [--sweep]

Shapes are Llama 3.2 1B's linear layers, K -> N: the fused q|k|v 2048 -> 3072, o 2048 ->
2048, gate/up 2048 -> 8192 (each; the fused pair is 16384), down 8192 -> 2048 and the LM
head 2048 -> 128256 (float32 logits; every other output is bf16), each at M = 1 (decode),
2, 4, 8 (the GEMV/tiled threshold), 16, 256 and 4096 (prefill) rows, plus 4096^3. Each
variant is timed with perf/timing.py (CUDA events, cold L2 on every run, median), its
first rows are checked against cuBLAS's, and the table gives:

    TFLOP/s  2 M N K / time
    TB/s     (weight + activation bytes: N K 2 + M K 2) / time, the bound for small M
    vs cuBLAS  cuBLAS time / this time (1.0 = as fast)

A single launch of a 32 MB weight carries a few microseconds of fixed cost (launch, ramp
up, tail) next to ~8 us of reading, so at M = 1 the script also measures what a decode
step sees: many launches over distinct weights, back to back in one CUDA graph
(`streamed_tbps`), for the GEMV kernel and for cuBLAS alike; the GEMV launches with
programmatic dependent launch, as in the engine's graphs. `--sweep` streams the GEMV in
other block shapes too (threads x rows of W per block x chunks a thread loads at once)
on every layer but the LM head.

Bars on the H200: tiled >= 400 TFLOP/s at 4096^3 and >= half of cuBLAS on every layer at
M = 4096 (issue 35, tensor cores); GEMV >= 3.4 TB/s at M = 1 on 2048 ->
8192 and 8192 -> 2048 (cuBLAS 3.34 TB/s), judged on the streamed measurement. Results go
to perf/results/bench_gemm.json.
"""

import argparse
import functools
import json
from pathlib import Path

import numpy as np
from numba import config, cuda

from perf.timing import captured, median_ms, random_bf16, result_header
from tinyvllm.kernels.cublas import cublas_gemm
from tinyvllm.kernels.device.multiprocessors import multiprocessor_count
from tinyvllm.kernels.gemm import gemm
from tinyvllm.kernels.gemm_stores import STORES
from tinyvllm.kernels.gemv import (
    gemv,
    gemv_kernel,
    read_chunk_whole,
    store_sums,
)
from tinyvllm.kernels.gemv_shape import MAX_ROWS
from tinyvllm.kernels.reference import from_bf16

LAYERS = {
    "qkv_proj": (2048, 3072),
    "o_proj": (2048, 2048),
    "gate|up_proj": (2048, 8192),
    "down_proj": (8192, 2048),
    "lm_head": (2048, 128256),
}
ROW_COUNTS = (1, 2, 4, 8, 16, 256, 4096)
SQUARE = 4096
CHECKED_ROWS = 64
TILED_BAR_TFLOPS = 400.0
TILED_BAR_VS_CUBLAS = 0.5
"""Issue 35's bars: the tiled GEMM at 4096^3, and at M = 4096 on every layer against cuBLAS."""
GEMV_BAR_TBPS = 3.4
GEMV_BAR_LAYERS = ("gate|up_proj", "down_proj")
STREAMED_BYTES = 512 << 20
GEMV_SWEEP = tuple(
    (threads, rows, depth, blocks_per_sm)
    for threads, rows, depth in ((64, 2, 4), (64, 4, 4), (128, 2, 2), (128, 4, 2), (128, 4, 4), (256, 4, 1))
    for blocks_per_sm in (None, 6, 8, 12)
)
"""(threads, rows of W per block, chunks loaded at once, blocks per SM or None for one block
per row group) shapes of the M = 1 GEMV that `--sweep` streams."""
SWEEP_LAYERS = ("qkv_proj", "o_proj", *GEMV_BAR_LAYERS)
RESULTS = Path(__file__).resolve().parent / "results" / "bench_gemm.json"


def problems():
    """(layer, x, weight, out dtype) for every layer and row count, then the square product."""
    for layer, (k, n) in LAYERS.items():
        weight = random_bf16(n, k)
        out_dtype = np.float32 if layer == "lm_head" else np.uint16
        for m in ROW_COUNTS:
            yield layer, random_bf16(m, k), weight, out_dtype
    yield "square", random_bf16(SQUARE, SQUARE), random_bf16(SQUARE, SQUARE), np.uint16


def streamed_weights(k: int, n: int) -> list:
    """Distinct copies of an N x K weight, STREAMED_BYTES in all: several times the L2."""
    return [random_bf16(n, k) for _ in range(max(2, -(-STREAMED_BYTES // (n * k * 2))))]


def streamed_ms(launch, x, weights: list, out, repeats: int) -> float:
    """Milliseconds of one launch(x, weight, out) as a decode step sees it: one CUDA graph of
    launches over distinct copies of the weight, so no launch finds its weight in the L2 and
    no Python launch gap sits between them. The Numba kernels launch with PDL, as in the
    engine's graphs (`kernels/device/pdl.py`); cuBLAS cannot."""
    import cupy

    cupy_stream = cupy.cuda.Stream(non_blocking=True)
    stream = cuda.external_stream(cupy_stream.ptr)
    launch(x, weights[0], out, stream=stream)  # cuBLAS takes the stream here, not during the capture
    stream.synchronize()

    def launches() -> None:
        for weight in weights:
            launch(x, weight, out, stream=stream)

    return median_ms(captured(cupy_stream, launches), repeats=repeats, stream=stream) / len(weights)


def streamed_tbps(launch, weights: list, repeats: int) -> float:
    """Weight-streaming TB/s at M = 1 (`streamed_ms`)."""
    n, k = weights[0].shape
    x, out = random_bf16(1, k), cuda.device_array((1, n), dtype=np.uint16)
    return (n * k + k) * 2 / streamed_ms(launch, x, weights, out, repeats) / 1e9


def gemv_shaped(threads: int, rows: int, depth: int, blocks_per_sm: int | None):
    """The M = 1 GEMV launched with another block shape and grid (bf16 out), for the sweep."""
    kernel = gemv_kernel(1, read_chunk_whole, store_sums(STORES[np.dtype(np.uint16)], 1, rows), threads, rows, depth)

    def launch(x, weight, out, *, stream=0):
        groups = -(-weight.shape[0] // rows)
        blocks = groups if blocks_per_sm is None else min(groups, blocks_per_sm * multiprocessor_count())
        kernel[blocks, threads, stream](x, weight, out)

    return launch


def sweep(repeats: int) -> list[dict]:
    """Streamed TB/s of every GEMV block shape on every layer but the LM head."""
    rows = []
    for layer in SWEEP_LAYERS:
        k, n = LAYERS[layer]
        weights = streamed_weights(k, n)
        for threads, rows_per_block, depth, blocks_per_sm in GEMV_SWEEP:
            tbps = streamed_tbps(gemv_shaped(threads, rows_per_block, depth, blocks_per_sm), weights, repeats)
            rows.append(
                {
                    "layer": layer,
                    "threads": threads,
                    "rows_per_block": rows_per_block,
                    "depth": depth,
                    "blocks_per_sm": blocks_per_sm,
                    "gemv_tbps": tbps,
                }
            )
            print(
                f"sweep gemv {layer:<13} threads {threads:>3} rows/block {rows_per_block} depth {depth} "
                f"blocks/SM {blocks_per_sm}: {tbps:.2f} TB/s"
            )
        del weights
    return rows


def checked_rows(out) -> np.ndarray:
    rows = out[: min(out.shape[0], CHECKED_ROWS)].copy_to_host()
    return from_bf16(rows) if rows.dtype == np.uint16 else rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--sweep", action="store_true", help="also stream the M = 1 GEMV in other block shapes")
    args = parser.parse_args()
    if config.ENABLE_CUDASIM:
        raise SystemExit("bench_gemm times real kernels: it needs a CUDA GPU, not the simulator")

    rows = []
    print(
        f"{'layer':<13} {'M':>5} {'N':>6} {'K':>5} {'variant':<7} {'us':>10} {'TFLOP/s':>8} {'TB/s':>6} "
        f"{'vs cuBLAS':>9} {'rel err':>8}"
    )
    for layer, x, weight, out_dtype in problems():
        (m, k), n = x.shape, weight.shape[0]
        variants = {"cublas": cublas_gemm, "tiled": gemm}
        if m <= MAX_ROWS:
            variants["gemv"] = gemv
        outputs = {name: cuda.device_array((m, n), dtype=out_dtype) for name in variants}
        times = {}
        for name, launch in variants.items():
            times[name] = median_ms(functools.partial(launch, x, weight, outputs[name]), repeats=args.repeats)
        truth = checked_rows(outputs["cublas"])
        for name, milliseconds in times.items():
            actual = checked_rows(outputs[name])
            error = float(np.linalg.norm(actual - truth) / np.linalg.norm(truth))
            seconds = milliseconds * 1e-3
            row = {
                "layer": layer,
                "m": m,
                "n": n,
                "k": k,
                "variant": name,
                "out_dtype": np.dtype(out_dtype).name,
                "median_us": milliseconds * 1e3,
                "tflops": 2 * m * n * k / seconds / 1e12,
                "tbps": (n * k + m * k) * 2 / seconds / 1e12,
                "vs_cublas": times["cublas"] / milliseconds,
                "relative_error_vs_cublas": error,
            }
            rows.append(row)
            print(
                f"{layer:<13} {m:>5} {n:>6} {k:>5} {name:<7} {row['median_us']:>10.1f} {row['tflops']:>8.2f} "
                f"{row['tbps']:>6.2f} {row['vs_cublas']:>9.2f} {error:>8.1e}"
            )

    streamed = []
    print(f"\nM = 1, weights streamed through a CUDA graph ({STREAMED_BYTES >> 20} MB of distinct copies per replay)")
    print(f"{'layer':<13} {'N':>6} {'K':>5} {'gemv TB/s':>10} {'cuBLAS TB/s':>12}")
    for layer, (k, n) in LAYERS.items():
        if layer == "lm_head":
            continue
        weights = streamed_weights(k, n)
        row = {
            "layer": layer,
            "n": n,
            "k": k,
            "gemv_tbps": streamed_tbps(gemv, weights, args.repeats),
            "cublas_tbps": streamed_tbps(cublas_gemm, weights, args.repeats),
        }
        del weights
        streamed.append(row)
        print(f"{layer:<13} {n:>6} {k:>5} {row['gemv_tbps']:>10.2f} {row['cublas_tbps']:>12.2f}")

    variants = sweep(args.repeats) if args.sweep else []
    bars = {
        f"tiled@{SQUARE}^3 >= {TILED_BAR_TFLOPS} TFLOP/s": any(
            r["layer"] == "square" and r["variant"] == "tiled" and r["tflops"] >= TILED_BAR_TFLOPS for r in rows
        ),
        **{
            f"tiled@M={SQUARE} {layer} >= {TILED_BAR_VS_CUBLAS} x cuBLAS": any(
                r["layer"] == layer
                and r["m"] == SQUARE
                and r["variant"] == "tiled"
                and r["vs_cublas"] >= TILED_BAR_VS_CUBLAS
                for r in rows
            )
            for layer in LAYERS
        },
        **{
            f"gemv@M=1 {layer} streamed >= {GEMV_BAR_TBPS} TB/s": any(
                r["layer"] == layer and r["gemv_tbps"] >= GEMV_BAR_TBPS for r in streamed
            )
            for layer in GEMV_BAR_LAYERS
        },
    }
    for name, met in bars.items():
        print(f"bar {name}: {'met' if met else 'MISSED'}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {**result_header(), "bars_met": bars, "results": rows, "streamed_m1": streamed, "sweep": variants}
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
