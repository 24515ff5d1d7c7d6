"""SwiGLU's activation: silu(gate) * up.

    out[t, j] = silu(gate_up[t, 2j]) * gate_up[t, 2j + 1],    silu(g) = g / (1 + exp(-g))

The engine computes the gate and up projections as one GEMM against the two weight
matrices with their rows interleaved (gate row j, then up row j), so its output holds
each output's gate and up side by side on the last axis, 2I wide. The interleaving is
what lets the batch-1 GEMV fuse this activation into its store (`gemv_silu.gemv_silu_mul`):
a block's rows come in (gate, up) pairs, so each block holds both factors of the outputs
it owns. This kernel is the unfused path, after cuBLAS or the tiled GEMM.

Three bytes move for every FLOP or so: the kernel is bandwidth-bound. Each thread owns
eight consecutive outputs: two 16-byte loads (their eight gate/up pairs), float32 math,
one 16-byte store, and the grid covers the whole [T, I] output once, so every thread has
its loads in flight together.
"""

import math

from numba import cuda, float32

from tinyvllm.kernels.device.launch import launch_kernel
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.vector_io import (
    VECTOR,
    check_rows_of_eight,
    load_bf16x8,
    store_bf16x8,
)

THREADS = 256
EXP_LIMIT = float32(88.0)


@cuda.jit(device=True, inline=True)
def silu_times(gate, up):
    """silu(gate) * up in float32.

    exp(88) is near float32's largest value, so -g is clamped there: for g below -88 this
    gives g * up / (1 + e^88) rather than silu(g) * up, both under 1e-38 |g * up| (and the
    clamp keeps the simulator's math.exp, which raises on overflow, finite too).
    """
    return gate / (float32(1.0) + math.exp(min(-gate, EXP_LIMIT))) * up


# --8<-- [start:kernel]
@cuda.jit
def _silu_mul_kernel(gate_up, out):
    allow_dependent_launch()
    wait_for_prior_grid()
    vectors_per_row = out.shape[1] // VECTOR
    vector = cuda.grid(1)
    if vector >= out.shape[0] * vectors_per_row:
        return
    row = vector // vectors_per_row
    column = (vector - row * vectors_per_row) * VECTOR
    first_pairs = cuda.local.array(VECTOR, float32)
    last_pairs = cuda.local.array(VECTOR, float32)
    load_bf16x8(gate_up[row], 2 * column, first_pairs)
    load_bf16x8(gate_up[row], 2 * column + VECTOR, last_pairs)
    result = cuda.local.array(VECTOR, float32)
    half = VECTOR // 2
    for i in range(half):
        result[i] = silu_times(first_pairs[2 * i], first_pairs[2 * i + 1])
        result[half + i] = silu_times(last_pairs[2 * i], last_pairs[2 * i + 1])
    store_bf16x8(out[row], column, result)


# --8<-- [end:kernel]


def silu_mul(gate_up, out, *, stream=0) -> None:
    """out = silu(gate) * up for gate_up of shape [T, 2I] (pairs interleaved) and out of shape [T, I]."""
    num_tokens, intermediate = check_rows_of_eight("out", out, (None, None))
    check_rows_of_eight("gate_up", gate_up, (num_tokens, 2 * intermediate))
    vectors = num_tokens * intermediate // VECTOR
    if vectors == 0:
        return
    launch_kernel(_silu_mul_kernel, -(-vectors // THREADS), THREADS, stream, gate_up, out)
