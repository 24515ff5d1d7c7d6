"""The logprobs kernel against the float64 NumPy oracle (`reference.logprobs`).

Outputs are poisoned before the launch, so an entry the kernel should write and does not
shows as NaN or -1, and one it should leave (rows that ask for nothing, columns past a
row's count) must still hold the poison. Some rows are drawn from a few distinct values so
that ties decide the order of the top ids and the rank.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import pick, poisoned
from tinyvllm.kernels import reference
from tinyvllm.kernels.logprobs import KEPT, THREADS, compute_logprobs
from tinyvllm.sampling_params import MAX_LOGPROBS

MAX_ROWS = pick(3, 256)
MAX_VOCAB = pick(40, 128256)
TOLERANCE = 1e-4
"""Absolute, in nats: the kernel sums exp in float32 over up to 128256 terms."""


@st.composite
def logprob_rows(draw):
    rows = draw(st.integers(1, MAX_ROWS))
    vocab = draw(st.integers(1, MAX_VOCAB))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    logits = (rng.standard_normal((rows, vocab)) * 4).astype(np.float32)
    tied = rng.random(rows) < 0.3
    logits[tied] = rng.integers(-3, 3, size=(int(tied.sum()), vocab)).astype(np.float32)
    counts = rng.integers(-1, min(MAX_LOGPROBS, vocab) + 1, size=rows).astype(np.int32)
    sampled = rng.integers(0, vocab, size=rows).astype(np.int32)
    return logits, counts, sampled


def check_against_reference(logits, counts, sampled):
    rows = logits.shape[0]
    outputs = {
        "top_ids": poisoned((rows, MAX_LOGPROBS), np.int32),
        "top_logprobs": poisoned((rows, MAX_LOGPROBS), np.float32),
        "sampled_logprobs": poisoned((rows,), np.float32),
        "sampled_ranks": poisoned((rows,), np.int32),
    }
    compute_logprobs(logits, counts, sampled, **outputs)
    got = {name: array.copy_to_host() for name, array in outputs.items()}
    for row in range(rows):
        count = int(counts[row])
        if count < 0:
            assert np.isnan(got["sampled_logprobs"][row]) and got["sampled_ranks"][row] == -1
            assert (got["top_ids"][row] == -1).all() and np.isnan(got["top_logprobs"][row]).all()
            continue
        logprob, rank, ids, values = reference.logprobs(logits[row], int(sampled[row]), count)
        assert got["sampled_logprobs"][row] == pytest.approx(logprob, abs=TOLERANCE)
        assert got["sampled_ranks"][row] == rank
        assert got["top_ids"][row, :count].tolist() == ids.tolist()
        np.testing.assert_allclose(got["top_logprobs"][row, :count], values, atol=TOLERANCE)
        assert (got["top_ids"][row, count:] == -1).all() and np.isnan(got["top_logprobs"][row, count:]).all()


@given(logprob_rows())
def test_kernel_matches_the_float64_log_softmax(case):
    check_against_reference(*case)


@pytest.mark.parametrize("clustered", [False, True])
def test_the_top_in_one_threads_share_of_the_row_takes_the_second_pass(clustered):
    """Thread t reads the logits t, t + THREADS, ...: raise 2 * KEPT of them (more than its
    registers keep) to be the row's top 2 * KEPT, or raise as many, one a thread (one pass)."""
    vocab = THREADS * 3 * KEPT
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((2, vocab)).astype(np.float32)
    raised = 3 + THREADS * np.arange(2 * KEPT) if clustered else np.arange(2 * KEPT) * (THREADS + 1)
    logits[:, raised] += 10 + np.arange(2 * KEPT, dtype=np.float32)
    check_against_reference(logits, np.full(2, 2 * KEPT, np.int32), np.array([3, 5], np.int32))


def test_reference_ranks_count_the_larger_logits_and_order_ties_by_id():
    logits = np.array([1.0, 3.0, 3.0, -2.0, 1.0], np.float32)
    logprob, rank, ids, values = reference.logprobs(logits, 4, 3)
    assert rank == 3 and ids.tolist() == [1, 2, 0]
    expected = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    assert logprob == pytest.approx(expected[4]) and values == pytest.approx(expected[[1, 2, 0]])


def test_launcher_names_a_bad_argument():
    logits = np.zeros((2, 8), np.float32)
    good = {
        "top_ids": np.zeros((2, 4), np.int32),
        "top_logprobs": np.zeros((2, 4), np.float32),
        "sampled_logprobs": np.zeros(2, np.float32),
        "sampled_ranks": np.zeros(2, np.int32),
    }
    counts, sampled = np.zeros(2, np.int32), np.zeros(2, np.int32)
    with pytest.raises(ValueError, match="top_ids: 21 columns, at most 20"):
        compute_logprobs(logits, counts, sampled, **{**good, "top_ids": np.zeros((2, 21), np.int32)})
    with pytest.raises(ValueError, match="sampled_ranks: expected dtype int32"):
        compute_logprobs(logits, counts, sampled, **{**good, "sampled_ranks": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match="logits: expected dtype float32"):
        compute_logprobs(logits.astype(np.float64), counts, sampled, **good)
