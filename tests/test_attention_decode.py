"""Paged decode attention, plain and split-K, against the float64 reference and each other."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda

from tests.attention_batch import paged_batch
from tests.helpers import (
    BF16_TOLERANCE,
    SIMULATOR,
    pick,
    poisoned,
    relative_error,
    widen,
)
from tinyvllm.backends import variants
from tinyvllm.backends.variants import MIN_PARTITION_TOKENS, decode_partitions, decode_shape
from tinyvllm.kernels import attention_decode
from tinyvllm.kernels.attention_decode import MAX_GROUP, paged_decode_attention
from tinyvllm.kernels.attention_split import (
    BLOCKS_PER_SM,
    MAX_PARTITIONS,
    decode_attention,
    decode_workspace_shape,
    merge_partitions,
    split_decode_attention,
)
from tinyvllm.kernels.reference import merge_partition_states, to_bf16


@pytest.fixture(autouse=True, scope="module")
def small_blocks():
    """The simulator runs a Python thread per CUDA thread: small blocks keep it quick."""
    with pytest.MonkeyPatch.context() as patch:
        if SIMULATOR:
            patch.setattr(attention_decode, "DECODE_THREADS", 16)
        yield


HEAD_DIMS = pick((8, 16, 32), (64, 128))


@st.composite
def decode_batches(draw, head_dims=HEAD_DIMS):
    num_seqs = draw(st.integers(1, pick(3, 24)))
    context_lens = draw(st.lists(st.integers(1, pick(40, 3000)), min_size=num_seqs, max_size=num_seqs))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    batch = paged_batch(
        rng,
        query_lens=[1] * num_seqs,
        context_lens=context_lens,
        num_kv_heads=draw(st.sampled_from(pick((1, 2), (1, 2, 8)))),
        group=draw(st.sampled_from((1, 3, 4, 8))),
        head_dim=draw(st.sampled_from(head_dims)),
        block_size=draw(st.sampled_from(pick((1, 2, 4), (4, 16, 32)))),
        extra_blocks=draw(st.integers(0, 2)),
    )
    # A large query scale makes the softmax peaked: the running max then moves a lot.
    batch.q = to_bf16(widen(batch.q) * draw(st.sampled_from((0.3, 1.0, 6.0))))
    return batch


def _device(batch):
    arrays = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens)
    return [cuda.to_device(a) for a in arrays]


def _run_plain(batch):
    out = poisoned(batch.q.shape)
    paged_decode_attention(*_device(batch), out)
    return widen(out)


def _run_split(batch, num_partitions):
    num_seqs, num_heads, head_dim = batch.q.shape
    workspace = poisoned((num_seqs * num_heads * num_partitions, head_dim + 2), np.float32)
    out = poisoned(batch.q.shape)
    split_decode_attention(*_device(batch), out, workspace, num_partitions)
    return widen(out)


@given(decode_batches())
def test_paged_decode_matches_reference(batch):
    assert relative_error(_run_plain(batch), batch.expected()) <= BF16_TOLERANCE


@given(decode_batches(), st.integers(1, pick(6, 40)))
def test_split_decode_matches_reference_and_plain_decode(batch, num_partitions):
    split = _run_split(batch, num_partitions)
    assert relative_error(split, batch.expected()) <= BF16_TOLERANCE
    assert relative_error(split, _run_plain(batch)) <= BF16_TOLERANCE


@settings(max_examples=40)  # the merge alone is quick even under the simulator
@given(
    st.integers(1, 2),
    st.integers(1, 3),
    st.sampled_from(pick((8, 16), (64, 128))),
    st.integers(1, MAX_PARTITIONS),
    st.sampled_from((1, 4, 16, 64)),
    st.data(),
)
def test_merge_matches_float64_merge_of_the_filled_partitions(
    num_seqs, num_heads, head_dim, num_partitions, step, data
):
    """The merge alone, on partition states drawn directly (any number of partitions, where
    attention under the simulator reaches a few): the partitions holding tokens are those
    that some position t < context_len falls in, at t // length; every other row stays
    NaN, so a merge that read one would return NaN."""
    context_lens = np.array(data.draw(st.lists(st.integers(1, num_partitions * step * 3), min_size=num_seqs,
                                               max_size=num_seqs)), np.int32)  # fmt: skip
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    workspace = np.full((num_seqs * num_heads * num_partitions, head_dim + 2), np.nan, np.float32)
    expected = np.empty((num_seqs, num_heads, head_dim))
    for seq, context_len in enumerate(context_lens):
        length = -(-int(context_len) // (num_partitions * step)) * step
        filled = len({t // length for t in range(context_len)})
        for head in range(num_heads):
            rows = slice((seq * num_heads + head) * num_partitions, (seq * num_heads + head) * num_partitions + filled)
            workspace[rows, head_dim] = rng.uniform(-30, 30, filled)
            workspace[rows, head_dim + 1] = rng.uniform(1, 64, filled)
            workspace[rows, :head_dim] = rng.normal(0, 10, (filled, head_dim))
            maxima, sums, outputs = workspace[rows, head_dim], workspace[rows, head_dim + 1], workspace[rows, :head_dim]
            expected[seq, head] = merge_partition_states(maxima, sums, outputs)
    out = poisoned((num_seqs, num_heads, head_dim))
    merge_partitions(cuda.to_device(workspace), cuda.to_device(context_lens), num_partitions, step, out)
    assert relative_error(widen(out), expected) <= BF16_TOLERANCE


@given(decode_batches(), st.integers(1, pick(4, 40)))
def test_table_entries_past_a_context_are_never_used(batch, num_partitions):
    """A block id past the cache in every unused table entry: reading K or V through one
    would fault (an IndexError in the simulator)."""
    block_size = batch.k_cache.shape[1]
    used = -(-batch.context_lens // block_size)
    unused = np.arange(batch.block_tables.shape[1]) >= used[:, None]
    batch.block_tables[unused] = batch.k_cache.shape[0] + 2**20
    expected = batch.expected()
    assert relative_error(_run_plain(batch), expected) <= BF16_TOLERANCE
    assert relative_error(_run_split(batch, num_partitions), expected) <= BF16_TOLERANCE


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("num_partitions", [1, 3])
def test_model_head_dims(head_dim, num_partitions):
    rng = np.random.default_rng(head_dim + num_partitions)
    batch = paged_batch(rng, [1, 1], [pick(9, 700), pick(2, 1500)], 2, 4, head_dim, pick(4, 16))
    result = _run_split(batch, num_partitions) if num_partitions > 1 else _run_plain(batch)
    assert relative_error(result, batch.expected()) <= BF16_TOLERANCE


@given(decode_batches(head_dims=pick((8, 16), (64, 128))), st.sampled_from([1, 2, 3, 132]))
def test_decode_attention_matches_reference_whichever_path_it_takes(batch, num_sms):
    num_heads, head_dim = batch.q.shape[1:]
    shape = decode_workspace_shape(num_heads, batch.k_cache.shape[2], head_dim, num_sms)
    out = poisoned(batch.q.shape)
    with pytest.MonkeyPatch.context() as patch:
        # Simulator contexts are tiny: let them split too.
        patch.setattr(variants, "MIN_PARTITION_TOKENS", pick(4, MIN_PARTITION_TOKENS))
        partitions = decode_partitions(
            *decode_shape(batch.q, batch.k_cache, batch.block_tables), BLOCKS_PER_SM * num_sms
        )
    decode_attention(*_device(batch), out, poisoned(shape, np.float32), partitions)
    assert relative_error(widen(out), batch.expected()) <= BF16_TOLERANCE


@given(
    st.integers(1, 512),
    st.sampled_from([1, 2, 8]),
    st.integers(1, 1 << 17),
    st.integers(1, 1000),
)
def test_decode_partitions_fill_the_grid_without_tiny_parts(num_seqs, num_kv_heads, max_context_len, num_sms):
    max_grid = BLOCKS_PER_SM * num_sms
    partitions = decode_partitions(num_seqs, num_kv_heads, max_context_len, max_grid)
    assert 1 <= partitions <= MAX_PARTITIONS
    if partitions > 1:
        assert num_seqs * num_kv_heads * partitions <= max_grid
        assert max_context_len // partitions >= MIN_PARTITION_TOKENS
    if num_seqs * num_kv_heads * 2 <= max_grid and max_context_len >= 2 * MIN_PARTITION_TOKENS:
        assert partitions > 1
    if partitions < MAX_PARTITIONS:
        assert num_seqs * num_kv_heads * (partitions + 1) > max_grid or max_context_len // (partitions + 1) < (
            MIN_PARTITION_TOKENS
        )


def test_decode_partitions_on_the_h200():
    """The bench shapes (Llama 3.2 1B: 8 KV heads, 132 SMs): split at batch 1, not at 64."""
    max_grid = BLOCKS_PER_SM * 132
    assert decode_partitions(1, 8, 8192, max_grid) == MAX_PARTITIONS
    assert decode_partitions(1, 8, 2048, max_grid) == 2048 // MIN_PARTITION_TOKENS
    assert decode_partitions(64, 8, 2048, max_grid) == 1
    assert decode_partitions(256, 8, 8192, max_grid) == 1


def _arguments(num_seqs=2, num_heads=4, num_kv_heads=2, head_dim=16):
    rng = np.random.default_rng(3)
    batch = paged_batch(rng, [1] * num_seqs, [5] * num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim, 4)
    return {
        "q": cuda.to_device(batch.q),
        "k_cache": cuda.to_device(batch.k_cache),
        "v_cache": cuda.to_device(batch.v_cache),
        "block_tables": cuda.to_device(batch.block_tables),
        "context_lens": cuda.to_device(batch.context_lens),
        "out": poisoned(batch.q.shape),
        "workspace": poisoned((num_seqs * num_heads * 2, head_dim + 2), np.float32),
    }


BAD_ARGUMENTS = [
    ("q", lambda a: cuda.to_device(a["q"].copy_to_host().astype(np.float32))),
    ("q", lambda a: cuda.to_device(np.zeros((2, 64), np.uint16))),
    ("q", lambda a: cuda.to_device(np.zeros((2, 4, 32), np.uint16))[:, :, ::2]),
    ("out", lambda a: poisoned((2, 4, 8))),
    ("k_cache", lambda a: cuda.to_device(np.zeros((4, 4, 2, 8), np.uint16))),
    ("k_cache", lambda a: cuda.to_device(np.zeros((5, 3, 2, 16), np.uint16))),
    ("v_cache", lambda a: cuda.to_device(np.zeros((3, 4, 2, 16), np.uint16))),
    ("block_tables", lambda a: cuda.to_device(np.zeros((2, 2), np.int64))),
    ("block_tables", lambda a: cuda.to_device(np.zeros((3, 2), np.int32))),
    ("block_tables", lambda a: cuda.to_device(np.zeros((2, 0), np.int32))),
    ("context_lens", lambda a: cuda.to_device(np.ones(3, np.int32))),
    ("workspace", lambda a: poisoned((16, 17), np.float32)),
    ("workspace", lambda a: poisoned((16, 18), np.float64)),
]


@pytest.mark.parametrize("name, make", BAD_ARGUMENTS)
def test_bad_arguments_raise_before_launch(name, make):
    arguments = _arguments()
    arguments[name] = make(arguments)
    with pytest.raises(ValueError, match=name):
        decode_attention(**arguments, num_partitions=2)


def test_bad_head_shapes_raise():
    with pytest.raises(ValueError, match="head_dim"):
        paged_decode_attention(**{k: v for k, v in _arguments(head_dim=24).items() if k != "workspace"})
    with pytest.raises(ValueError, match="num_heads"):
        arguments = _arguments()
        arguments["q"] = cuda.to_device(np.zeros((2, 3, 16), np.uint16))
        arguments["out"] = poisoned((2, 3, 16))
        decode_attention(**arguments, num_partitions=2)


def test_split_needs_enough_workspace_rows_and_partitions():
    arguments = _arguments()
    with pytest.raises(ValueError, match="workspace"):
        split_decode_attention(**arguments, num_partitions=3)
    with pytest.raises(ValueError, match="num_partitions"):
        split_decode_attention(**arguments, num_partitions=0)
    with pytest.raises(ValueError, match="num_partitions"):
        split_decode_attention(**arguments, num_partitions=MAX_PARTITIONS + 1)


@pytest.mark.gpu
def test_llama_1b_decode_batch_at_long_context():
    """Llama 3.2 1B heads (32 q, 8 kv, D 64), block 16: the bench's shapes, plain and split."""
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 8192, 6)
    batch = paged_batch(rng, [1] * 6, lengths, 8, 4, 64, 16)
    expected = batch.expected()
    assert relative_error(_run_plain(batch), expected) <= BF16_TOLERANCE
    assert relative_error(_run_split(batch, 32), expected) <= BF16_TOLERANCE


def test_more_query_heads_per_kv_head_than_a_block_serves_raise():
    arguments = _arguments(num_heads=2 * (MAX_GROUP + 1), num_kv_heads=2)
    with pytest.raises(ValueError, match=f"at most {MAX_GROUP} per KV head"):
        decode_attention(**arguments, num_partitions=2)
