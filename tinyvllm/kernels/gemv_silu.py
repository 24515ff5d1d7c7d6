"""SwiGLU in the store of the gate|up product (decode: a few rows of x).

The MLP's gate|up weight interleaves its rows (gate row j, then up row j:
`activation.py`), so the GEMV's blocks (`gemv.py`) own whole (gate, up) pairs of rows, and
after the reduction the block holds both factors of each output it owns. It stores
silu(gate) * up instead of the two sums: the activation's own kernel, and the round trip
of the 2I-wide product through device memory, drop out of the step. The sums are rounded
to bf16 first, as the unfused path stores them, so that both paths give the same bits.
RoPE and the KV write go into the q|k|v product's store the same way (`gemv_rope.py`),
with the rows of W taken in RoPE's pairs (the kernel's `weight_row`).
"""

import functools

import numpy as np
from numba import cuda

from tinyvllm.kernels.activation import silu_times
from tinyvllm.kernels.device.bf16 import bf16_to_f32, f32_to_bf16
from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.gemm_stores import store_bf16
from tinyvllm.kernels.gemv import launch
from tinyvllm.kernels.operands import RMSNorm


@functools.cache
def store_silu_mul(m_rows: int, rows_per_block: int):
    """SwiGLU's epilogue: rows 2j and 2j + 1 of a group are a (gate, up) pair; thread
    (pair, m) stores silu(gate) * up, both sums rounded to bf16 first as the unfused path
    stores them."""
    pairs = rows_per_block // 2 * m_rows

    @cuda.jit(device=True, inline=True)
    def epilogue(partials, tid, n0, out):
        pair = tid // m_rows
        m = tid % m_rows
        row = n0 // 2 + pair
        if tid < pairs and row < out.shape[1]:
            gate = bf16_to_f32(f32_to_bf16(partials[2 * pair * m_rows + m, 0]))
            up = bf16_to_f32(f32_to_bf16(partials[(2 * pair + 1) * m_rows + m, 0]))
            store_bf16(out, m, row, silu_times(gate, up))

    return epilogue


def gemv_silu_mul(x, weight, out, *, norm: RMSNorm | None = None, stream=0) -> None:
    """out[M, I] = silu(gate) * up of x[M, K] @ weight[2I, K]^T, whose rows interleave gate and up.

    One pass over weight, as `gemv` (and `norm` as there); out is bf16.
    """
    m, k = check_array("x", x, np.uint16, (None, None))
    _, intermediate = check_array("out", out, np.uint16, (m, None))
    check_array("weight", weight, np.uint16, (2 * intermediate, k))
    if min(m, intermediate, k) == 0:
        raise ValueError(f"linear: empty operand (M={m}, I={intermediate}, K={k})")
    launch(x, weight, out, store_silu_mul, norm=norm, stream=stream)
