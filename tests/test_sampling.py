"""sample against the NumPy reference: the token of each row.

Greedy is exact (np.argmax). A sampled token is the Gumbel-max of the reference's kept
set, with the noise recomputed on the host (`reference.gumbel_noise`); the frequencies
are tested in test_sampling_statistics.py. Rows with no filter are reduced over many
blocks (parts of ROUND logits, 8 under the simulator), so vocabularies of a few dozen
tokens already span several parts; such a row must draw the very token the one-block
path draws.
"""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.helpers import pick
from tests.sampling_cases import (
    TOP_P_MARGIN,
    batches,
    clear_winner,
    integer_logits,
    kept_bounds,
    kept_set,
    pack_sampling_params,
    random_logits,
    random_params,
    run_sample,
)
from tinyvllm.kernels import reference, sampling
from tinyvllm.kernels.reference import gumbel_noise
from tinyvllm.kernels.sampling import MAX_PART_BLOCKS, MAX_PARTS, MAX_VOCAB, ROUND, sample_workspace_shape, split_vocab

# The top-p histogram adds 64-bit masses as two 32-bit words; the simulator's atomic add
# warns when a low word wraps, which the kernel detects and carries.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in scalar add:RuntimeWarning")


@given(batches(pick(3, 64), pick(40, 131072)))
def test_temperature_zero_is_argmax(batch):
    logits, params = batch
    params[0][:] = 0.0
    np.testing.assert_array_equal(run_sample(logits, params), np.argmax(logits, axis=1))


def _assert_gumbel_argmax_of_the_kept_set(logits, params, tokens):
    """Greedy rows: np.argmax. Sampled rows: a kept token whose score is the best of the
    kept set's, up to host/device rounding of the noise."""
    for row, (temperature, top_k, top_p, seed, offset) in enumerate(zip(*params)):
        token = tokens[row]
        if temperature == 0:
            assert token == np.argmax(logits[row]), f"row {row}: not the argmax"
            continue
        inner, outer = kept_bounds(logits[row], temperature, top_k, top_p)
        assert 0 <= token < logits.shape[1] and outer[token], f"row {row}: token {token} is filtered out"
        scores = logits[row] * (np.float32(1) / temperature) + gumbel_noise(seed, offset, logits.shape[1])
        best = scores[inner].max()
        assert scores[token] >= best - 1e-5 * (1 + abs(best)), f"row {row}: not the Gumbel-max token"


@given(batches(pick(4, 8), pick(40, 131072)))
def test_token_is_the_gumbel_argmax_of_the_kept_set(batch):
    logits, params = batch
    _assert_gumbel_argmax_of_the_kept_set(logits, params, run_sample(logits, params))


def test_greedy_rows_of_minus_infinity_and_of_one_token():
    logits = np.full((3, 9 * ROUND // 4), -np.inf, np.float32)
    logits[1, 4:] = 0.0
    logits[2, 2 * ROUND - 1 :] = 0.0  # the first finite logit is the last of a part
    params = pack_sampling_params([0.0] * 3, [-1] * 3, [1.0] * 3, [0] * 3, [0] * 3)
    np.testing.assert_array_equal(run_sample(logits, params), [0, 4, 2 * ROUND - 1])
    params = pack_sampling_params([0.0], [-1], [1.0], [0], [0])
    assert run_sample(np.array([[3.0]], np.float32), params)[0] == 0


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
    logits = random_logits(rng, rows, vocab, draw(st.booleans()))
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
    np.testing.assert_array_equal(run_sample(logits, params), np.argmax(logits, axis=1))


@given(greedy_batches(), st.integers(1, 6))
def test_a_large_batch_takes_fewer_longer_parts(logits, max_part_blocks):
    """The workspace keeps one row's width; a batch cut into fewer parts uses the first columns."""
    rows = logits.shape[0]
    params = pack_sampling_params([0.0] * rows, [-1] * rows, [1.0] * rows, range(rows), range(rows))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sampling, "MAX_PART_BLOCKS", max_part_blocks)
        tokens = run_sample(logits, params)
    np.testing.assert_array_equal(tokens, np.argmax(logits, axis=1))


@given(st.integers(0, 2**32 - 1), _part_vocabs().filter(lambda vocab: vocab >= 2), st.booleans())
def test_an_unfiltered_row_draws_the_one_block_token(seed, vocab, ties):
    """With its two lowest logits tied, top_k = V - 1 keeps every token of a row but sends it
    down the filtered, one-block path: the draw over parts (top_k = -1) must be the same
    token, bit for bit, at every offset; and the host's Gumbel argmax where it is clear."""
    rng = np.random.default_rng(seed)
    row = random_logits(rng, 1, vocab, ties)[0]
    row[rng.choice(vocab, 2, replace=False)] = row.min()
    draws = pick(3, 16)
    temperature = np.float32(rng.uniform(0.05, 3.0))
    offsets = list(range(draws)) * 2
    params = pack_sampling_params(
        [temperature] * 2 * draws, [-1] * draws + [vocab - 1] * draws, [1.0] * 2 * draws, [seed] * 2 * draws, offsets
    )
    tokens = run_sample(np.tile(row, (2 * draws, 1)), params)
    np.testing.assert_array_equal(tokens[:draws], tokens[draws:])
    for offset, token in enumerate(tokens[:draws]):
        scores = row * (np.float32(1) / temperature) + gumbel_noise(seed, offset, vocab)
        assert clear_winner(scores) in (None, token), f"offset {offset}: not the Gumbel-max token"


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
    logits = random_logits(rng, rows, vocab, rng.random() < 0.5)
    _assert_gumbel_argmax_of_the_kept_set(logits, params, run_sample(logits, params))


@st.composite
def filtered_rows(draw):
    """A row whose filters keep some tokens and drop others, clear of top-p edges.

    Half the time top_p sits 2e-5 (relative) off a crossing of the cumulative
    distribution, so that an error in the kernel's mass sums would change the kept set.
    """
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    vocab = draw(st.integers(4, pick(40, 1024)))
    ties = draw(st.booleans())
    row = integer_logits(rng, vocab) if ties else rng.standard_normal(vocab).astype(np.float32)
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
    inner, outer = kept_bounds(row, temperature, top_k, top_p, margin)
    assume(np.array_equal(inner, outer) and 0 < inner.sum() < vocab)
    return row, temperature, top_k, top_p, inner, int(rng.integers(0, 2**63))


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
        winner = clear_winner(np.where(kept, offset_scores, -np.inf))
        overall = clear_winner(offset_scores)
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
    params = pack_sampling_params([temperature] * rows, [top_k] * rows, [top_p] * rows, [seed] * rows, offsets)
    np.testing.assert_array_equal(run_sample(np.tile(row, (rows, 1)), params), expected)


def test_ties_at_the_edge_are_kept_whatever_the_sign_of_zero():
    """The edge is a tie of +0.0 and -0.0 (equal values, different bits), cut by top-k and by top-p."""
    row = np.array([1.0, 0.0, -0.0, -1.0, 0.0, -0.0, -2.0, -0.0], np.float32)
    draws = 64
    top_k, top_p = [2] * draws + [-1] * draws, [1.0] * draws + [0.5] * draws
    params = pack_sampling_params([1.0] * 2 * draws, top_k, top_p, [3] * 2 * draws, list(range(draws)) * 2)
    tokens = run_sample(np.tile(row, (2 * draws, 1)), params)
    for drawn, top_k, top_p in ((tokens[:draws], 2, 1.0), (tokens[draws:], -1, 0.5)):
        kept = np.flatnonzero(kept_set(row, 1.0, top_k, top_p))
        np.testing.assert_array_equal(kept, [0, 1, 2, 4, 5, 7])
        np.testing.assert_array_equal(np.unique(drawn), kept)


@given(batches(pick(4, 32), pick(40, 4096)), st.integers(0, 2**32 - 1))
def test_a_token_depends_only_on_its_row(batch, shuffle_seed):
    """Same logits, parameters, seed and offset: same token, wherever the row sits in the batch."""
    logits, params = batch
    tokens = run_sample(logits, params)
    rng = np.random.default_rng(shuffle_seed)
    others, other_params = random_logits(rng, 3, logits.shape[1], False), random_params(rng, 3, logits.shape[1])
    order = rng.permutation(logits.shape[0] + 3)
    mixed = np.concatenate([logits, others])[order]
    mixed_params = tuple(np.concatenate([a, b])[order] for a, b in zip(params, other_params))
    position = np.argsort(order)[: logits.shape[0]]
    np.testing.assert_array_equal(run_sample(mixed, mixed_params)[position], tokens)
