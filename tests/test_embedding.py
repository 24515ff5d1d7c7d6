"""Embedding gather against the NumPy reference: bit for bit, and what happens to bad ids."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from tests.helpers import BF16_NAN, pick, poisoned, random_bf16
from tinyvllm.kernels import reference
from tinyvllm.kernels.embedding import embedding, feed_sampled_tokens


@st.composite
def problems(draw):
    vocab = draw(st.integers(1, pick(40, 4000)))
    hidden = 8 * draw(st.integers(1, pick(12, 256)))
    tokens = draw(st.integers(1, pick(4, 300)))
    ids = draw(st.lists(st.integers(0, vocab - 1), min_size=tokens, max_size=tokens))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return random_bf16(rng, (vocab, hidden)), np.array(ids, dtype=np.int32)


@given(problems())
def test_gathers_the_rows_of_the_table(problem):
    table, ids = problem
    out = poisoned((ids.size, table.shape[1]))
    embedding(cuda.to_device(ids), cuda.to_device(table), out)
    np.testing.assert_array_equal(out.copy_to_host(), reference.embedding(ids, table))


@given(problems())
def test_host_ids_are_accepted(problem):
    table, ids = problem
    out = poisoned((ids.size, table.shape[1]))
    embedding(ids, cuda.to_device(table), out)
    np.testing.assert_array_equal(out.copy_to_host(), reference.embedding(ids, table))


@pytest.mark.parametrize("bad_id", [-1, 50, 12345, -(2**31)])
def test_host_ids_outside_the_vocabulary_are_rejected_before_launch(bad_id):
    rng = np.random.default_rng(0)
    table = random_bf16(rng, (50, 16))
    ids = np.array([3, 7, bad_id, 1], dtype=np.int32)
    out = poisoned((4, 16))
    with pytest.raises(ValueError, match=rf"token_ids: id {bad_id} at position 2 .*\[0, 50\)"):
        embedding(ids, cuda.to_device(table), out)
    assert np.all(out.copy_to_host() == BF16_NAN)


def test_device_ids_outside_the_vocabulary_give_nan_rows_and_no_stray_reads():
    rng = np.random.default_rng(1)
    table = random_bf16(rng, (50, 24))
    ids = np.array([3, 50, -1, 49, 2**31 - 1], dtype=np.int32)
    out = cuda.to_device(np.zeros((5, 24), np.uint16))
    embedding(cuda.to_device(ids), cuda.to_device(table), out)
    result = out.copy_to_host()
    valid = (ids >= 0) & (ids < 50)
    np.testing.assert_array_equal(result[valid], table[ids[valid]])
    assert np.all(result[~valid] == BF16_NAN)


def _valid_arguments():
    rng = np.random.default_rng(2)
    return {
        "token_ids": cuda.to_device(np.array([1, 2, 3], dtype=np.int32)),
        "table": cuda.to_device(random_bf16(rng, (10, 16))),
        "out": poisoned((3, 16)),
    }


BAD_ARGUMENTS = [
    ("token_ids", lambda: cuda.to_device(np.array([1, 2, 3], dtype=np.int64))),
    ("token_ids", lambda: cuda.to_device(np.array([[1, 2, 3]], dtype=np.int32))),
    ("token_ids", lambda: cuda.to_device(np.arange(6, dtype=np.int32))[::2]),
    ("table", lambda: cuda.to_device(np.zeros((10, 16), np.float32))),
    ("table", lambda: cuda.to_device(np.zeros((10, 12), np.uint16))),
    ("table", lambda: cuda.to_device(np.zeros((10, 32), np.uint16))[:, ::2]),
    ("table", lambda: cuda.to_device(np.zeros(161, np.uint16))[1:].reshape(10, 16)),
    ("out", lambda: poisoned((3, 8))),
    ("out", lambda: poisoned((4, 16))),
    ("out", lambda: poisoned((3, 16), np.float32)),
    ("out", lambda: poisoned((3, 32))[:, ::2]),
]


@pytest.mark.parametrize("name, make_bad", BAD_ARGUMENTS)
def test_bad_arguments_are_rejected_by_name(name, make_bad):
    arguments = _valid_arguments()
    arguments[name] = make_bad()
    with pytest.raises(ValueError, match=f"^{name}:"):
        embedding(**arguments)


@given(st.integers(1, pick(40, 3000)), st.integers(1, 300), st.randoms(use_true_random=False))
def test_feed_copies_sampled_tokens_into_the_rows_that_name_a_source(num_tokens, num_sampled, random):
    rng = np.random.default_rng(random.getrandbits(32))
    token_ids = rng.integers(-1, 50_000, num_tokens).astype(np.int32)
    sources = np.where(rng.random(num_tokens) < 0.5, rng.integers(0, num_sampled, num_tokens), -1).astype(np.int32)
    sampled = rng.integers(0, 50_000, num_sampled).astype(np.int32)
    device_ids = cuda.to_device(token_ids)
    feed_sampled_tokens(device_ids, cuda.to_device(sources), cuda.to_device(sampled))
    expected = reference.feed_sampled_tokens(token_ids, sources, sampled)
    np.testing.assert_array_equal(device_ids.copy_to_host(), expected)
    np.testing.assert_array_equal(expected[sources < 0], token_ids[sources < 0])


def test_feed_rejects_sources_of_another_length():
    ids = cuda.to_device(np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="^token_sources:"):
        feed_sampled_tokens(ids, cuda.to_device(np.zeros(3, np.int32)), cuda.to_device(np.zeros(2, np.int32)))
