"""Scatter one sequence's K and V into a paged cache through its block table, read them back,
and check that attention over the pages equals attention over the contiguous tensors.

Run it from the repository root: python docs/examples/paged_attention.py
It uses the NumPy references of the kernels (tinyvllm.kernels.reference), so no GPU is needed.
"""

import numpy as np

from tinyvllm.kernels import reference

block_size, num_blocks, kv_heads, q_heads, head_dim = 4, 8, 2, 4, 8
block_table = np.array([7, 2, 5], dtype=np.int32)  # sequence A's blocks, as in the chapter
length = 9  # tokens of A in the cache

positions = np.arange(length)
slots = block_table[positions // block_size] * block_size + positions % block_size
print("positions", positions)
print("slots    ", slots)

rng = np.random.default_rng(0)
k, v = rng.standard_normal((2, length, kv_heads, head_dim), dtype=np.float32)
k_cache = np.zeros((num_blocks, block_size, kv_heads, head_dim), dtype=np.float32)
v_cache = np.zeros_like(k_cache)
reference.write_kv(k, v, k_cache, v_cache, slots)  # what the KV-write kernel does on the GPU

# Reading through the table gives back the tokens in order, from blocks 7, 2 and 5.
assert np.array_equal(reference.gather_kv(k_cache, block_table, length), k)

# One decode query (the newest token) over the paged cache, against plain causal attention.
q = rng.standard_normal((1, q_heads, head_dim), dtype=np.float32)
paged = reference.paged_attention(q, k_cache, v_cache, block_table[None, :], np.array([0, 1]), np.array([length]))
plain = reference.causal_attention(q, k, v)
print("largest difference, paged against contiguous:", float(np.abs(paged - plain).max()))
assert np.allclose(paged, plain, atol=1e-6)
