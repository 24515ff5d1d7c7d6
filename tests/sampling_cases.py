"""What the sampling tests share: logits with ties, random parameters, the packer, a runner.

`pack_sampling_params` builds `sample`'s parameter arrays from Python values and checks
them, so every case the tests make is one the engine could be sent.
"""

from collections.abc import Sequence

import numpy as np
from hypothesis import strategies as st
from numba import cuda

from tests.helpers import pick, poisoned
from tinyvllm.kernels import reference
from tinyvllm.kernels.sampling import sample, sample_workspace_shape

# Top-p decisions closer than this (relative to top_p) to a crossing may go either way:
# the kernel sums float32 weights in fixed point, the reference float64 weights.
TOP_P_MARGIN = 1e-4


def integer_logits(rng, shape):
    """Small integers: many ties, and zeros of both signs (equal, though their bits differ)."""
    logits = rng.integers(-4, 4, shape).astype(np.float32)
    return np.where((logits == 0) & (rng.random(shape) < 0.5), np.float32(-0.0), logits)


def random_logits(rng, rows, vocab, ties):
    """Normal logits at a random scale, or small integers; a tie planted at each row's top."""
    if ties:
        logits = integer_logits(rng, (rows, vocab))
    else:
        logits = (rng.standard_normal((rows, vocab)) * rng.choice([0.1, 1.0, 5.0])).astype(np.float32)
    for row in range(rows):
        logits[row, rng.integers(vocab)] = logits[row].max()
    return logits


def random_params(rng, rows, vocab):
    temperature = np.where(rng.random(rows) < 0.2, 0.0, rng.uniform(0.05, 3.0, rows))
    top_k = np.where(rng.random(rows) < 0.4, -1, rng.integers(1, vocab + 3, rows))
    top_p = np.where(rng.random(rows) < 0.4, 1.0, rng.uniform(0.05, 1.0, rows))
    seeds = rng.integers(0, 2**64 - 1, rows, dtype=np.uint64, endpoint=True)
    offsets = rng.integers(0, 2**40, rows)
    return pack_sampling_params(temperature, top_k, top_p, seeds, offsets)


def poisoned_workspace(rows, vocab):
    """Poisoned, with a row to spare: the engine's workspace is sized for its largest batch."""
    shape = sample_workspace_shape(rows + 1, vocab)
    return poisoned(shape, np.float32), poisoned(shape, np.int32)


def run_sample(logits, params):
    """The tokens `sample` draws for logits with params (`pack_sampling_params`'s arrays)."""
    out = poisoned((logits.shape[0],), np.int32)
    device_params = (cuda.to_device(array) for array in params)
    sample(cuda.to_device(logits), *device_params, out, *poisoned_workspace(*logits.shape))
    return out.copy_to_host()


def kept_set(logits_row, temperature, top_k, top_p):
    return reference.sampling_probs(logits_row, float(temperature), int(top_k), float(top_p)) > 0


def kept_bounds(logits_row, temperature, top_k, top_p, margin=TOP_P_MARGIN):
    """The kept sets for top_p nudged down and up by `margin` (relative): inner is within outer."""
    inner = kept_set(logits_row, temperature, top_k, top_p * (1 - margin))
    outer = kept_set(logits_row, temperature, top_k, min(top_p * (1 + margin), 1.0))
    return inner, outer


@st.composite
def batches(draw, max_rows, max_vocab):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rows = draw(st.integers(1, max_rows))
    vocab = draw(st.one_of(st.integers(1, max_vocab), st.sampled_from(pick([32], [49152, 128256]))))
    logits = random_logits(rng, rows, vocab, draw(st.booleans()))
    return logits, random_params(rng, rows, vocab)


def clear_winner(scores):
    """The argmax, if it beats the runner-up by more than host/device rounding can move it."""
    first, second = np.sort(scores)[-2:][::-1] if scores.size > 1 else (scores.max(), -np.inf)
    return int(np.argmax(scores)) if first - second > 1e-3 * (1 + abs(first)) else None


def pack_sampling_params(
    temperature: Sequence[float],
    top_k: Sequence[int],
    top_p: Sequence[float],
    seeds: Sequence[int],
    offsets: Sequence[int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Host arrays for `sample`, in its argument order, with every value checked.

    temperature >= 0 (0 = greedy), top_k -1 or >= 1, top_p in (0, 1], seeds in [0, 2**64),
    offsets in [0, 2**63). Raises ValueError naming the parameter.
    """
    columns = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seeds": seeds, "offsets": offsets}
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"one value per row for every parameter, got lengths {lengths}")
    temperature = np.asarray(temperature, dtype=np.float64)
    top_k = np.asarray(top_k, dtype=np.int64)
    top_p = np.asarray(top_p, dtype=np.float64)
    seeds = np.asarray([int(seed) for seed in seeds], dtype=object)
    offsets = np.asarray([int(offset) for offset in offsets], dtype=object)
    if not np.all(np.isfinite(temperature) & (temperature >= 0)):
        raise ValueError(f"temperature: must be finite and >= 0, got {temperature}")
    if not np.all((top_k == -1) | (top_k >= 1)):
        raise ValueError(f"top_k: must be -1 (all) or >= 1, got {top_k}")
    if not np.all((top_p > 0) & (top_p <= 1)):
        raise ValueError(f"top_p: must be in (0, 1], got {top_p}")
    if not all(0 <= seed < 2**64 for seed in seeds):
        raise ValueError(f"seeds: must be in [0, 2**64), got {seeds}")
    if not all(0 <= offset < 2**63 for offset in offsets):
        raise ValueError(f"offsets: must be in [0, 2**63), got {offsets}")
    return (
        temperature.astype(np.float32),
        np.minimum(top_k, 2**31 - 1).astype(np.int32),
        top_p.astype(np.float32),
        seeds.astype(np.uint64),
        offsets.astype(np.int64),
    )
