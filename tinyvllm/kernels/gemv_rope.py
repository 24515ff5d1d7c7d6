"""RoPE and the KV-cache write in the store of the q|k|v product (decode: a few rows of x).

After the attention block's product, `rope.rope_write_kv` reads the q|k|v row back from
memory, turns each pair (x[i], x[i + D/2]) of the query and key heads and writes q and the
cache rows. At batch 1 that kernel's work is tiny; what it costs is a kernel boundary and a
dependent round trip through memory. The GEMV can do the same work as it stores, if each
block owns whole pairs: after its reduction it holds both sums of each pair.

So this GEMV takes W's rows in rotation pairs (`rotation_pairs`): the rows of a block's
group are pairs j = 0, 1, ..., its rows 2j and 2j + 1 being W's rows h D + i and
h D + i + D/2, for pair p = n0 / 2 + j of the product, head h = p // (D/2), i = p % (D/2).
Every row is still read whole, in 16-byte chunks; only which block reads which rows
changes. The epilogue (`store_rope_write_kv`) rounds both sums to bf16, as the unfused path
stores qkv, and then, for x row m:

    query head h:  q[m, h, i], q[m, h, i + D/2]                        = the pair turned
    key head:      k_cache[block, row, h - Hq, i], [..., i + D/2]      = the pair turned
    value head:    v_cache[block, row, h - Hq - Hkv, i], [..., i + D/2] = the pair as it is

with (block, row) from slot_mapping[m] (no cache write for a negative slot or one past the
cache), and the angle float32(position) * inv_freq[i] and its cos and sin computed as
`rope_write_kv` computes them, and the pair turned by the same `rotate_pair`: both paths
store the same bits.
"""

import functools
import math

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels.device.bf16 import bf16_to_f32, f32_to_bf16
from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.gemv import launch
from tinyvllm.kernels.operands import RMSNorm
from tinyvllm.kernels.rope import check_rope_targets, rotate_pair


@functools.cache
def rotation_pairs(head_dim: int):
    """The GEMV's row order for the q|k|v product: each group's rows two by two are the
    pairs RoPE turns together."""
    half = head_dim // 2

    @cuda.jit(device=True, inline=True)
    def weight_row(n0, r):
        pair = n0 // 2 + r // 2
        return (pair // half) * head_dim + pair % half + (r % 2) * half

    return weight_row


# --8<-- [start:epilogue]
@functools.cache
def store_rope_write_kv(head_dim: int, m_rows: int, rows_per_block: int):
    """The epilogue: thread (pair j, x row m) turns its pair and stores it where attention reads it."""
    half = head_dim // 2
    pairs = rows_per_block // 2 * m_rows

    @cuda.jit(device=True, inline=True)
    def epilogue(partials, tid, n0, out):
        q, k_cache, v_cache, positions, inv_freq, slot_mapping = out
        num_q_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
        j = tid // m_rows
        m = tid % m_rows
        pair = n0 // 2 + j
        head = pair // half
        i = pair % half
        if tid >= pairs or head >= num_q_heads + 2 * num_kv_heads:
            return
        a = bf16_to_f32(f32_to_bf16(partials[2 * j * m_rows + m, 0]))
        b = bf16_to_f32(f32_to_bf16(partials[(2 * j + 1) * m_rows + m, 0]))
        if head < num_q_heads:
            destination = q[m, head]
        else:
            num_blocks, block_size = k_cache.shape[0], k_cache.shape[1]
            slot = slot_mapping[m]
            if slot < 0 or slot >= num_blocks * block_size:
                return
            block = slot // block_size
            row = slot - block * block_size
            if head >= num_q_heads + num_kv_heads:
                value = v_cache[block, row, head - num_q_heads - num_kv_heads]
                value[i] = f32_to_bf16(a)
                value[i + half] = f32_to_bf16(b)
                return
            destination = k_cache[block, row, head - num_q_heads]
        angle = float32(positions[m]) * inv_freq[i]
        cos = math.cos(angle)
        sin = math.sin(angle)
        turned_a, turned_b = rotate_pair(a, b, cos, sin)
        destination[i] = f32_to_bf16(turned_a)
        destination[i + half] = f32_to_bf16(turned_b)

    return epilogue


# --8<-- [end:epilogue]


def gemv_rope_write_kv(
    x, weight, positions, inv_freq, slot_mapping, q, k_cache, v_cache, *, norm: RMSNorm | None = None, stream=0
) -> None:
    """What `rope.rope_write_kv` writes for qkv = x[M, K] @ weight[N, K]^T, in one pass over
    weight and without storing qkv (M <= gemv_shape.MAX_ROWS); `norm` as in `gemv.gemv`."""
    m, k = check_array("x", x, np.uint16, (None, None))
    width, _ = check_array("weight", weight, np.uint16, (None, k))
    _, _, head_dim = check_rope_targets(m, width, positions, inv_freq, slot_mapping, q, k_cache, v_cache, "weight")
    if min(m, width, k) == 0:
        raise ValueError(f"linear: empty operand (M={m}, N={width}, K={k})")
    out = (q, k_cache, v_cache, positions, inv_freq, slot_mapping)
    launch(
        x,
        weight,
        out,
        functools.partial(store_rope_write_kv, head_dim),
        rotation_pairs(head_dim),
        norm=norm,
        stream=stream,
    )
