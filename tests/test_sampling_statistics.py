"""sample's frequencies against the reference distribution, and the host noise's own.

The kernel's tokens over many seeds and offsets pass a chi-square test against
`reference.sampling_probs`; and the host noise (`reference.gumbel_noise`), over many more
draws, does too.
"""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.helpers import pick
from tests.sampling_cases import kept_bounds, pack_sampling_params, random_logits, run_sample
from tinyvllm.kernels import reference
from tinyvllm.kernels.device.rng import GUMBEL_MAX
from tinyvllm.kernels.reference import gumbel_noise

# The top-p histogram adds 64-bit masses as two 32-bit words; the simulator's atomic add
# warns when a low word wraps, which the kernel detects and carries.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in scalar add:RuntimeWarning")

# The upper 1e-6 tail of chi-square (Wilson-Hilferty; above the exact quantile for every df).
CHI_SQUARE_Z = 4.7534


def _chi_square_statistic(counts, probs):
    """Pearson's statistic and degrees of freedom, pooling bins expected below 5 draws."""
    expected = probs * counts.sum()
    order = np.argsort(expected)
    observed_bins, expected_bins, pool_observed, pool_expected = [], [], 0.0, 0.0
    for i in order:
        if expected[i] == 0:
            continue
        pool_observed += counts[i]
        pool_expected += expected[i]
        if pool_expected >= 5:
            observed_bins.append(pool_observed)
            expected_bins.append(pool_expected)
            pool_observed = pool_expected = 0.0
    if expected_bins:
        observed_bins[-1] += pool_observed
        expected_bins[-1] += pool_expected
    observed_bins, expected_bins = np.array(observed_bins), np.array(expected_bins)
    return float(np.sum((observed_bins - expected_bins) ** 2 / expected_bins)), len(expected_bins) - 1


def _assert_frequencies_match(tokens, probs):
    assert np.all(probs[tokens] > 0), "a token outside the kept set"
    statistic, df = _chi_square_statistic(np.bincount(tokens, minlength=probs.size), probs)
    if df == 0:
        return
    limit = df * (1 - 2 / (9 * df) + CHI_SQUARE_Z * math.sqrt(2 / (9 * df))) ** 3
    assert statistic <= limit, f"chi-square {statistic:.1f} > {limit:.1f} with {df} degrees of freedom"


@st.composite
def distributions(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    vocab = draw(st.integers(8, 16))
    row = random_logits(rng, 1, vocab, draw(st.booleans()))[0]
    temperature = np.float32(draw(st.floats(0.5, 2.0)))
    top_k = draw(st.one_of(st.just(-1), st.integers(1, vocab)))
    top_p = np.float32(draw(st.one_of(st.just(1.0), st.floats(0.3, 1.0))))
    inner, outer = kept_bounds(row, temperature, top_k, top_p)
    assume(np.array_equal(inner, outer))
    probs = reference.sampling_probs(row, float(temperature), top_k, float(top_p))
    return row, temperature, top_k, top_p, probs, int(rng.integers(0, 2**63))


@settings(max_examples=pick(2, 20))
@given(distributions())
def test_sampled_frequencies_match_the_reference(distribution):
    """Half the draws vary the seed at one offset, half the offset under one seed."""
    row, temperature, top_k, top_p, probs, seed = distribution
    draws = pick(200, 20000)
    half = draws // 2
    seed_steps = np.concatenate([np.arange(half), np.zeros(draws - half, np.int64)]).astype(np.uint64)
    seeds = np.uint64(seed) + seed_steps
    offsets = np.concatenate([np.full(half, 7), np.arange(draws - half)]).astype(np.int64)
    params = pack_sampling_params([temperature] * draws, [top_k] * draws, [top_p] * draws, seeds, offsets)
    tokens = run_sample(np.tile(row, (draws, 1)), params)
    _assert_frequencies_match(tokens, probs)


@settings(max_examples=pick(4, 20))
@given(distributions())
def test_the_noise_samples_the_reference_distribution(distribution):
    """The Gumbel-max draw with the kernel's noise, on the host, over many offsets."""
    row, temperature, top_k, top_p, probs, seed = distribution
    scores = row * (np.float32(1) / temperature)
    noise = np.stack([gumbel_noise(seed, offset, row.size) for offset in range(20000)])
    tokens = np.argmax(np.where(probs > 0, scores + noise, -np.inf), axis=1)
    _assert_frequencies_match(tokens, probs)


def test_gumbel_max_bounds_the_noise():
    """The kernel skips tokens that GUMBEL_MAX says cannot win; the largest G is that of U = 2**-33."""
    largest = -np.log(-np.log1p(-np.float32(2.0**-33)))
    assert np.isfinite(largest) and largest < GUMBEL_MAX
    noise = np.stack([gumbel_noise(seed, 0, 4096) for seed in range(16)])
    assert noise.max() <= largest


def test_noise_differs_between_seeds_offsets_and_tokens():
    noise = np.stack([gumbel_noise(seed, offset, 64) for seed in (0, 1, 2**63) for offset in (0, 1, 2**40)])
    assert len(np.unique(noise)) == noise.size
