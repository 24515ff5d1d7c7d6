"""Rotary position embedding (RoPE) and the KV-cache write, fused: one pass over q, k, v.

The attention block's projections are one matrix product whose output row holds a token's
Hq query heads, then its Hkv key heads, then its Hkv value heads, each of size D:

    qkv[t] = [q_0 .. q_{Hq-1} | k_0 .. k_{Hkv-1} | v_0 .. v_{Hkv-1}]

This kernel reads that row once and writes each part where attention reads it: the
rotated query heads to q [T, Hq, D], the rotated key heads and the value heads to the
paged cache row of the token's slot (`slot = block * block_size + row`):

    q[t]                                   = rope(q part, positions[t])
    k_cache[s // BS, s % BS], v_cache[...] = rope(k part, positions[t]), v part    (s = slot_mapping[t])

A negative slot marks a padding token (a CUDA-graph batch padded up to its captured size):
its q is still written, the cache is not. A slot past the end of the cache would be a
scheduler bug; it is skipped too, so the kernel never writes outside the cache.

RoPE uses HF's rotate-half layout: each head vector of size D is read as D/2 planar pairs
(x[i], x[i + D/2]), and pair i turns by the angle p * inv_freq[i] for a token at position p:

    x[i]       <- x[i] cos - x[i + D/2] sin
    x[i + D/2] <- x[i + D/2] cos + x[i] sin

(HF's `q * cos + rotate_half(q) * sin`). The angle is computed as HF computes it: the
position as float32 times the float32 inverse frequency, a float32 product, then cos and
sin in float32. The rotation itself is done in float32 and rounded to bf16 once, each
output as one fused multiply-add over one rounded product (`rotate_pair`), so that the GEMV
that does the same work in its store (`gemv_rope.py`) gives the very same bits.

The inverse frequencies are host work, done once per model (`tinyvllm.model.rope`).

One block per token. Its threads first fill a shared table of the D/2 cos and sin values
(one pair each, so no thread computes more than a few), then thread (x, y) takes pairs
8x .. 8x + 7 of head rows y, y + blockDim.y, ... of the token's qkv row: it rotates a q or
k head, or copies a v head, with one 16-byte load and store of each half. D must be a
multiple of 16 so that both halves are aligned.
"""

import math

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.launch import launch_kernel
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.vector_io import (
    VECTOR,
    check_rows_of_eight,
    load_bf16x8,
    load_words,
    store_bf16x8,
    store_words,
)

MAX_THREADS = 256
MAX_HEAD_DIM = 256
MAX_PAIRS = MAX_HEAD_DIM // 2
"""The shared cos/sin table's size; Llama's heads are 64 or 128."""


# --8<-- [start:kernel]
@cuda.jit(device=True, inline=True)
def rotate_pair(a, b, cos, sin):
    """Pair (a, b) turned by the angle of (cos, sin): (a cos - b sin, b cos + a sin)."""
    # Explicit fmas, so that every kernel that inlines this rounds alike: left to the
    # compiler, the products may be contracted differently in each kernel's code (the
    # fused GEMV store was one bf16 bit off this kernel on the H200, 2026-12-02).
    return cuda.fma(a, cos, -(b * sin)), cuda.fma(b, cos, a * sin)


@cuda.jit(device=True, inline=True)
def _rotate(source, start, destination, first, half, cos, sin):
    """destination[first + i], destination[first + half + i] = pair i of source[start:] turned (i < 8)."""
    a = cuda.local.array(VECTOR, float32)
    b = cuda.local.array(VECTOR, float32)
    load_bf16x8(source, start + first, a)
    load_bf16x8(source, start + first + half, b)
    for i in range(VECTOR):
        a[i], b[i] = rotate_pair(a[i], b[i], cos[first + i], sin[first + i])
    store_bf16x8(destination, first, a)
    store_bf16x8(destination, first + half, b)


@cuda.jit
def _rope_write_kv_kernel(qkv, positions, inv_freq, slot_mapping, q, k_cache, v_cache):
    # Positions, inverse frequencies and slots come from the host or the weights, never
    # from a kernel: the angles are worked out before the wait for the kernel ahead (`pdl`).
    allow_dependent_launch()
    token = cuda.blockIdx.x
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    half = head_dim // 2
    cos = cuda.shared.array(MAX_PAIRS, float32)
    sin = cuda.shared.array(MAX_PAIRS, float32)
    position = float32(positions[token])
    threads = cuda.blockDim.x * cuda.blockDim.y
    for pair in range(cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x, half, threads):
        angle = position * inv_freq[pair]
        cos[pair] = math.cos(angle)
        sin[pair] = math.sin(angle)
    cuda.syncthreads()

    slot = slot_mapping[token]
    writes_cache = slot >= 0 and slot < num_blocks * block_size
    block = slot // block_size
    row = slot - block * block_size
    wait_for_prior_grid()
    num_heads = num_q_heads + 2 * num_kv_heads if writes_cache else num_q_heads
    source = qkv[token]
    first = cuda.threadIdx.x * VECTOR
    for head in range(cuda.threadIdx.y, num_heads, cuda.blockDim.y):
        start = head * head_dim
        if head < num_q_heads:
            _rotate(source, start, q[token, head], first, half, cos, sin)
        elif head < num_q_heads + num_kv_heads:
            _rotate(source, start, k_cache[block, row, head - num_q_heads], first, half, cos, sin)
        else:
            value = v_cache[block, row, head - num_q_heads - num_kv_heads]
            store_words(value, first, load_words(source, start + first))
            store_words(value, first + half, load_words(source, start + first + half))


# --8<-- [end:kernel]


def rope_write_kv(qkv, positions, inv_freq, slot_mapping, q, k_cache, v_cache, *, stream=0) -> None:
    """Rotate the q and k parts of qkv [T, (Hq + 2 Hkv) * D] by positions int32[T]; write q
    [T, Hq, D], and k and v into k_cache, v_cache [NB, BS, Hkv, D] at slot_mapping int32[T]."""
    num_tokens, width = check_rows_of_eight("qkv", qkv, (None, None))
    _, num_q_heads, head_dim = check_rope_targets(
        num_tokens, width, positions, inv_freq, slot_mapping, q, k_cache, v_cache
    )
    if num_tokens == 0:
        return
    num_kv_heads = k_cache.shape[2]
    chunks = head_dim // (2 * VECTOR)
    heads_per_step = max(1, min(num_q_heads + 2 * num_kv_heads, MAX_THREADS // chunks))
    launch_kernel(_rope_write_kv_kernel, num_tokens, (chunks, heads_per_step), stream,
                  qkv, positions, inv_freq, slot_mapping, q, k_cache, v_cache)  # fmt: skip


def check_rope_targets(
    num_tokens: int, width: int, positions, inv_freq, slot_mapping, q, k_cache, v_cache, product: str = "qkv"
) -> tuple[int, int, int]:
    """Validate what RoPE + KV write reads and writes for a q|k|v product of num_tokens
    rows of `width` features (named `product` in errors); returns q's shape (T, Hq, D)."""
    _, num_q_heads, head_dim = check_rows_of_eight("q", q, (num_tokens, None, None))
    if head_dim % (2 * VECTOR) or head_dim > MAX_HEAD_DIM:
        raise ValueError(f"q: head_dim {head_dim} must be a multiple of {2 * VECTOR} and at most {MAX_HEAD_DIM}")
    num_blocks, block_size, num_kv_heads, _ = check_rows_of_eight("k_cache", k_cache, (None, None, None, head_dim))
    check_rows_of_eight("v_cache", v_cache, (num_blocks, block_size, num_kv_heads, head_dim))
    if width != (num_q_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(
            f"{product}: {width} q|k|v features, expected (Hq + 2 Hkv) * D"
            f" = ({num_q_heads} + 2 * {num_kv_heads}) * {head_dim}"
        )
    check_array("positions", positions, np.int32, (num_tokens,))
    check_array("inv_freq", inv_freq, np.float32, (head_dim // 2,))
    check_array("slot_mapping", slot_mapping, np.int32, (num_tokens,))
    return num_tokens, num_q_heads, head_dim
