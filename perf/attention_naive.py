"""Naive attention: the textbook three steps, every score stored. The yardstick for the rest.

For each sequence of a packed batch (rows cu_seqlens[s] : cu_seqlens[s + 1] of dense
q [T, Hq, D], k, v [T, Hkv, D]; no cache), each head h and each query row i:

    1. scores[h, t, j] = q[t, h] . k[start + j, h // G] / sqrt(D)     for keys j <= i
    2. softmax over j, in place: the row max, then the exponentials and their sum, then
       the division by the sum
    3. out[t, h] = sum_j scores[h, t, j] v[start + j, h // G]

with t = start + i. One thread per score, one block per softmax row, one thread per
output element; nothing is tiled or reused on chip. The scores live in a caller-provided
float32 buffer of `naive_scratch_shape` (2 GB for 32 heads at 4096 tokens): exactly the
T^2 memory traffic that flash attention (`attention_prefill`) avoids.
"""

import math

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels.attention_common import check_heads
from tinyvllm.kernels.device.bf16 import bf16_to_f32, f32_to_bf16
from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.reduce import block_max, block_sum

THREADS = 128
"""Threads per block of all three kernels (a power of two, for the softmax's block reductions)."""


def naive_scratch_shape(num_tokens: int, num_heads: int, max_seqlen: int) -> tuple[int, int, int]:
    """float32 scores for every (head, query row, key of the row's sequence)."""
    return (num_heads, num_tokens, max_seqlen)


@cuda.jit(device=True, inline=True)
def _sequence_start(cu_seqlens, token):
    """cu_seqlens[s] of the sequence s holding packed row `token` (binary search)."""
    lo = 0
    hi = cu_seqlens.shape[0] - 2
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cu_seqlens[mid] <= token:
            lo = mid
        else:
            hi = mid - 1
    return cu_seqlens[lo]


@cuda.jit
def _scores_kernel(q, k, cu_seqlens, scores):
    allow_dependent_launch()
    wait_for_prior_grid()
    num_heads, num_tokens, max_seqlen = scores.shape
    index = cuda.grid(1)
    if index >= num_heads * num_tokens * max_seqlen:
        return
    head = index // (num_tokens * max_seqlen)
    token = index // max_seqlen % num_tokens
    key = index % max_seqlen
    if token >= cu_seqlens[cu_seqlens.shape[0] - 1]:
        return
    start = _sequence_start(cu_seqlens, token)
    if key > token - start:
        return
    kv_head = head // (num_heads // k.shape[1])
    dot = float32(0.0)
    for d in range(q.shape[2]):
        dot += bf16_to_f32(q[token, head, d]) * bf16_to_f32(k[start + key, kv_head, d])
    scores[head, token, key] = dot / math.sqrt(float32(q.shape[2]))


# --8<-- [start:softmax]
@cuda.jit
def _softmax_kernel(cu_seqlens, scores):
    allow_dependent_launch()
    wait_for_prior_grid()
    token = cuda.blockIdx.x
    head = cuda.blockIdx.y
    if token >= cu_seqlens[cu_seqlens.shape[0] - 1]:
        return
    row = scores[head, token]
    keys = token - _sequence_start(cu_seqlens, token) + 1
    scratch = cuda.shared.array(THREADS, float32)
    largest = -math.inf
    for j in range(cuda.threadIdx.x, keys, THREADS):
        largest = max(largest, row[j])
    largest = block_max(largest, scratch)
    total = float32(0.0)
    for j in range(cuda.threadIdx.x, keys, THREADS):
        row[j] = math.exp(row[j] - largest)
        total += row[j]
    total = block_sum(total, scratch)
    for j in range(cuda.threadIdx.x, keys, THREADS):
        row[j] /= total


# --8<-- [end:softmax]


@cuda.jit
def _weighted_sum_kernel(v, cu_seqlens, scores, out):
    allow_dependent_launch()
    wait_for_prior_grid()
    num_tokens, num_heads, head_dim = out.shape
    index = cuda.grid(1)
    if index >= num_tokens * num_heads * head_dim:
        return
    token = index // (num_heads * head_dim)
    head = index // head_dim % num_heads
    d = index % head_dim
    if token >= cu_seqlens[cu_seqlens.shape[0] - 1]:
        return
    start = _sequence_start(cu_seqlens, token)
    kv_head = head // (num_heads // v.shape[1])
    total = float32(0.0)
    for j in range(token - start + 1):
        total += scores[head, token, j] * bf16_to_f32(v[start + j, kv_head, d])
    out[token, head, d] = f32_to_bf16(total)


def naive_attention(q, k, v, cu_seqlens, scores, out, *, stream=0) -> None:
    """Causal varlen attention of dense q [T, Hq, D], k, v [T, Hkv, D] into out [T, Hq, D].

    cu_seqlens: int32[S + 1] (cu[0] = 0, cu[S] <= T; rows past cu[S] are left as they are);
    scores: float32 scratch of `naive_scratch_shape(T, Hq, L)` with L at least the
    longest sequence.
    """
    num_tokens, num_heads, head_dim = check_array("q", q, np.uint16, (None, None, None))
    _, num_kv_heads, _ = check_array("k", k, np.uint16, (num_tokens, None, head_dim))
    check_array("v", v, np.uint16, (num_tokens, num_kv_heads, head_dim))
    check_array("out", out, np.uint16, (num_tokens, num_heads, head_dim))
    check_heads(num_heads, num_kv_heads)
    (num_bounds,) = check_array("cu_seqlens", cu_seqlens, np.int32, (None,))
    if num_bounds < 2:
        raise ValueError("cu_seqlens: needs at least one sequence (S + 1 >= 2 entries)")
    _, _, max_seqlen = check_array("scores", scores, np.float32, (num_heads, num_tokens, None))
    if num_tokens == 0 or max_seqlen == 0:
        return
    num_scores = num_heads * num_tokens * max_seqlen
    _scores_kernel[-(-num_scores // THREADS), THREADS, stream](q, k, cu_seqlens, scores)
    _softmax_kernel[(num_tokens, num_heads), THREADS, stream](cu_seqlens, scores)
    num_outputs = num_tokens * num_heads * head_dim
    _weighted_sum_kernel[-(-num_outputs // THREADS), THREADS, stream](v, cu_seqlens, scores, out)
