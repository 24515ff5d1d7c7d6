"""Naive attention against the float64 reference, and flash prefill against naive."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from perf import attention_naive
from perf.attention_naive import naive_attention, naive_scratch_shape
from tests.attention_batch import paged_batch
from tests.helpers import (
    BF16_TOLERANCE,
    SIMULATOR,
    pick,
    poisoned,
    random_bf16,
    relative_error,
    widen,
)
from tinyvllm.kernels import attention_tiles, reference
from tinyvllm.kernels.attention_prefill import prefill_attention


@pytest.fixture(autouse=True, scope="module")
def small_blocks():
    """The simulator runs a Python thread per CUDA thread: small blocks keep it quick."""
    with pytest.MonkeyPatch.context() as patch:
        if SIMULATOR:
            patch.setattr(attention_naive, "THREADS", 8)
            patch.setattr(attention_tiles, "WARPS", 1)
            patch.setattr(attention_tiles, "MAX_KEYS", 16)
        yield


@st.composite
def dense_batches(draw):
    num_seqs = draw(st.integers(1, pick(3, 4)))
    lengths = draw(st.lists(st.integers(1, pick(7, 256)), min_size=num_seqs, max_size=num_seqs))
    num_kv_heads = draw(st.sampled_from(pick((1, 2), (1, 8))))
    group = draw(st.sampled_from((1, 3, 4, 8)))
    head_dim = draw(st.sampled_from(pick((8, 16), (64, 128))))
    padding_rows = draw(st.integers(0, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    rows = int(cu_seqlens[-1]) + padding_rows
    q = random_bf16(rng, (rows, num_kv_heads * group, head_dim))
    k = random_bf16(rng, (rows, num_kv_heads, head_dim))
    v = random_bf16(rng, (rows, num_kv_heads, head_dim))
    return q, k, v, cu_seqlens, max(lengths) + draw(st.integers(0, 2))


def run_naive(q, k, v, cu_seqlens, max_seqlen):
    scores = poisoned(naive_scratch_shape(q.shape[0], q.shape[1], max_seqlen), np.float32)
    out = poisoned(q.shape)
    naive_attention(*[cuda.to_device(a) for a in (q, k, v, cu_seqlens)], scores, out)
    result = widen(out)
    assert np.isnan(result[cu_seqlens[-1] :]).all(), "naive wrote past cu_seqlens[-1]"
    return result[: cu_seqlens[-1]]


@given(dense_batches())
def test_naive_matches_reference(batch):
    q, k, v, cu_seqlens, _ = batch
    used = slice(0, cu_seqlens[-1])
    expected = reference.varlen_attention(widen(q[used]), widen(k[used]), widen(v[used]), cu_seqlens)
    assert relative_error(run_naive(*batch), expected) <= BF16_TOLERANCE


@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 3, 4, 8]))
def test_flash_prefill_of_whole_sequences_equals_naive(seed, group):
    """The same sequences, dense for naive and written into a paged cache for flash prefill."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, pick(9, 256), rng.integers(1, 4, endpoint=True))
    batch = paged_batch(rng, lengths, lengths, 2, group, pick(16, 64), pick(4, 16))
    cu_seqlens = batch.cu_seqlens_q
    k = np.concatenate([reference.gather_kv(batch.k_cache, table, n) for table, n in zip(batch.block_tables, lengths)])
    v = np.concatenate([reference.gather_kv(batch.v_cache, table, n) for table, n in zip(batch.block_tables, lengths)])
    naive = run_naive(batch.q, k, v, cu_seqlens, int(lengths.max()))
    flash = poisoned(batch.q.shape)
    arrays = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, cu_seqlens, batch.context_lens)
    prefill_attention(*[cuda.to_device(a) for a in arrays], flash)
    expected = batch.expected()
    assert relative_error(naive, expected) <= BF16_TOLERANCE
    assert relative_error(widen(flash), expected) <= BF16_TOLERANCE
    assert relative_error(widen(flash), naive) <= BF16_TOLERANCE


def _arguments():
    rng = np.random.default_rng(2)
    return {
        "q": cuda.to_device(random_bf16(rng, (5, 4, 16))),
        "k": cuda.to_device(random_bf16(rng, (5, 2, 16))),
        "v": cuda.to_device(random_bf16(rng, (5, 2, 16))),
        "cu_seqlens": cuda.to_device(np.array([0, 2, 5], np.int32)),
        "scores": poisoned((4, 5, 3), np.float32),
        "out": poisoned((5, 4, 16)),
    }


BAD_ARGUMENTS = [
    ("q", lambda: cuda.to_device(np.zeros((5, 4, 16), np.float32))),
    ("k", lambda: cuda.to_device(np.zeros((5, 2, 8), np.uint16))),
    ("v", lambda: cuda.to_device(np.zeros((4, 2, 16), np.uint16))),
    ("out", lambda: poisoned((5, 2, 16))),
    ("cu_seqlens", lambda: cuda.to_device(np.array([0], np.int32))),
    ("cu_seqlens", lambda: cuda.to_device(np.array([0, 5], np.int64))),
    ("scores", lambda: poisoned((4, 5, 3), np.float64)),
    ("scores", lambda: poisoned((2, 5, 3), np.float32)),
    ("scores", lambda: poisoned((4, 5), np.float32)),
]


@pytest.mark.parametrize("name, make", BAD_ARGUMENTS)
def test_bad_arguments_raise_before_launch(name, make):
    arguments = _arguments()
    arguments[name] = make()
    with pytest.raises(ValueError, match=name):
        naive_attention(**arguments)


def test_query_heads_not_a_multiple_of_kv_heads_raise():
    arguments = _arguments()
    arguments["q"] = cuda.to_device(np.zeros((5, 3, 16), np.uint16))
    arguments["out"] = poisoned((5, 3, 16))
    arguments["scores"] = poisoned((3, 5, 3), np.float32)
    with pytest.raises(ValueError, match="num_heads"):
        naive_attention(**arguments)
