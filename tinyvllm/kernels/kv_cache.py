"""Writing the new tokens' keys and values into the paged KV cache.

    for each token t with slot s = slot_mapping[t] >= 0:
        k_cache[s // BS, s % BS] = k[t]        (a [Hkv, D] row)
        v_cache[s // BS, s % BS] = v[t]

The scheduler gives every token a slot in the cache: the block its sequence owns for that
position, and the row inside it. A negative slot marks a padding token (a CUDA-graph batch
padded up to its captured size) and is skipped. A slot past the end of the cache would be
a scheduler bug; it is skipped too, so the kernel never writes outside the cache.

A token's K (and V) is Hkv * D contiguous values, and so is a cache row: one block per
token copies both with 16-byte loads and stores. Nothing is computed; it is a scatter.
"""

import numpy as np
from numba import cuda

from tinyvllm.kernels.checks import check_array
from tinyvllm.kernels.reduce import WARP
from tinyvllm.kernels.vector_io import VECTOR, check_rows_of_eight, load_words, store_words

MAX_THREADS = 256


# --8<-- [start:kernel]
@cuda.jit
def _write_kv_kernel(k, v, k_cache, v_cache, slot_mapping):
    token = cuda.blockIdx.x
    slot = slot_mapping[token]
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    if slot < 0 or slot >= num_blocks * block_size:
        return
    block = slot // block_size
    row = slot - block * block_size
    for element in range(cuda.threadIdx.x * VECTOR, num_kv_heads * head_dim, cuda.blockDim.x * VECTOR):
        head = element // head_dim
        column = element - head * head_dim
        store_words(k_cache[block, row, head], column, load_words(k[token, head], column))
        store_words(v_cache[block, row, head], column, load_words(v[token, head], column))
# --8<-- [end:kernel]


def write_kv(k, v, k_cache, v_cache, slot_mapping, *, stream=0) -> None:
    """Scatter k, v [T, Hkv, D] into k_cache, v_cache [NB, BS, Hkv, D] at slot_mapping int32[T]."""
    num_tokens, num_kv_heads, head_dim = check_rows_of_eight("k", k, (None, None, None))
    check_rows_of_eight("v", v, (num_tokens, num_kv_heads, head_dim))
    num_blocks, block_size, _, _ = check_rows_of_eight("k_cache", k_cache, (None, None, num_kv_heads, head_dim))
    check_rows_of_eight("v_cache", v_cache, (num_blocks, block_size, num_kv_heads, head_dim))
    check_array("slot_mapping", slot_mapping, np.int32, (num_tokens,))
    if num_tokens == 0:
        return
    vectors = num_kv_heads * head_dim // VECTOR
    threads = min(MAX_THREADS, WARP * -(-vectors // WARP))
    _write_kv_kernel[num_tokens, threads, stream](k, v, k_cache, v_cache, slot_mapping)
