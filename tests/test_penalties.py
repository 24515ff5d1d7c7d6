"""The penalty, count and min-p kernels against float64 NumPy oracles.

The oracle builds each row's counts and seen set from the token lists themselves (not from
the packed words the kernels read), so a packing mistake fails here. The kernels change
logits in place: rows they must leave alone are checked to be untouched, bit for bit.
"""

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from tests.helpers import pick
from tinyvllm.kernels import penalties, reference
from tinyvllm.kernels.token_state import token_state_row

MAX_ROWS = pick(4, 256)
MAX_VOCAB = pick(40, 128256)
MIN_P_EDGE = 1e-4
"""Tokens this close (in log-probability) to min-p's threshold may fall either way in float32."""


@st.composite
def penalized_rows(draw):
    """Logits, the token lists of each row's sequence, its slot (-1: none) and parameters."""
    rows = draw(st.integers(1, MAX_ROWS))
    vocab = draw(st.integers(1, MAX_VOCAB))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    num_slots = rows + draw(st.integers(0, 3))
    slots = rng.permutation(num_slots)[:rows].astype(np.int32)
    slots[rng.random(rows) < 0.25] = -1
    sequences = [
        {
            "prompt": rng.integers(0, vocab, size=int(rng.integers(0, 12))),
            "output": rng.integers(0, vocab, size=int(rng.integers(0, 12))),
            "stops": rng.integers(0, vocab, size=int(rng.integers(0, 3))),
        }
        for _ in range(rows)
    ]
    params = {
        "presence": rng.uniform(-2, 2, rows).astype(np.float32),
        "frequency": rng.uniform(-2, 2, rows).astype(np.float32),
        "repetition": rng.choice([1.0, 0.5, 1.3, 2.0], rows).astype(np.float32),
        "mask_stop_tokens": rng.integers(0, 2, rows).astype(np.int32),
    }
    return logits, num_slots, slots, sequences, params


def _state(num_slots, slots, sequences, vocab):
    """token_state with each sequence's row in its slot and garbage in the free slots."""
    state = np.random.default_rng(0).integers(0, 5, size=(num_slots, vocab)).astype(np.int32)
    for slot, seq in zip(slots, sequences):
        if slot >= 0:
            state[slot] = token_state_row(vocab, seq["prompt"], seq["output"], seq["stops"])
    return state


def _expected_penalized(logits, slots, sequences, params):
    expected = logits.astype(np.float64)
    vocab = logits.shape[1]
    for row, (slot, seq) in enumerate(zip(slots, sequences)):
        if slot < 0:
            continue
        counts = np.bincount(seq["output"], minlength=vocab)
        seen = np.zeros(vocab, bool)
        seen[seq["prompt"]] = seen[seq["output"]] = True
        expected[row] = reference.apply_penalties(
            expected[row],
            counts,
            seen,
            float(params["presence"][row]),
            float(params["frequency"][row]),
            float(params["repetition"][row]),
        )
        if params["mask_stop_tokens"][row]:
            expected[row, seq["stops"]] = -np.inf
    return expected


@given(penalized_rows())
def test_penalties_match_the_float64_reference(case):
    logits, num_slots, slots, sequences, params = case
    state = _state(num_slots, slots, sequences, logits.shape[1])
    device_logits = cuda.to_device(logits)
    penalties.apply_penalties(
        device_logits,
        cuda.to_device(state),
        cuda.to_device(slots),
        *(cuda.to_device(params[name]) for name in ("presence", "frequency", "repetition", "mask_stop_tokens")),
    )
    actual = device_logits.copy_to_host()
    expected = _expected_penalized(logits, slots, sequences, params)
    np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(expected))
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-5)
    np.testing.assert_array_equal(actual[slots < 0], logits[slots < 0])


@given(penalized_rows())
def test_count_update_adds_each_sampled_token_to_its_slot(case):
    logits, num_slots, slots, sequences, _ = case
    vocab = logits.shape[1]
    state = _state(num_slots, slots, sequences, vocab)
    sampled = np.random.default_rng(1).integers(0, vocab, size=slots.shape[0]).astype(np.int32)
    device_state = cuda.to_device(state)
    penalties.count_sampled_tokens(device_state, cuda.to_device(slots), cuda.to_device(sampled))
    expected = state.copy()
    for slot, token in zip(slots, sampled):
        if slot >= 0:
            expected[slot, token] += 1
    np.testing.assert_array_equal(device_state.copy_to_host(), expected)


@given(
    st.integers(1, MAX_ROWS),
    st.integers(1, MAX_VOCAB),
    st.integers(0, 2**32 - 1),
)
def test_min_p_masks_what_the_reference_masks(rows, vocab, seed):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((rows, vocab)) * rng.uniform(0.5, 8)).astype(np.float32)
    logits[rng.random((rows, vocab)) < 0.1] = -np.inf
    logits[:, rng.integers(0, vocab)] = 1.0  # every row keeps a finite logit
    temperature = np.where(rng.random(rows) < 0.25, 0.0, rng.uniform(0.1, 2.0, rows)).astype(np.float32)
    min_p = np.where(rng.random(rows) < 0.2, 0.0, rng.uniform(0.0, 1.0, rows)).astype(np.float32)
    device_logits = cuda.to_device(logits)
    penalties.apply_min_p(device_logits, cuda.to_device(temperature), cuda.to_device(min_p))
    actual = device_logits.copy_to_host()
    for row in range(rows):
        t, p = float(temperature[row]), float(min_p[row])
        expected = reference.min_p_filter(logits[row].astype(np.float64), t, p)
        if t == 0 or p == 0:
            np.testing.assert_array_equal(actual[row], logits[row])
            continue
        distance = np.abs((logits[row].astype(np.float64) - logits[row].max()) / t - math.log(p))
        clear = ~np.isneginf(logits[row]) & (distance > MIN_P_EDGE)
        np.testing.assert_array_equal(np.isneginf(actual[row])[clear], np.isneginf(expected)[clear])
        kept = ~np.isneginf(actual[row])
        np.testing.assert_array_equal(actual[row][kept], logits[row][kept])
        assert np.isneginf(actual[row][np.isneginf(logits[row])]).all()
