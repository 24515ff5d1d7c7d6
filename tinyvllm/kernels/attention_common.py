"""What the attention kernels share: the paged-cache checks and the online softmax.

The paged KV cache of one layer is `k_cache, v_cache: uint16[num_blocks, block_size, Hkv, D]`.
Sequence s keeps its token at position p in block `block_tables[s, p // block_size]`, row
`p % block_size`; `context_lens[s]` tokens are in the cache (the new ones included). Query
head h reads KV head `h // (Hq // Hkv)` (grouped-query attention), and scores are scaled
by 1 / sqrt(D).

Online softmax. A softmax over keys seen one at a time keeps a running max m, a running
sum l = sum exp(s_j - m) and an unnormalised output acc = sum exp(s_j - m) v_j. A new
score s with s > m rescales l and acc by exp(m - s) first. Two such states over disjoint
key sets merge exactly the same way: with M = max(m1, m2),

    l = l1 exp(m1 - M) + l2 exp(m2 - M),  acc = acc1 exp(m1 - M) + acc2 exp(m2 - M),

and the answer is acc / l. An empty state has m = -inf, l = 0, acc = 0; `rescale` maps it
to zero weight instead of exp(-inf + inf) = NaN. The kernels work in base 2: the query is
scaled by log2(e) / sqrt(D) once, so every exp(x) above becomes exp2(x), a single
MUFU.EX2 on the GPU (`exp2_ftz`) instead of libdevice's dozen-instruction expf.

Lane groups. Some kernels spread one dot product over a small group of adjacent lanes,
each holding a slice of D, and add the slices with `reduce.lane_group_sum`.
"""

import math

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.fast_exp import exp2_ftz
from tinyvllm.kernels.device.vector_io import check_rows_of_eight

LOG2_E = 1.4426950408889634


# --8<-- [start:rescale]
@cuda.jit(device=True, inline=True)
def rescale(old_max, new_max):
    """exp2(old_max - new_max), and 0 for an empty state (old_max = -inf)."""
    if old_max == -math.inf:
        return float32(0.0)
    return exp2_ftz(old_max - new_max)


# --8<-- [end:rescale]


def check_paged_cache(q, k_cache, v_cache, out) -> tuple[int, int, int, int, int]:
    """Check q, out [T, Hq, D] and the caches; return (T, Hq, Hkv, D, block_size).

    The block size must be a power of two: the kernels split a position into block and
    row with a shift and a mask.
    """
    num_tokens, num_heads, head_dim = check_rows_of_eight("q", q, (None, None, None))
    check_rows_of_eight("out", out, (num_tokens, num_heads, head_dim))
    num_blocks, block_size, num_kv_heads, _ = check_rows_of_eight("k_cache", k_cache, (None, None, None, head_dim))
    if block_size & (block_size - 1):
        raise ValueError(f"k_cache: block_size {block_size} must be a power of two")
    check_rows_of_eight("v_cache", v_cache, (num_blocks, block_size, num_kv_heads, head_dim))
    check_heads(num_heads, num_kv_heads)
    return num_tokens, num_heads, num_kv_heads, head_dim, block_size


def block_shift(block_size: int) -> int:
    """log2 of a power-of-two block size: position >> shift is the block, & (size - 1) the row."""
    return block_size.bit_length() - 1


def check_heads(num_heads: int, num_kv_heads: int) -> None:
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads {num_heads} must be a positive multiple of num_kv_heads {num_kv_heads}")


def check_sequences(block_tables, context_lens, num_seqs: int | None) -> tuple[int, int]:
    """Check the per-sequence metadata; return (num_seqs, max_blocks_per_seq)."""
    num_seqs, max_blocks = check_array("block_tables", block_tables, np.int32, (num_seqs, None))
    check_array("context_lens", context_lens, np.int32, (num_seqs,))
    if max_blocks == 0:
        raise ValueError("block_tables: needs at least one block per sequence")
    return num_seqs, max_blocks
