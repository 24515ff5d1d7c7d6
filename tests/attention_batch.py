"""Random paged-attention batches for the attention tests, and their float64 answers.

A batch scatters each sequence's K and V over shuffled, non-contiguous cache blocks. Every
cache row that belongs to no sequence's context is NaN, and so is a spare block that the
unused block-table entries point at: a kernel that reads anything outside a context
turns its output into NaN, which the error check rejects.
"""

from dataclasses import dataclass

import numpy as np
import pytest

from tests.helpers import BF16_NAN, SIMULATOR, random_bf16, widen
from tinyvllm.kernels import attention_decode, attention_tiles, reference


@pytest.fixture(autouse=True, scope="module")
def small_blocks():
    """Imported by the attention tests (autouse there): the simulator runs a Python thread
    per CUDA thread, and small blocks keep it quick."""
    with pytest.MonkeyPatch.context() as patch:
        if SIMULATOR:
            patch.setattr(attention_tiles, "WARPS", 1)
            patch.setattr(attention_tiles, "MAX_KEYS", 16)
            patch.setattr(attention_decode, "DECODE_THREADS", 16)
        yield


@dataclass
class PagedBatch:
    q: np.ndarray  # uint16[T, Hq, D]: the new tokens, packed
    k_cache: np.ndarray  # uint16[num_blocks, block_size, Hkv, D]
    v_cache: np.ndarray
    block_tables: np.ndarray  # int32[S, max_blocks]
    cu_seqlens_q: np.ndarray  # int32[S + 1]
    context_lens: np.ndarray  # int32[S]

    def expected(self) -> np.ndarray:
        """float64 paged attention of the widened bf16 inputs."""
        return reference.paged_attention(
            widen(self.q),
            widen(self.k_cache),
            widen(self.v_cache),
            self.block_tables,
            self.cu_seqlens_q,
            self.context_lens,
        )


def paged_batch(
    rng: np.random.Generator,
    query_lens,
    context_lens,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    extra_blocks: int = 0,
) -> PagedBatch:
    """Sequence s has context_lens[s] cached tokens, the last query_lens[s] of them new."""
    query_lens = np.asarray(query_lens, np.int32)
    context_lens = np.asarray(context_lens, np.int32)
    blocks_needed = -(-context_lens // block_size)
    max_blocks = int(blocks_needed.max()) + extra_blocks
    num_blocks = int(blocks_needed.sum()) + 1
    order = rng.permutation(num_blocks)
    spare = order[-1]
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = np.full(shape, BF16_NAN, np.uint16)
    v_cache = np.full(shape, BF16_NAN, np.uint16)
    block_tables = np.full((len(context_lens), max_blocks), spare, np.int32)
    used = 0
    for s, length in enumerate(context_lens):
        blocks = order[used : used + blocks_needed[s]]
        used += blocks_needed[s]
        block_tables[s, : len(blocks)] = blocks
        keys = random_bf16(rng, (length, num_kv_heads, head_dim))
        values = random_bf16(rng, (length, num_kv_heads, head_dim))
        slots = blocks[np.arange(length) // block_size] * block_size + np.arange(length) % block_size
        reference.write_kv(keys, values, k_cache, v_cache, slots)
    cu_seqlens_q = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    q = random_bf16(rng, (int(cu_seqlens_q[-1]), num_kv_heads * group, head_dim))
    return PagedBatch(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)


def shared_prefix_batch(
    rng: np.random.Generator,
    context_lens,
    shared_blocks: int,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    extra_blocks: int = 0,
) -> PagedBatch:
    """A decode batch whose tables all start with sequence 0's first shared_blocks blocks (one
    token of each sequence new; every context holds at least that prefix). The blocks the other
    sequences no longer point at turn NaN: the prefix's K and V exist once."""
    queries = [1] * len(context_lens)
    batch = paged_batch(rng, queries, context_lens, num_kv_heads, group, head_dim, block_size, extra_blocks)
    assert (batch.context_lens >= shared_blocks * block_size).all()
    replaced = batch.block_tables[1:, :shared_blocks].ravel()
    batch.k_cache[replaced] = BF16_NAN
    batch.v_cache[replaced] = BF16_NAN
    batch.block_tables[:, :shared_blocks] = batch.block_tables[0, :shared_blocks]
    return batch
