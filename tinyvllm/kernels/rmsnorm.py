"""RMSNorm: each row scaled to unit root mean square, then by a learned gain.

    out[t, :] = x[t, :] / sqrt(mean_j(x[t, j]^2) + eps) * weight

Every Llama block normalises the residual stream twice, and the LM head reads it normed
once more. Each norm travels with the product that reads it (`RMSNorm`, the `norm`
argument of the linear operators): at a few rows of x the GEMV applies it as it
multiplies (`gemv.py`), and otherwise this kernel writes the normed rows first.

One block per row. Each thread owns up to VECTORS_PER_THREAD chunks of eight values,
chunk j = thread + k * blockDim: it loads them all with 16-byte loads (many bytes in
flight, the row never re-read) and keeps them in registers as packed bf16 pairs, half
the registers float32 would take, so more blocks fit on an SM. It adds its squares in
float32, the block sums the partials (`reduce.block_sum`), and each thread scales its own
chunks by 1/rms and the weight and stores them. The block is the smallest power of two
(at least one warp) that covers the row.
"""

import math

import numpy as np
from numba import cuda, float32, uint32

from tinyvllm.kernels.device.checks import check_positive
from tinyvllm.kernels.device.launch import launch_kernel
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.reduce import WARP, block_sum
from tinyvllm.kernels.device.vector_io import (
    VECTOR,
    check_rows_of_eight,
    high_half,
    load_words,
    low_half,
    pack_pair,
    store_words,
)
from tinyvllm.kernels.operands import RMSNorm

VECTORS_PER_THREAD = 4
MAX_THREADS = 1024
MAX_HIDDEN = MAX_THREADS * VECTORS_PER_THREAD * VECTOR


@cuda.jit(device=True, inline=True)
def _load_row(row, words):
    """This thread's chunks of a row into words[k, 0:4] as bf16 pairs (zeros past its end)."""
    for k in range(VECTORS_PER_THREAD):
        column = (cuda.threadIdx.x + k * cuda.blockDim.x) * VECTOR
        if column < row.shape[0]:
            words[k, 0], words[k, 1], words[k, 2], words[k, 3] = load_words(row, column)
        else:
            for j in range(4):
                words[k, j] = uint32(0)


# --8<-- [start:normalize]
@cuda.jit(device=True, inline=True)
def _normalize_and_store(words, gains, eps, out_row):
    """words, gains: this thread's chunks of the row and of the weight (`_load_row`).

    out_row = row / rms(row) * weight, the sum of squares taken over the whole block.
    """
    scratch = cuda.shared.array(MAX_THREADS, float32)
    hidden = out_row.shape[0]
    squares = float32(0.0)
    for k in range(VECTORS_PER_THREAD):
        for j in range(4):
            low, high = low_half(words[k, j]), high_half(words[k, j])
            squares += low * low + high * high
    scale = float32(1.0) / math.sqrt(block_sum(squares, scratch) / float32(hidden) + eps)
    for k in range(VECTORS_PER_THREAD):
        column = (cuda.threadIdx.x + k * cuda.blockDim.x) * VECTOR
        if column < hidden:
            g0, g1, g2, g3 = gains[k, 0], gains[k, 1], gains[k, 2], gains[k, 3]
            w0, w1, w2, w3 = words[k, 0], words[k, 1], words[k, 2], words[k, 3]
            normalized = (
                pack_pair(low_half(w0) * scale * low_half(g0), high_half(w0) * scale * high_half(g0)),
                pack_pair(low_half(w1) * scale * low_half(g1), high_half(w1) * scale * high_half(g1)),
                pack_pair(low_half(w2) * scale * low_half(g2), high_half(w2) * scale * high_half(g2)),
                pack_pair(low_half(w3) * scale * low_half(g3), high_half(w3) * scale * high_half(g3)),
            )
            store_words(out_row, column, normalized)


# --8<-- [end:normalize]


# The weight is loaded first: no kernel writes it, so its loads go out before the wait for
# the kernel ahead (`pdl`), and in any case before the block-wide sum's barriers, which
# the compiler may not move a load past.
# --8<-- [start:kernel]
@cuda.jit
def _rmsnorm_kernel(x, weight, eps, out):
    allow_dependent_launch()
    gains = cuda.local.array((VECTORS_PER_THREAD, 4), uint32)
    _load_row(weight, gains)
    wait_for_prior_grid()
    words = cuda.local.array((VECTORS_PER_THREAD, 4), uint32)
    _load_row(x[cuda.blockIdx.x], words)
    _normalize_and_store(words, gains, eps, out[cuda.blockIdx.x])


# --8<-- [end:kernel]


def _threads_for(hidden: int) -> int:
    """The smallest power of two, at least a warp, whose threads cover the row."""
    threads_needed = -(-hidden // (VECTORS_PER_THREAD * VECTOR))
    return max(WARP, 1 << (threads_needed - 1).bit_length())


def check_norm(x, norm: RMSNorm, normed_name: str = "normed") -> tuple[int, int]:
    """Validate the norm of x's rows (x, norm.weight and norm.normed, named normed_name in
    errors, bf16 with rows of eight; eps positive); return (T, hidden)."""
    num_tokens, hidden = check_rows_of_eight("x", x, (None, None))
    check_rows_of_eight("weight", norm.weight, (hidden,))
    check_rows_of_eight(normed_name, norm.normed, (num_tokens, hidden))
    check_positive("eps", norm.eps)
    return num_tokens, hidden


# --8<-- [start:launcher]
def rmsnorm(x, weight, eps: float, out, *, out_name: str = "out", stream=0) -> None:
    """out = rmsnorm(x) * weight (out named out_name in errors)."""
    num_tokens, hidden = check_norm(x, RMSNorm(weight, eps, out), out_name)
    if hidden > MAX_HIDDEN:
        raise ValueError(f"x: hidden size {hidden} exceeds the kernel's maximum {MAX_HIDDEN}")
    if num_tokens == 0:
        return
    launch_kernel(_rmsnorm_kernel, num_tokens, _threads_for(hidden), stream, x, weight, np.float32(eps), out)


# --8<-- [end:launcher]
