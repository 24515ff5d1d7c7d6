"""Flash prefill over the paged cache: varlen, causal, GQA, with and without cached context."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from tests.attention_batch import paged_batch, small_blocks  # noqa: F401 (the autouse fixture)
from tests.helpers import (
    BF16_TOLERANCE,
    pick,
    poisoned,
    random_bf16,
    relative_error,
    widen,
)
from tinyvllm.kernels import attention_tiles
from tinyvllm.kernels.attention_decode import paged_decode_attention
from tinyvllm.kernels.attention_prefill import prefill_attention
from tinyvllm.kernels.reference import to_bf16

HEAD_DIMS = pick((16, 32), (64, 128))
MAX_QUERY = pick(12, 300)
MAX_CACHED = pick(12, 600)
"""On the GPU the float64 reference (NumPy einsum) is the slow part: ~1 s at 300 x 900."""


@st.composite
def prefill_batches(draw, head_dims=HEAD_DIMS, max_query=MAX_QUERY, max_cached=MAX_CACHED):
    num_seqs = draw(st.integers(1, pick(3, 4)))
    query_lens = draw(st.lists(st.integers(1, max_query), min_size=num_seqs, max_size=num_seqs))
    cached = draw(st.lists(st.integers(0, max_cached), min_size=num_seqs, max_size=num_seqs))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    batch = paged_batch(
        rng,
        query_lens=query_lens,
        context_lens=np.add(query_lens, cached),
        num_kv_heads=draw(st.sampled_from(pick((1, 2), (1, 2, 8)))),
        group=draw(st.sampled_from((1, 3, 4, 8))),
        head_dim=draw(st.sampled_from(head_dims)),
        block_size=draw(st.sampled_from(pick((1, 2, 4), (4, 16, 32)))),
        extra_blocks=draw(st.integers(0, 2)),
    )
    # A large query scale makes the softmax peaked: the running max then moves a lot.
    batch.q = to_bf16(widen(batch.q) * draw(st.sampled_from((0.3, 1.0, 6.0))))
    return batch, draw(st.integers(0, 3))


def run_prefill(batch, padding_rows=0):
    """Prefill with `padding_rows` extra rows in q and out, which must stay untouched."""
    rows, num_heads, head_dim = batch.q.shape
    q = np.concatenate([batch.q, random_bf16(np.random.default_rng(0), (padding_rows, num_heads, head_dim))])
    out = poisoned(q.shape)
    prefill_attention(
        cuda.to_device(q),
        cuda.to_device(batch.k_cache),
        cuda.to_device(batch.v_cache),
        cuda.to_device(batch.block_tables),
        cuda.to_device(batch.cu_seqlens_q),
        cuda.to_device(batch.context_lens),
        out,
    )
    result = widen(out)
    assert np.isnan(result[rows:]).all(), "prefill wrote past cu_seqlens_q[-1]"
    return result[:rows]


@given(prefill_batches())
def test_prefill_matches_reference(case):
    batch, padding_rows = case
    assert relative_error(run_prefill(batch, padding_rows), batch.expected()) <= BF16_TOLERANCE


@given(prefill_batches(max_query=1))
def test_prefill_of_single_tokens_equals_decode(case):
    batch, _ = case
    decoded = poisoned(batch.q.shape)
    arrays = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens)
    paged_decode_attention(*[cuda.to_device(a) for a in arrays], decoded)
    prefilled = run_prefill(batch)
    assert relative_error(prefilled, batch.expected()) <= BF16_TOLERANCE
    assert relative_error(prefilled, widen(decoded)) <= BF16_TOLERANCE


@pytest.mark.parametrize("head_dim", [64, 128])
def test_model_head_dims(head_dim):
    rng = np.random.default_rng(head_dim)
    batch = paged_batch(rng, [pick(3, 300), 1], [pick(5, 700), pick(2, 40)], 2, 4, head_dim, pick(4, 16))
    assert relative_error(run_prefill(batch, 1), batch.expected()) <= BF16_TOLERANCE


def test_block_shapes():
    """Other block shapes (warps a block, keys a tile) compute the same thing."""
    rng = np.random.default_rng(4)
    batch = paged_batch(rng, [7, 2, 11], [9, 2, 40], 2, 3, 32, 4)
    expected = batch.expected()
    for warps, keys in [(1, 32), (2, 16)]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(attention_tiles, "WARPS", warps)
            patch.setattr(attention_tiles, "MAX_KEYS", keys)
            assert relative_error(run_prefill(batch, 2), expected) <= BF16_TOLERANCE


def test_a_tile_of_fewer_chunks_than_threads():
    """At D = 16 a 16-key tile is 32 chunks of 8 elements, fewer than 2 warps' 64 threads: the
    copy rounds leave the extra threads idle."""
    rng = np.random.default_rng(5)
    batch = paged_batch(rng, [5, 3], [20, 3], 2, 2, 16, 4)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention_tiles, "WARPS", 2)
        patch.setattr(attention_tiles, "MAX_KEYS", 16)
        assert relative_error(run_prefill(batch, 2), batch.expected()) <= BF16_TOLERANCE


def _arguments():
    rng = np.random.default_rng(3)
    batch = paged_batch(rng, [3, 2], [5, 6], 2, 2, 16, 4)
    return {
        "q": cuda.to_device(batch.q),
        "k_cache": cuda.to_device(batch.k_cache),
        "v_cache": cuda.to_device(batch.v_cache),
        "block_tables": cuda.to_device(batch.block_tables),
        "cu_seqlens_q": cuda.to_device(batch.cu_seqlens_q),
        "context_lens": cuda.to_device(batch.context_lens),
        "out": poisoned(batch.q.shape),
    }


BAD_ARGUMENTS = [
    ("q", lambda a: cuda.to_device(a["q"].copy_to_host().astype(np.int16))),
    ("q", lambda a: cuda.to_device(np.zeros((5, 64), np.uint16))),
    ("q", lambda a: cuda.to_device(np.zeros((5, 4, 32), np.uint16))[:, :, ::2]),
    ("out", lambda a: poisoned((5, 4, 8))),
    ("k_cache", lambda a: cuda.to_device(np.zeros((5, 4, 2, 8), np.uint16))),
    ("k_cache", lambda a: cuda.to_device(np.zeros((5, 3, 2, 16), np.uint16))),
    ("v_cache", lambda a: cuda.to_device(np.zeros((5, 4, 2, 16), np.float16))),
    ("block_tables", lambda a: cuda.to_device(np.zeros((2, 2), np.uint32))),
    ("context_lens", lambda a: cuda.to_device(np.ones(1, np.int32))),
    ("cu_seqlens_q", lambda a: cuda.to_device(np.zeros(2, np.int32))),
    ("cu_seqlens_q", lambda a: cuda.to_device(np.zeros(3, np.int64))),
]


@pytest.mark.parametrize("name, make", BAD_ARGUMENTS)
def test_bad_arguments_raise_before_launch(name, make):
    arguments = _arguments()
    arguments[name] = make(arguments)
    with pytest.raises(ValueError, match=name):
        prefill_attention(**arguments)


def test_unsupported_head_dim_raises():
    rng = np.random.default_rng(3)
    batch = paged_batch(rng, [2], [3], 1, 1, 24, 4)
    with pytest.raises(ValueError, match="head_dim"):
        run_prefill(batch)


@pytest.mark.gpu
def test_llama_1b_chunked_prefill_with_cached_prefix():
    """Llama 3.2 1B heads (32 q, 8 kv, D 64): two chunks of a long prompt behind cached prefixes."""
    rng = np.random.default_rng(6)
    batch = paged_batch(rng, [1024, 517], [1024 + 2048, 517 + 300], 8, 4, 64, 16)
    assert relative_error(run_prefill(batch, 3), batch.expected()) <= BF16_TOLERANCE
