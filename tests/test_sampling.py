"""sample against the NumPy reference.

Greedy is exact (np.argmax). A sampled token is checked three ways: it is the Gumbel-max
of the reference's kept set, with the noise recomputed on the host (`rng.gumbel_noise`);
the kernel's frequencies over many seeds and offsets pass a chi-square test against
`reference.sampling_probs`; and the host noise itself, over many more draws, does too.
Rows with no filter are reduced over many blocks (parts of ROUND logits, 8 under the
simulator), so vocabularies of a few dozen tokens already span several parts; such a row
must draw the very token the one-block path draws.
"""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from numba import cuda

from tests.helpers import pick, poisoned
from tinyvllm.kernels import reference, sampling
from tinyvllm.kernels.device.rng import GUMBEL_MAX, gumbel_noise
from tinyvllm.kernels.sampling import (
    MAX_PART_BLOCKS,
    MAX_PARTS,
    MAX_VOCAB,
    ROUND,
    pack_sampling_params,
    sample,
    sample_workspace_shape,
    split_vocab,
)

# The top-p histogram adds 64-bit masses as two 32-bit words; the simulator's atomic add
# warns when a low word wraps, which the kernel detects and carries.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in scalar add:RuntimeWarning")

# Top-p decisions closer than this (relative to top_p) to a crossing may go either way:
# the kernel sums float32 weights in fixed point, the reference float64 weights.
TOP_P_MARGIN = 1e-4
# The upper 1e-6 tail of chi-square (Wilson-Hilferty; above the exact quantile for every df).
CHI_SQUARE_Z = 4.7534


def _integer_logits(rng, shape):
    """Small integers: many ties, and zeros of both signs (equal, though their bits differ)."""
    logits = rng.integers(-4, 4, shape).astype(np.float32)
    return np.where((logits == 0) & (rng.random(shape) < 0.5), np.float32(-0.0), logits)


def _logits(rng, rows, vocab, ties):
    """Normal logits at a random scale, or small integers; a tie planted at each row's top."""
    if ties:
        logits = _integer_logits(rng, (rows, vocab))
    else:
        logits = (rng.standard_normal((rows, vocab)) * rng.choice([0.1, 1.0, 5.0])).astype(np.float32)
    for row in range(rows):
        logits[row, rng.integers(vocab)] = logits[row].max()
    return logits


def _random_params(rng, rows, vocab):
    temperature = np.where(rng.random(rows) < 0.2, 0.0, rng.uniform(0.05, 3.0, rows))
    top_k = np.where(rng.random(rows) < 0.4, -1, rng.integers(1, vocab + 3, rows))
    top_p = np.where(rng.random(rows) < 0.4, 1.0, rng.uniform(0.05, 1.0, rows))
    seeds = rng.integers(0, 2**64 - 1, rows, dtype=np.uint64, endpoint=True)
    offsets = rng.integers(0, 2**40, rows)
    return pack_sampling_params(temperature, top_k, top_p, seeds, offsets)


def _workspace(rows, vocab):
    """Poisoned, with a row to spare: the engine's workspace is sized for its largest batch."""
    shape = sample_workspace_shape(rows + 1, vocab)
    return poisoned(shape, np.float32), poisoned(shape, np.int32)


def _run_sample(logits, params):
    out = poisoned((logits.shape[0],), np.int32)
    sample(cuda.to_device(logits), *(cuda.to_device(array) for array in params), out, *_workspace(*logits.shape))
    return out.copy_to_host()


def _kept(logits_row, temperature, top_k, top_p):
    return reference.sampling_probs(logits_row, float(temperature), int(top_k), float(top_p)) > 0


def _kept_bounds(logits_row, temperature, top_k, top_p, margin=TOP_P_MARGIN):
    """The kept sets for top_p nudged down and up by `margin` (relative): inner is within outer."""
    inner = _kept(logits_row, temperature, top_k, top_p * (1 - margin))
    outer = _kept(logits_row, temperature, top_k, min(top_p * (1 + margin), 1.0))
    return inner, outer


@st.composite
def batches(draw, max_rows, max_vocab):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rows = draw(st.integers(1, max_rows))
    vocab = draw(st.one_of(st.integers(1, max_vocab), st.sampled_from(pick([32], [49152, 128256]))))
    logits = _logits(rng, rows, vocab, draw(st.booleans()))
    return logits, _random_params(rng, rows, vocab)


@given(batches(pick(3, 64), pick(40, 131072)))
def test_temperature_zero_is_argmax(batch):
    logits, params = batch
    params[0][:] = 0.0
    np.testing.assert_array_equal(_run_sample(logits, params), np.argmax(logits, axis=1))


def _assert_gumbel_argmax_of_the_kept_set(logits, params, tokens):
    """Greedy rows: np.argmax. Sampled rows: a kept token whose score is the best of the
    kept set's, up to host/device rounding of the noise."""
    for row, (temperature, top_k, top_p, seed, offset) in enumerate(zip(*params)):
        token = tokens[row]
        if temperature == 0:
            assert token == np.argmax(logits[row]), f"row {row}: not the argmax"
            continue
        inner, outer = _kept_bounds(logits[row], temperature, top_k, top_p)
        assert 0 <= token < logits.shape[1] and outer[token], f"row {row}: token {token} is filtered out"
        scores = logits[row] * (np.float32(1) / temperature) + gumbel_noise(seed, offset, logits.shape[1])
        best = scores[inner].max()
        assert scores[token] >= best - 1e-5 * (1 + abs(best)), f"row {row}: not the Gumbel-max token"


@given(batches(pick(4, 8), pick(40, 131072)))
def test_token_is_the_gumbel_argmax_of_the_kept_set(batch):
    logits, params = batch
    _assert_gumbel_argmax_of_the_kept_set(logits, params, _run_sample(logits, params))


def test_greedy_rows_of_minus_infinity_and_of_one_token():
    logits = np.full((3, 9 * ROUND // 4), -np.inf, np.float32)
    logits[1, 4:] = 0.0
    logits[2, 2 * ROUND - 1 :] = 0.0  # the first finite logit is the last of a part
    params = pack_sampling_params([0.0] * 3, [-1] * 3, [1.0] * 3, [0] * 3, [0] * 3)
    np.testing.assert_array_equal(_run_sample(logits, params), [0, 4, 2 * ROUND - 1])
    params = pack_sampling_params([0.0], [-1], [1.0], [0], [0])
    assert _run_sample(np.array([[3.0]], np.float32), params)[0] == 0


@settings(max_examples=200)
@given(st.integers(1, MAX_VOCAB - 1), st.one_of(st.just(1), st.integers(1, 4096)))
def test_split_vocab_cuts_whole_rounds_within_max_parts(vocab, rows):
    num_parts, part_size = split_vocab(vocab, rows)
    max_parts = max(1, min(MAX_PARTS, MAX_PART_BLOCKS // rows))
    assert 1 <= num_parts <= max_parts and part_size % ROUND == 0
    assert (num_parts - 1) * part_size < vocab <= num_parts * part_size
    assert part_size == ROUND or -(-vocab // (part_size - ROUND)) > max_parts, "parts longer than needed"
    assert sample_workspace_shape(5, vocab)[1] >= num_parts
    assert sample_workspace_shape(5, vocab) == (5, split_vocab(vocab)[0])


def _part_vocabs():
    """Shorter than a round, a few parts (rarely a multiple of a round), and past MAX_PARTS
    rounds, where each part holds two rounds."""
    return st.one_of(
        st.integers(1, ROUND - 1),
        st.integers(ROUND, 5 * ROUND),
        st.integers(MAX_PARTS * ROUND + 1, (MAX_PARTS + 8) * ROUND),
    )


@st.composite
def greedy_batches(draw):
    """Rows with the maximum tied across part boundaries, rows of -inf, rows of small integers."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rows = draw(st.integers(1, pick(3, 16)))
    vocab = draw(_part_vocabs())
    logits = _logits(rng, rows, vocab, draw(st.booleans()))
    num_parts, part_size = split_vocab(vocab)
    for row in range(rows):
        kind = rng.integers(4)
        if kind == 0 and num_parts > 1:  # tied across a boundary, and again in a later part
            boundary = part_size * rng.integers(1, num_parts)
            tied = [boundary - 1 - rng.integers(min(part_size, 3)), boundary, rng.integers(boundary, vocab)]
            logits[row, tied] = logits[row].max() + 1
        elif kind == 1:
            logits[row] = -np.inf
        elif kind == 2:
            logits[row, rng.random(vocab) < 0.7] = -np.inf
    return logits


@given(greedy_batches())
def test_greedy_over_parts_is_numpy_argmax(logits):
    rows = logits.shape[0]
    params = pack_sampling_params([0.0] * rows, [-1] * rows, [1.0] * rows, range(rows), range(rows))
    np.testing.assert_array_equal(_run_sample(logits, params), np.argmax(logits, axis=1))


@given(greedy_batches(), st.integers(1, 6))
def test_a_large_batch_takes_fewer_longer_parts(logits, max_part_blocks):
    """The workspace keeps one row's width; a batch cut into fewer parts uses the first columns."""
    rows = logits.shape[0]
    params = pack_sampling_params([0.0] * rows, [-1] * rows, [1.0] * rows, range(rows), range(rows))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sampling, "MAX_PART_BLOCKS", max_part_blocks)
        tokens = _run_sample(logits, params)
    np.testing.assert_array_equal(tokens, np.argmax(logits, axis=1))


@given(st.integers(0, 2**32 - 1), _part_vocabs().filter(lambda vocab: vocab >= 2), st.booleans())
def test_an_unfiltered_row_draws_the_one_block_token(seed, vocab, ties):
    """With its two lowest logits tied, top_k = V - 1 keeps every token of a row but sends it
    down the filtered, one-block path: the draw over parts (top_k = -1) must be the same
    token, bit for bit, at every offset; and the host's Gumbel argmax where it is clear."""
    rng = np.random.default_rng(seed)
    row = _logits(rng, 1, vocab, ties)[0]
    row[rng.choice(vocab, 2, replace=False)] = row.min()
    draws = pick(3, 16)
    temperature = np.float32(rng.uniform(0.05, 3.0))
    offsets = list(range(draws)) * 2
    params = pack_sampling_params(
        [temperature] * 2 * draws, [-1] * draws + [vocab - 1] * draws, [1.0] * 2 * draws, [seed] * 2 * draws, offsets
    )
    tokens = _run_sample(np.tile(row, (2 * draws, 1)), params)
    np.testing.assert_array_equal(tokens[:draws], tokens[draws:])
    for offset, token in enumerate(tokens[:draws]):
        scores = row * (np.float32(1) / temperature) + gumbel_noise(seed, offset, vocab)
        assert _clear_winner(scores) in (None, token), f"offset {offset}: not the Gumbel-max token"


@given(st.integers(0, 2**32 - 1), _part_vocabs().filter(lambda vocab: vocab >= 2))
def test_each_row_of_a_mixed_batch_gets_its_own_token(seed, vocab):
    """Greedy, unfiltered, top-k, top-p and both, shuffled in one batch: each row is right."""
    rng = np.random.default_rng(seed)
    kinds = [(0.0, -1, 1.0), (0.8, -1, 1.0), (0.8, vocab + 1, 1.0), (1.3, max(1, vocab // 3), 1.0),
             (0.8, -1, 0.7), (0.6, max(1, vocab // 2), 0.8)]  # fmt: skip
    order = rng.permutation(len(kinds))
    temperature, top_k, top_p = (list(column) for column in zip(*(kinds[i] for i in order)))
    rows = len(kinds)
    params = pack_sampling_params(temperature, top_k, top_p, rng.integers(0, 2**63, rows), rng.integers(0, 2**40, rows))
    logits = _logits(rng, rows, vocab, rng.random() < 0.5)
    _assert_gumbel_argmax_of_the_kept_set(logits, params, _run_sample(logits, params))


@st.composite
def filtered_rows(draw):
    """A row whose filters keep some tokens and drop others, clear of top-p edges.

    Half the time top_p sits 2e-5 (relative) off a crossing of the cumulative
    distribution, so that an error in the kernel's mass sums would change the kept set.
    """
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    vocab = draw(st.integers(4, pick(40, 1024)))
    ties = draw(st.booleans())
    row = _integer_logits(rng, vocab) if ties else rng.standard_normal(vocab).astype(np.float32)
    temperature = np.float32(draw(st.floats(0.5, 3.0)))
    top_k = draw(st.one_of(st.just(-1), st.integers(1, vocab - 1)))
    top_p = np.float32(draw(st.one_of(st.just(1.0), st.floats(0.2, 0.95))))
    margin = TOP_P_MARGIN
    if draw(st.booleans()):
        probs = reference.sampling_probs(row, float(temperature), top_k, 1.0)
        crossings = np.cumsum(np.sort(probs[probs > 0])[::-1])[:-1]
        assume(crossings.size > 0)
        crossing = crossings[draw(st.integers(0, crossings.size - 1))]
        top_p = np.float32(crossing * (1 + draw(st.sampled_from([-2e-5, 2e-5]))))
        margin = 1e-5
    inner, outer = _kept_bounds(row, temperature, top_k, top_p, margin)
    assume(np.array_equal(inner, outer) and 0 < inner.sum() < vocab)
    return row, temperature, top_k, top_p, inner, int(rng.integers(0, 2**63))


def _clear_winner(scores):
    """The argmax, if it beats the runner-up by more than host/device rounding can move it."""
    first, second = np.sort(scores)[-2:][::-1] if scores.size > 1 else (scores.max(), -np.inf)
    return int(np.argmax(scores)) if first - second > 1e-3 * (1 + abs(first)) else None


@given(filtered_rows())
def test_filters_keep_exactly_the_reference_set(case):
    """Offsets chosen so that a threshold one logit off would draw another token: a dropped
    token of the highest dropped logit beats every kept one (a threshold too low lets it
    win), or the winner is a kept token of the lowest kept logit (one too high drops it)."""
    row, temperature, top_k, top_p, kept, seed = case
    scores = row * (np.float32(1) / temperature) + np.stack(
        [gumbel_noise(seed, offset, row.size) for offset in range(pick(1000, 2000))]
    )
    lowest_kept, highest_dropped = row[kept].min(), row[~kept].max()
    offsets, expected = [], []
    dropped_winners, edge_winners = set(), set()  # up to three different tokens of each kind
    for offset, offset_scores in enumerate(scores):
        winner = _clear_winner(np.where(kept, offset_scores, -np.inf))
        overall = _clear_winner(offset_scores)
        if winner is None or overall is None:
            continue
        dropped_wins = not kept[overall] and row[overall] == highest_dropped
        if dropped_wins and overall not in dropped_winners and len(dropped_winners) < 3:
            dropped_winners.add(overall)
            offsets.append(offset)
            expected.append(winner)
        elif row[winner] == lowest_kept and winner not in edge_winners and len(edge_winners) < 3:
            edge_winners.add(winner)
            offsets.append(offset)
            expected.append(winner)
    assume(dropped_winners and edge_winners)
    rows = len(offsets)
    params = pack_sampling_params(
        [temperature] * rows, [top_k] * rows, [top_p] * rows, [seed] * rows, offsets
    )
    np.testing.assert_array_equal(_run_sample(np.tile(row, (rows, 1)), params), expected)


def test_ties_at_the_edge_are_kept_whatever_the_sign_of_zero():
    """The edge is a tie of +0.0 and -0.0 (equal values, different bits), cut by top-k and by top-p."""
    row = np.array([1.0, 0.0, -0.0, -1.0, 0.0, -0.0, -2.0, -0.0], np.float32)
    draws = 64
    top_k, top_p = [2] * draws + [-1] * draws, [1.0] * draws + [0.5] * draws
    params = pack_sampling_params([1.0] * 2 * draws, top_k, top_p, [3] * 2 * draws, list(range(draws)) * 2)
    tokens = _run_sample(np.tile(row, (2 * draws, 1)), params)
    for drawn, top_k, top_p in ((tokens[:draws], 2, 1.0), (tokens[draws:], -1, 0.5)):
        kept = np.flatnonzero(_kept(row, 1.0, top_k, top_p))
        np.testing.assert_array_equal(kept, [0, 1, 2, 4, 5, 7])
        np.testing.assert_array_equal(np.unique(drawn), kept)


@given(batches(pick(4, 32), pick(40, 4096)), st.integers(0, 2**32 - 1))
def test_a_token_depends_only_on_its_row(batch, shuffle_seed):
    """Same logits, parameters, seed and offset: same token, wherever the row sits in the batch."""
    logits, params = batch
    tokens = _run_sample(logits, params)
    rng = np.random.default_rng(shuffle_seed)
    others, other_params = _logits(rng, 3, logits.shape[1], False), _random_params(rng, 3, logits.shape[1])
    order = rng.permutation(logits.shape[0] + 3)
    mixed = np.concatenate([logits, others])[order]
    mixed_params = tuple(np.concatenate([a, b])[order] for a, b in zip(params, other_params))
    position = np.argsort(order)[: logits.shape[0]]
    np.testing.assert_array_equal(_run_sample(mixed, mixed_params)[position], tokens)


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
    row = _logits(rng, 1, vocab, draw(st.booleans()))[0]
    temperature = np.float32(draw(st.floats(0.5, 2.0)))
    top_k = draw(st.one_of(st.just(-1), st.integers(1, vocab)))
    top_p = np.float32(draw(st.one_of(st.just(1.0), st.floats(0.3, 1.0))))
    inner, outer = _kept_bounds(row, temperature, top_k, top_p)
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
    tokens = _run_sample(np.tile(row, (draws, 1)), params)
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


def _valid_inputs(rows=2, vocab=3 * ROUND):
    logits = np.zeros((rows, vocab), np.float32)
    params = pack_sampling_params([1.0] * rows, [-1] * rows, [1.0] * rows, range(rows), range(rows))
    shape = sample_workspace_shape(rows, vocab)
    return logits, params, np.zeros(rows, np.int32), np.zeros(shape, np.float32), np.zeros(shape, np.int32)


@pytest.mark.parametrize(
    "change, name",
    [
        (lambda a: a.__setitem__(0, a[0].astype(np.float64)), "logits"),
        (lambda a: a.__setitem__(0, a[0][:, ::2]), "logits"),
        (lambda a: a.__setitem__(0, a[0][0]), "logits"),
        (lambda a: a.__setitem__(0, np.zeros((2, 0), np.float32)), "logits"),
        (lambda a: a.__setitem__(0, np.zeros((1, MAX_VOCAB), np.float32)), "logits"),
        (lambda a: a.__setitem__(1, a[1][:1]), "temperature"),
        (lambda a: a.__setitem__(2, a[2].astype(np.int64)), "top_k"),
        (lambda a: a.__setitem__(3, a[3].astype(np.float64)), "top_p"),
        (lambda a: a.__setitem__(4, a[4].astype(np.int64)), "seeds"),
        (lambda a: a.__setitem__(5, a[5].astype(np.int32)), "offsets"),
        (lambda a: a.__setitem__(6, np.zeros(3, np.int32)), "out"),
        (lambda a: a.__setitem__(7, a[7].astype(np.float64)), "part_values"),
        (lambda a: a.__setitem__(7, a[7][:1]), "part_values"),
        (lambda a: a.__setitem__(7, np.zeros((2, MAX_PARTS + 1), np.float32)), "part_values"),
        (lambda a: a.__setitem__(7, np.zeros((2, 2 * a[7].shape[1]), np.float32)[:, ::2]), "part_values"),
        (lambda a: a.__setitem__(7, a[7][0]), "part_values"),
        (lambda a: a.__setitem__(8, a[8].astype(np.int64)), "part_indices"),
        (lambda a: a.__setitem__(8, a[8][:1]), "part_indices"),
        (lambda a: a.__setitem__(8, a[8].astype(np.float32)), "part_indices"),
    ],
)
def test_sample_rejects_bad_arguments(change, name):
    logits, params, out, part_values, part_indices = _valid_inputs()
    arguments = [logits, *params, out, part_values, part_indices]
    change(arguments)
    with pytest.raises(ValueError, match=name):
        sample(*arguments)


def test_pack_sampling_params_types_and_values():
    packed = pack_sampling_params([0, 0.7], [-1, 50], [1, 0.9], [0, 2**64 - 1], [0, 2**63 - 1])
    assert [a.dtype for a in packed] == [np.float32, np.int32, np.float32, np.uint64, np.int64]
    np.testing.assert_array_equal(packed[1], [-1, 50])
    assert packed[3][1] == 2**64 - 1 and packed[4][1] == 2**63 - 1
    assert packed[2][1] == np.float32(0.9)


@pytest.mark.parametrize(
    "arguments, name",
    [
        (([-0.1], [-1], [1.0], [0], [0]), "temperature"),
        (([math.nan], [-1], [1.0], [0], [0]), "temperature"),
        (([1.0], [0], [1.0], [0], [0]), "top_k"),
        (([1.0], [-2], [1.0], [0], [0]), "top_k"),
        (([1.0], [-1], [0.0], [0], [0]), "top_p"),
        (([1.0], [-1], [1.5], [0], [0]), "top_p"),
        (([1.0], [-1], [1.0], [-1], [0]), "seeds"),
        (([1.0], [-1], [1.0], [2**64], [0]), "seeds"),
        (([1.0], [-1], [1.0], [0], [-1]), "offsets"),
        (([1.0, 1.0], [-1], [1.0], [0], [0]), "one value per row"),
    ],
)
def test_pack_sampling_params_rejects_bad_values(arguments, name):
    with pytest.raises(ValueError, match=name):
        pack_sampling_params(*arguments)
