"""Cascade decode attention: a prefix shared by every table scored once, against the float64
reference, plain split decode, and bad arguments."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from tests.attention_batch import shared_prefix_batch, small_blocks  # noqa: F401 (the autouse fixture)
from tests.helpers import BF16_TOLERANCE, pick, poisoned, random_bf16, relative_error, widen
from tinyvllm.kernels import attention_tiles, reference
from tinyvllm.kernels.attention_cascade import (
    cascade_decode_attention,
    cascade_shared_partitions,
    cascade_workspace_rows,
)
from tinyvllm.kernels.attention_split import BLOCKS_PER_SM, MAX_PARTITIONS, split_decode_attention
from tinyvllm.kernels.reference import to_bf16

MAX_SHARED_BLOCKS = pick(3, 160)


@st.composite
def cascade_batches(draw, max_shared_blocks=MAX_SHARED_BLOCKS):
    """(batch, shared_len): some contexts one token past the prefix, some long."""
    num_seqs = draw(st.integers(1, pick(5, 24)))
    block_size = draw(st.sampled_from(pick((1, 2, 4), (16, 32))))
    shared_blocks = draw(st.integers(0, max_shared_blocks))
    own = st.one_of(st.just(1), st.integers(1, pick(24, 700)))
    own_lens = draw(st.lists(own, min_size=num_seqs, max_size=num_seqs))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    batch = shared_prefix_batch(
        rng,
        context_lens=np.add(own_lens, shared_blocks * block_size),
        shared_blocks=shared_blocks,
        num_kv_heads=draw(st.sampled_from(pick((1, 2), (1, 2, 8)))),
        group=draw(st.sampled_from((1, 3, 4, 8))),
        head_dim=draw(st.sampled_from(pick((16, 32), (64, 128)))),
        block_size=block_size,
        extra_blocks=draw(st.integers(0, 2)),
    )
    # A large query scale makes the softmax peaked: the running max then moves a lot.
    batch.q = to_bf16(widen(batch.q) * draw(st.sampled_from((0.3, 1.0, 6.0))))
    return batch, shared_blocks * block_size


def _shared_partitions(batch, drawn, num_sms):
    """A drawn count, or the helper's for a GPU of num_sms SMs (0 draws the helper's)."""
    if drawn:
        return drawn
    num_seqs, num_heads, head_dim = batch.q.shape
    num_kv_heads = batch.k_cache.shape[2]
    group = num_heads // num_kv_heads
    return cascade_shared_partitions(num_seqs, num_kv_heads, group, head_dim, BLOCKS_PER_SM * num_sms)


def _run_cascade(batch, shared_len, num_partitions, shared_partitions):
    num_seqs, num_heads, head_dim = batch.q.shape
    rows = cascade_workspace_rows(num_seqs, num_heads, num_partitions, shared_partitions)
    workspace = poisoned((rows, head_dim + 2), np.float32)
    out = poisoned(batch.q.shape)
    arrays = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens)
    shared = cuda.to_device(np.array([shared_len], np.int32))
    cascade_decode_attention(*[cuda.to_device(a) for a in arrays], shared, out, workspace, num_partitions,
                             shared_partitions)  # fmt: skip
    return out.copy_to_host()


@given(cascade_batches(), st.integers(1, 3), st.integers(0, 3), st.sampled_from((1, 3, 132)))
def test_cascade_matches_reference(case, num_partitions, drawn_shared_partitions, num_sms):
    """Every table entry past a context's blocks names a block past the cache: reading K or V
    through one would fault (an IndexError in the simulator)."""
    batch, shared_len = case
    block_size = batch.k_cache.shape[1]
    unused = np.arange(batch.block_tables.shape[1]) >= -(-batch.context_lens // block_size)[:, None]
    batch.block_tables[unused] = batch.k_cache.shape[0] + 2**20
    shared_partitions = _shared_partitions(batch, drawn_shared_partitions, num_sms)
    result = widen(_run_cascade(batch, shared_len, num_partitions, shared_partitions))
    assert relative_error(result, batch.expected()) <= BF16_TOLERANCE


@given(cascade_batches(max_shared_blocks=0), st.integers(1, 3))
def test_no_shared_prefix_is_split_decode_bit_for_bit(case, num_partitions):
    batch, _ = case
    num_seqs, num_heads, head_dim = batch.q.shape
    split = poisoned(batch.q.shape)
    workspace = poisoned((num_seqs * num_heads * num_partitions, head_dim + 2), np.float32)
    arrays = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens)
    split_decode_attention(*[cuda.to_device(a) for a in arrays], split, workspace, num_partitions)
    cascade = _run_cascade(batch, 0, num_partitions, 2)
    np.testing.assert_array_equal(cascade, split.copy_to_host())


@pytest.mark.parametrize("shared_blocks", [0, 2])
def test_padding_rows_beside_real_rows(shared_blocks):
    """A CUDA graph bucket's padding row (context 1, an all-zero table) leaves the real rows
    right; with a prefix it attends to the prefix alone, through no table of its own."""
    rng = np.random.default_rng(shared_blocks)
    block_size = 4
    shared = shared_blocks * block_size
    batch = shared_prefix_batch(rng, [shared + 1, shared + 9, shared + 3], shared_blocks, 2, 3, 16, block_size)
    expected = batch.expected()
    batch.q = np.concatenate([batch.q, random_bf16(rng, (1, *batch.q.shape[1:]))])
    batch.block_tables = np.concatenate([batch.block_tables, np.zeros_like(batch.block_tables[:1])])
    batch.context_lens = np.append(batch.context_lens, np.int32(1))
    result = widen(_run_cascade(batch, shared, 1, 2))
    assert relative_error(result[:-1], expected) <= BF16_TOLERANCE
    if shared:
        prefix_only = reference.paged_attention(
            widen(batch.q[-1:]),
            widen(batch.k_cache),
            widen(batch.v_cache),
            batch.block_tables[:1],
            np.array([0, 1]),
            np.array([shared]),
        )
        assert relative_error(result[-1:], prefix_only) <= BF16_TOLERANCE


@given(
    st.integers(1, 512), st.sampled_from([1, 2, 8]), st.sampled_from([1, 4, 8]), st.sampled_from([64, 128]),
    st.integers(1, 1000),
)  # fmt: skip
def test_shared_partitions_fill_the_grid(num_seqs, num_kv_heads, group, head_dim, num_sms):
    max_grid = BLOCKS_PER_SM * num_sms
    partitions = cascade_shared_partitions(num_seqs, num_kv_heads, group, head_dim, max_grid)
    blocks = -(-num_seqs // (attention_tiles.block_rows() // group)) * num_kv_heads
    assert 1 <= partitions <= MAX_PARTITIONS
    assert partitions == 1 or blocks * partitions <= max_grid
    assert partitions == MAX_PARTITIONS or blocks * (partitions + 1) > max_grid


def test_shared_partitions_on_the_h200():
    """Llama 3.2 1B (32 q, 8 kv heads, D 64) at batch 256, eight warps a block: 32 sequences a
    block, 64 blocks a part, 8 parts fill the 528 blocks the H200 holds."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention_tiles, "WARPS", 8)
        assert cascade_shared_partitions(256, 8, 4, 64, BLOCKS_PER_SM * 132) == 8
        assert cascade_shared_partitions(1, 8, 4, 64, BLOCKS_PER_SM * 132) == MAX_PARTITIONS


def _arguments(num_seqs=2, num_heads=4, num_kv_heads=2, head_dim=16):
    rng = np.random.default_rng(3)
    batch = shared_prefix_batch(rng, [9] * num_seqs, 1, num_kv_heads, num_heads // num_kv_heads, head_dim, 4)
    return {
        "q": cuda.to_device(batch.q),
        "k_cache": cuda.to_device(batch.k_cache),
        "v_cache": cuda.to_device(batch.v_cache),
        "block_tables": cuda.to_device(batch.block_tables),
        "context_lens": cuda.to_device(batch.context_lens),
        "shared_len": cuda.to_device(np.array([4], np.int32)),
        "out": poisoned(batch.q.shape),
        "workspace": poisoned((cascade_workspace_rows(num_seqs, num_heads, 2, 3), head_dim + 2), np.float32),
        "num_partitions": 2,
        "shared_partitions": 3,
    }


BAD_ARGUMENTS = [
    ("num_partitions", lambda a: 0),
    ("num_partitions", lambda a: MAX_PARTITIONS + 1),
    ("shared_partitions", lambda a: 0),
    ("shared_partitions", lambda a: MAX_PARTITIONS + 1),
    ("workspace", lambda a: poisoned((cascade_workspace_rows(2, 4, 2, 3) - 1, 18), np.float32)),
    ("workspace", lambda a: poisoned((cascade_workspace_rows(2, 4, 2, 3), 17), np.float32)),
    ("shared_len", lambda a: cuda.to_device(np.array([4], np.int64))),
    ("shared_len", lambda a: cuda.to_device(np.array([4, 4], np.int32))),
    ("shared_len", lambda a: cuda.to_device(np.array([[4]], np.int32))),
    ("shared_len", lambda a: 4),
    ("context_lens", lambda a: cuda.to_device(np.ones(3, np.int32))),
    ("q", lambda a: cuda.to_device(a["q"].copy_to_host().astype(np.float32))),
]


@pytest.mark.parametrize("name, make", BAD_ARGUMENTS)
def test_bad_arguments_raise_before_launch(name, make):
    arguments = _arguments()
    arguments[name] = make(arguments)
    with pytest.raises(ValueError, match=name):
        cascade_decode_attention(**arguments)


@pytest.mark.gpu
def test_llama_1b_batch_behind_a_long_shared_prefix():
    """Llama 3.2 1B heads (32 q, 8 kv, D 64), block 16: a 2,048-token prefix shared by 40
    sequences with their own 1 to 300 tokens."""
    rng = np.random.default_rng(7)
    own = rng.integers(1, 300, 40)
    batch = shared_prefix_batch(rng, own + 2048, 128, 8, 4, 64, 16)
    shared_partitions = cascade_shared_partitions(40, 8, 4, 64, BLOCKS_PER_SM * 132)
    result = widen(_run_cascade(batch, 2048, 1, shared_partitions))
    assert relative_error(result, batch.expected()) <= BF16_TOLERANCE
