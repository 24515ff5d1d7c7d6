"""A tensor-core GEMM for decode-sized M, against cuBLAS: Y[M, N] = X[M, K] @ W[N, K]^T.

    python -m perf.experiments.skinny_gemm [--repeats 50]                      (GPU)
    NUMBA_ENABLE_CUDASIM=1 python -m perf.experiments.skinny_gemm --check      (CPU)

At M <= 128 a linear layer is bound by reading W once, but cuBLAS tiles it for M: with
N = 2048 it launches a few dozen CTAs that each stream a long K (1.0-1.8 TB/s). Here a CTA
computes Y[0:BM, n0:n0 + block_n] over one K-range: BM = 16 tiles_m >= M (compiled per
tiles_m; X's rows past M zero-filled, Y's never written), grid (N / block_n, split). Its
warps take 16 columns each (two n8 mma tiles) and the same K: a K split across warps would
need a shared-memory reduction that the grid split makes unnecessary. The timed splits
give from half a CTA to four CTAs an SM (`splits`). With split = 1 a CTA stores rounded bf16
pairs; else its float32 part goes to workspace[z] and `reduce_parts` adds the parts in the
order z = 0, 1, .. (deterministic) and rounds: a second launch, which under PDL (as in the
engine's graphs) starts while the first drains. Float32 atomics would save it but not be
deterministic; the last CTA of a column summing every part would serialize split x BM x
block_n reads in one CTA. The parts cost 4 split M / K bytes of L2 traffic (written, then
read) per weight byte, so split stays small.

`stages` slices of X[BM, block_k] and W[block_n, block_k] sit in dynamic shared memory, filled
by cp.async as in kernels/gemm.py (wait for slice s, one barrier, issue s + stages - 1,
multiply s): stages - 1 slices of W, 8 or 16 KB each, in flight a CTA, and smem for 2 to 4
CTAs an SM (32 KB or more of W in flight an SM from 2 CTAs up). No kernel writes W, so
its first stages are issued before `wait_for_prior_grid` (pdl.py) and overlap the kernel
ahead. X's re-reads from L2 are M / block_n of W's bytes: a config runs for M <= block_n.

Fragments (mma.py): 16-byte chunk c of slice row r is stored at slot c ^ (r % 8) (`chunk_slot`,
mask 7; rows of 128 or 256 bytes), so the 8 rows an ldmatrix phase reads fall in 8 different
bank groups. Lane L (matrix j = L // 8) names a row with r % 8 = L % 8, for 16 of K kk:
  X (A, m16k16): row 16 mi + L % 8 + 8 (j % 2), chunk 2 kk + j // 2 -> a0..a3 of mma row mi;
  W (B^T, [n, k]): row 16 w + 16 p + L % 8 + 8 (j // 2), chunk 2 kk + j % 2 -> b0, b1 of n8
  tiles 2p (j = 0, 1) and 2p + 1 (j = 2, 3) of warp w; accumulator (mi, ni, 2h + e) is
  Y[16 mi + 8h + L // 4, n0 + 16 w + 8 ni + 2 (L % 4) + e].

`--check`: tiny shapes in the simulator against float32 NumPy, outputs poisoned with NaN first.
The GPU run times each config and split on Llama 3.2 1B's decode products as a decode step
sees a call (a CUDA graph of calls over 512 MB of distinct copies of W, so W comes from HBM;
the Numba kernels with PDL), and cuBLAS so too; JSON to perf/results/experiments/skinny_gemm.json.
"""

import argparse
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path

import numba
import numpy as np
from numba import cuda, float32, uint16

from tinyvllm.kernels.device import mma
from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.launch import launch_kernel
from tinyvllm.kernels.device.multiprocessors import multiprocessor_count
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.simulator import SHARED_ALIGNMENT, SIMULATOR, launch_bounds
from tinyvllm.kernels.device.vector_io import VECTOR, check_rows_of_eight
from tinyvllm.kernels.gemm_multiply import mma_into
from tinyvllm.kernels.gemm_tiles import STATIC_SHARED_BYTES, allow_dynamic_shared, chunk_slot_device
from tinyvllm.kernels.reference import from_bf16, to_bf16

MAX_ROWS, WARP_N, REDUCE_THREADS = 128, 16, 256
SWIZZLE = 7
"""chunk_slot's mask: chunk c of row r at slot c ^ (r % 8)."""
SHAPES = {"qkv_proj": (3072, 2048), "o_proj": (2048, 2048), "gate|up_proj": (16384, 2048), "down_proj": (2048, 8192)}
"""Llama 3.2 1B's decode products: N, K."""
ROWS, NUMPY_ROWS = (8, 16, 32, 64, 128), 16
"""The M timed, and the one whose outputs are also checked against float32 NumPy."""
CHECK_N, CHECK_K, ERROR_BAR = 128, 512, 1e-2
RESULTS = Path(__file__).resolve().parents[1] / "results" / "experiments" / "skinny_gemm.json"


@dataclasses.dataclass(frozen=True)
class Skinny:
    """block_n columns a CTA (a warp per 16), K staged block_k at a time in `stages` slices;
    timed for M <= block_n (X's L2 re-reads at most W's bytes)."""

    block_n: int
    block_k: int
    stages: int

    @property
    def threads(self) -> int:
        return mma.WARP * self.block_n // WARP_N

    def shared_bytes(self, tiles_m: int) -> int:
        return 2 * self.stages * (mma.MMA_M * tiles_m + self.block_n) * self.block_k


CONFIGS = {
    "n32k128s4": Skinny(block_n=32, block_k=128, stages=4),
    "n64k64s4": Skinny(block_n=64, block_k=64, stages=4),
    "n128k64s3": Skinny(block_n=128, block_k=64, stages=3),
}
CHECK_CASES = [(3, "n32k128s4", 1), (3, "n64k64s4", 4), (3, "n128k64s3", 2), (16, "n32k128s4", 2)]
CHECK_CASES += [(16, "n64k64s4", 1), (16, "n128k64s3", 1), (40, "n32k128s4", 4)]
"""(M, config, split) for --check: rows past M within and past an mma tile, every config,
split 1 (stages refilled in turn) and the parts' reduction."""


@cuda.jit(device=True, inline=True)
def store_part(out, z, row, col, low, high):
    out[z, row, col] = low
    out[z, row, col + 1] = high


@cuda.jit(device=True, inline=True)
def store_pair(out, z, row, col, low, high):
    out[row, col >> 1] = mma.bf16x2(low, high)


@functools.cache
def skinny_kernel(config: Skinny, tiles_m: int, partial: bool):
    """The kernel for one config and 16 tiles_m rows of X; it stores float32 parts into
    out[split, M, N] if `partial`, else bf16 pairs into out[M, N / 2] (uint32)."""
    block_n, block_k, stages, threads = config.block_n, config.block_k, config.stages, config.threads
    tiles_n, chunks, k16s, pending = WARP_N // mma.MMA_N, block_k // VECTOR, block_k // mma.MMA_K, stages - 2
    stage_a, stage_b, row_tile = mma.MMA_M * tiles_m * block_k, block_n * block_k, mma.MMA_M * block_k
    a_chunks, b_chunks, b_start = mma.MMA_M * tiles_m * chunks, block_n * chunks, stages * stage_a
    store = store_part if partial else store_pair

    @cuda.jit(device=True, inline=True)
    def stage_w(tiles, stage, weight, n0, k0, tid):
        for c in range(tid, b_chunks, threads):
            row, chunk = c // chunks, c % chunks
            offset = b_start + stage * stage_b + row * block_k + VECTOR * chunk_slot_device(row, chunk, 0, SWIZZLE)
            mma.cp_async_16(tiles, offset, weight[n0 + row], k0 + VECTOR * chunk)

    @cuda.jit(device=True, inline=True)
    def stage_x(tiles, stage, x, k0, tid):
        for c in range(tid, a_chunks, threads):
            row, chunk = c // chunks, c % chunks
            offset = stage * stage_a + row * block_k + VECTOR * chunk_slot_device(row, chunk, 0, SWIZZLE)
            # a row past M is 16 zero bytes, but the source named must still be a real row
            mma.cp_async_16_zfill(tiles, offset, x[min(row, x.shape[0] - 1)], k0 + VECTOR * chunk, row < x.shape[0])

    @cuda.jit(**launch_bounds(threads, 2))
    def skinny(x, weight, out):
        allow_dependent_launch()
        tiles = cuda.shared.array(0, uint16, alignment=SHARED_ALIGNMENT)
        acc = cuda.local.array((tiles_m, tiles_n, 4), float32)
        for mi in range(tiles_m):
            for ni in range(tiles_n):
                for r in range(4):
                    acc[mi, ni, r] = float32(0.0)
        b = cuda.local.array((tiles_n, 2), np.uint32)
        tid = np.uint32(cuda.threadIdx.x)  # unsigned: Numba adds wraparound code for signed indices
        warp, lane = tid // mma.WARP, tid % mma.WARP
        n0, z = np.uint32(cuda.blockIdx.x) * block_n, np.uint32(cuda.blockIdx.y)
        k_part = x.shape[1] // cuda.gridDim.y
        k_first, steps = z * k_part, k_part // block_k

        # no kernel writes W: its first stages load before the wait on the kernel ahead
        for s in range(stages - 1):
            if s < steps:
                stage_w(tiles, s, weight, n0, k_first + s * block_k, tid)
        wait_for_prior_grid()
        for s in range(stages - 1):
            if s < steps:
                stage_x(tiles, s, x, k_first + s * block_k, tid)
            mma.cp_async_commit()  # empty groups too, as the wait counts groups (all of W's above: group 0)

        matrix, swizzle = lane // 8, lane % 8
        a_lane = (swizzle + 8 * (matrix % 2)) * block_k
        b_lane = b_start + (warp * WARP_N + swizzle + 8 * (matrix // 2)) * block_k
        for step in range(steps):
            mma.cp_async_wait(pending)
            cuda.syncthreads()  # slice `step` is in, and no warp still reads the stage refilled next
            ahead = step + stages - 1
            if ahead < steps:
                stage_w(tiles, ahead % stages, weight, n0, k_first + ahead * block_k, tid)
                stage_x(tiles, ahead % stages, x, k_first + ahead * block_k, tid)
            mma.cp_async_commit()
            a_base, b_base = (step % stages) * stage_a + a_lane, (step % stages) * stage_b + b_lane
            for kk in range(k16s):
                a_slot, b_slot = VECTOR * ((2 * kk + matrix // 2) ^ swizzle), VECTOR * ((2 * kk + matrix % 2) ^ swizzle)
                for p in range(tiles_n // 2):
                    b0, b1, b2, b3 = mma.ldmatrix_x4(tiles, b_base + p * row_tile + b_slot)
                    b[2 * p, 0], b[2 * p, 1], b[2 * p + 1, 0], b[2 * p + 1, 1] = b0, b1, b2, b3
                for mi in range(tiles_m):
                    a = mma.ldmatrix_x4(tiles, a_base + mi * row_tile + a_slot)
                    for ni in range(tiles_n):
                        mma_into(acc, mi, ni, a, b[ni, 0], b[ni, 1])

        g, t = lane // 4, lane % 4
        for mi in range(tiles_m):
            for half in range(2):
                row = mi * mma.MMA_M + 8 * half + g
                if row < x.shape[0]:
                    for ni in range(tiles_n):
                        col = n0 + warp * WARP_N + ni * mma.MMA_N + 2 * t
                        store(out, z, row, col, acc[mi, ni, 2 * half], acc[mi, ni, 2 * half + 1])

    return skinny


@cuda.jit
def reduce_parts(parts, out):
    """out[m, j] = the bf16 pair of the sum over z (in order) of parts[z, m, 2 j : 2 j + 2]."""
    allow_dependent_launch()
    wait_for_prior_grid()
    pairs = out.shape[1]
    for i in range(cuda.grid(1), out.shape[0] * pairs, cuda.gridsize(1)):
        row, pair = i // pairs, i % pairs
        low, high = float32(0.0), float32(0.0)
        for z in range(parts.shape[0]):
            low += parts[z, row, 2 * pair]
            high += parts[z, row, 2 * pair + 1]
        out[row, pair] = mma.bf16x2(low, high)


def skinny_gemm(x, weight, out, *, config: Skinny, split: int = 1, workspace=None, stream=0) -> None:
    """out[M, N] = x[M, K] @ weight[N, K]^T (bf16) for M <= MAX_ROWS, K cut into `split` parts
    (split > 1: a float32 workspace[split, M, N] holds them)."""
    m, k = check_rows_of_eight("x", x, (None, None))  # cp.async moves aligned 16 bytes
    n, _ = check_rows_of_eight("weight", weight, (None, k))
    check_array("out", out, np.uint16, (m, n))
    if not 0 < m <= MAX_ROWS or n % config.block_n or k % (split * config.block_k):
        raise ValueError(f"skinny_gemm: M={m} <= {MAX_ROWS}, N={n} % {config.block_n}, K={k} % {split} x block_k")
    tiles_m, pairs = -(-m // mma.MMA_M), out.view(np.uint32)
    if split > 1:
        check_array("workspace", workspace, np.float32, (split, m, n))
    target = workspace if split > 1 else pairs
    kernel, nbytes = skinny_kernel(config, tiles_m, split > 1), config.shared_bytes(tiles_m)
    if nbytes > STATIC_SHARED_BYTES and not SIMULATOR:
        allow_dynamic_shared(kernel, tuple(numba.typeof(a) for a in (x, weight, target)), nbytes)
    launch_kernel(kernel, (n // config.block_n, split), config.threads, stream, x, weight, target, shared_bytes=nbytes)
    if split > 1:
        blocks = min(-(-m * n // 2 // REDUCE_THREADS), 2 * multiprocessor_count())
        launch_kernel(reduce_parts, blocks, REDUCE_THREADS, stream, workspace, pairs)


def splits(config: Skinny, n: int, k: int) -> list[int]:
    """The K splits timed: the least power of two whose grid covers the SMs, half and twice it."""
    fill = 1
    while n // config.block_n * fill < multiprocessor_count():
        fill *= 2
    return [s for s in (fill // 2, fill, 2 * fill) if s >= 1 and k % (s * config.block_k) == 0]


def check() -> bool:
    """CHECK_CASES in the simulator against float32 NumPy."""
    from perf.experiments.gemm_variants import poison, relative_error

    rng = np.random.default_rng(0)
    weight = to_bf16(rng.uniform(-2.0, 2.0, (CHECK_N, CHECK_K)).astype(np.float32))
    passed = True
    for m, name, split in CHECK_CASES:
        x = to_bf16(rng.uniform(-2.0, 2.0, (m, CHECK_K)).astype(np.float32))
        out, workspace = cuda.device_array((m, CHECK_N), np.uint16), cuda.device_array((split, m, CHECK_N), np.float32)
        poison(out)
        poison(workspace)
        started = time.perf_counter()
        skinny_gemm(
            cuda.to_device(x), cuda.to_device(weight), out, config=CONFIGS[name], split=split, workspace=workspace
        )
        error = relative_error(from_bf16(out.copy_to_host()), from_bf16(x) @ from_bf16(weight).T)
        passed &= error < ERROR_BAR
        verdict = "ok" if error < ERROR_BAR else "WRONG"
        print(f"M={m:>3} N={CHECK_N} K={CHECK_K} {name:<10} split {split}: relative error {error:.1e} {verdict} "
              f"({time.perf_counter() - started:.0f} s)")  # fmt: skip
    return passed


def variants(n: int, k: int, m: int) -> list[tuple]:
    """(config name, split, launch): cuBLAS, then every config and split timed at this M."""
    from tinyvllm.kernels.cublas import cublas_gemm

    found = [("cublas", 1, cublas_gemm)]
    for name, config in CONFIGS.items():
        for split in splits(config, n, k) if m <= config.block_n else ():
            workspace = cuda.device_array((split, m, n), np.float32)
            found.append((name, split, functools.partial(skinny_gemm, config=config, split=split, workspace=workspace)))
    return found


def measure(repeats: int) -> list[dict]:
    """A row per (layer, M, cuBLAS or config and split); errors on the first copy of W against
    cuBLAS's output and, at M = NUMPY_ROWS, float32 NumPy's."""
    from perf.bench_gemm import streamed_ms, streamed_weights
    from perf.experiments.gemm_variants import poison, relative_error
    from perf.timing import random_bf16

    rows = []
    print(f"{'layer':<13} {'M':>4} {'config':<10} {'split':>5} {'us':>8} {'TB/s':>6} {'vs cuBLAS':>9} "
          f"{'err/cuBLAS':>10} {'err/f32':>8} {'regs':>4}")  # fmt: skip
    for layer, (n, k) in SHAPES.items():
        weights = streamed_weights(k, n)
        for m in ROWS:
            x, out = random_bf16(m, k), cuda.device_array((m, n), np.uint16)
            exact = from_bf16(x.copy_to_host()) @ from_bf16(weights[0].copy_to_host()).T if m == NUMPY_ROWS else None
            truth = cublas_us = None
            for name, split, launch in variants(n, k, m):
                poison(out)
                launch(x, weights[0], out)
                actual = from_bf16(out.copy_to_host())
                truth = actual if truth is None else truth  # cuBLAS's, the first
                us = streamed_ms(launch, x, weights, out, repeats) * 1e3  # a graph over the copies of W
                cublas_us = cublas_us or us
                compiled = None
                if name != "cublas":
                    kernel = skinny_kernel(CONFIGS[name], -(-m // mma.MMA_M), split > 1)
                    compiled = next(iter(kernel.overloads.values()))
                f32 = None if exact is None else relative_error(actual, exact)
                row = {"layer": layer, "m": m, "n": n, "k": k, "config": name, "split": split, "median_us": us,
                       "weight_tbps": n * k * 2 / us / 1e6, "vs_cublas": cublas_us / us,
                       "error_vs_cublas": relative_error(actual, truth), "error_vs_f32": f32,
                       "registers": getattr(compiled, "regs_per_thread", None),
                       "local_bytes": getattr(compiled, "local_mem_per_thread", None)}  # fmt: skip
                rows.append(row)
                print(f"{layer:<13} {m:>4} {name:<10} {split:>5} {us:>8.2f} {row['weight_tbps']:>6.2f} "
                      f"{row['vs_cublas']:>9.2f} {row['error_vs_cublas']:>10.1e} "
                      f"{'-' if f32 is None else f'{f32:.1e}':>8} {row['registers'] or '-':>4}")  # fmt: skip
        del weights
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--check", action="store_true", help="tiny shapes against NumPy (runs in the simulator)")
    args = parser.parse_args()
    if args.check:
        if SIMULATOR:
            sys.setswitchinterval(5e-5)  # as tests/conftest.py: the simulated threads get the GIL sooner
        if not check():
            raise SystemExit("skinny_gemm: wrong output")
        return
    if SIMULATOR:
        raise SystemExit("the timed run needs a CUDA GPU: under the simulator only --check runs")
    from perf.timing import result_header

    started = time.perf_counter()
    rows = measure(args.repeats)
    print("\nfastest correct config / cuBLAS, per layer and M:")
    for layer, m in dict.fromkeys((r["layer"], r["m"]) for r in rows):
        mine = [r for r in rows if (r["layer"], r["m"]) == (layer, m) and r["config"] != "cublas"]
        best = max((r for r in mine if r["error_vs_cublas"] < ERROR_BAR), key=lambda r: r["vs_cublas"], default=None)
        if best is None:
            print(f"{layer:<13} M={m:>4}: none correct")
        else:
            print(f"{layer:<13} M={m:>4}: {best['vs_cublas']:.2f}x ({best['config']} split {best['split']}, "
                  f"{best['weight_tbps']:.2f} TB/s)")  # fmt: skip
    print(f"{time.perf_counter() - started:.0f} s in all")
    configs = {name: dataclasses.asdict(config) for name, config in CONFIGS.items()}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({**result_header(), "configs": configs, "results": rows}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
