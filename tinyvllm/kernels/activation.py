"""SwiGLU's activation: silu(gate) * up.

    out[t, j] = silu(gate_up[t, j]) * gate_up[t, I + j],    silu(g) = g / (1 + exp(-g))

The engine computes the gate and up projections as one GEMM against the two weight
matrices stacked, so its output is [gate | up] on the last axis, 2I wide. This kernel
reads both halves and writes the I-wide product.

Three bytes move for every FLOP or so: the kernel is bandwidth-bound. Each thread owns
eight consecutive outputs: two 16-byte loads (gate and up), float32 math, one 16-byte
store, and the grid covers the whole [T, I] output once, so every thread has its loads
in flight together.
"""

import math

from numba import cuda, float32

from tinyvllm.kernels.vector_io import VECTOR, check_rows_of_eight, load_bf16x8, store_bf16x8

THREADS = 256
EXP_LIMIT = float32(88.0)


# --8<-- [start:kernel]
@cuda.jit
def _silu_mul_kernel(gate_up, out):
    intermediate = out.shape[1]
    vectors_per_row = intermediate // VECTOR
    vector = cuda.grid(1)
    if vector >= out.shape[0] * vectors_per_row:
        return
    row = vector // vectors_per_row
    column = (vector - row * vectors_per_row) * VECTOR
    gate = cuda.local.array(VECTOR, float32)
    up = cuda.local.array(VECTOR, float32)
    load_bf16x8(gate_up[row], column, gate)
    load_bf16x8(gate_up[row], intermediate + column, up)
    for i in range(VECTOR):
        # exp(88) is near float32's largest value; past it silu(g) is 0 in bf16 anyway, and
        # the clamp keeps the simulator's math.exp (which raises on overflow) finite too.
        gate[i] = gate[i] / (float32(1.0) + math.exp(min(-gate[i], EXP_LIMIT))) * up[i]
    store_bf16x8(out[row], column, gate)
# --8<-- [end:kernel]


def silu_mul(gate_up, out, *, stream=0) -> None:
    """out = silu(gate) * up for gate_up = [gate | up] of shape [T, 2I] and out of shape [T, I]."""
    num_tokens, intermediate = check_rows_of_eight("out", out, (None, None))
    check_rows_of_eight("gate_up", gate_up, (num_tokens, 2 * intermediate))
    vectors = num_tokens * intermediate // VECTOR
    if vectors == 0:
        return
    _silu_mul_kernel[-(-vectors // THREADS), THREADS, stream](gate_up, out)
