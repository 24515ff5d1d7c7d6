"""Shared helpers for the tests: the world we are in, poisoned outputs, error norms, logits."""

import os

import numpy as np
import pytest
from hypothesis import settings
from numba import cuda

from tinyvllm.kernels.reference import from_bf16, to_bf16
from tinyvllm.sampling_params import SamplingParams

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
BF16_NAN = np.uint16(0x7FC0)
BF16_TOLERANCE = 1e-2


def pick(simulator_value, gpu_value):
    """Tiny sizes under the simulator, model-sized ones on the GPU."""
    return simulator_value if SIMULATOR else gpu_value


def sharded(count: int):
    """Splits a property's examples over `count` test items, each with a `count`th of the
    profile's examples; the test takes `shard` as its first argument (Hypothesis fills the
    last ones). pytest-xdist runs the items on different workers, so a property whose
    examples each compile new kernels no longer holds one worker for minutes; Hypothesis
    gives each parametrized item its own seed. Under the simulator there is one item, shard 0
    (the `shard` fixture), with a `count`th of the examples: these properties' model-sized
    draws (K of 4,096) take minutes an example there, and the GPU runs them all."""
    share = settings(max_examples=max(1, settings.default.max_examples // count))

    def decorate(test):
        test = share(test)
        return test if SIMULATOR else pytest.mark.parametrize("shard", range(count))(test)

    return decorate


def random_bf16(rng: np.random.Generator, shape, scale: float = 1.0) -> np.ndarray:
    return to_bf16(rng.standard_normal(shape) * scale)


def poisoned(shape, dtype=np.uint16):
    """A device array filled with NaN (bf16 or float32) or -1 (integers): unwritten output shows."""
    dtype = np.dtype(dtype)
    if dtype == np.uint16:
        fill = BF16_NAN
    elif dtype.kind == "f":
        fill = np.nan
    else:
        fill = -1
    return cuda.to_device(np.full(shape, fill, dtype=dtype))


def relative_error(actual, expected) -> float:
    """||actual - expected|| / ||expected|| in float64; NaN anywhere gives inf."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if not np.all(np.isfinite(actual)):
        return float("inf")
    norm = np.linalg.norm(expected)
    return float(np.linalg.norm(actual - expected) / (norm if norm > 0 else 1.0))


def widen(bits) -> np.ndarray:
    """Device or host bf16 bits -> float64 on the host."""
    if hasattr(bits, "copy_to_host"):
        bits = bits.copy_to_host()
    return from_bf16(bits).astype(np.float64)


def assert_no_leak(llm) -> None:
    """Every request finished and every KV block back in the free list."""
    scheduler = llm.engine.scheduler
    assert not scheduler.has_unfinished()
    assert scheduler.num_free_blocks == scheduler.allocator.num_blocks


def next_token_logits(llm, prompt_ids: list[int]) -> np.ndarray:
    """An engine's float32 logits for the token after prompt_ids (its step's one sampled row), in float64."""
    engine = llm.engine
    engine.add_request(prompt_ids, SamplingParams(temperature=0.0, max_tokens=1))
    while engine.has_unfinished_requests():
        engine.step()  # one to launch the prefill, one to collect its token
    row = engine.runner.workspace.logits[0]
    return (row.copy_to_host() if hasattr(row, "copy_to_host") else np.array(row)).astype(np.float64)


def assert_parts_only_at_near_ties(reference, llm, prompts, actual, expected, max_partings: int, exact=None) -> None:
    """Greedy tokens `actual` from `llm` against the reference's `expected`, prompt by prompt.

    Each run equals the reference's or parts from it at a near-tie: where the two choices
    are closer under the reference than the two engines' largest logit disagreement at
    that point. Two correct bf16 pipelines round differently and their logits drift apart
    by about 1e-2 over the layers, so runs part at near-ties now and then; a
    wrong kernel or a batching bug parts with a gap the disagreement does not cover, or
    on many prompts. At most `max_partings` runs may part, not counting those where
    `exact` (an engine nearer the true forward, float32) prefers llm's token, or separates the
    two by less than the reference's own largest distance from it after that prefix: a tie the
    reference's rounding cannot settle, so which side it takes depends on its host (the bf16
    NumPy reference's tokens change with OpenBLAS's kernels).
    """
    partings = 0
    for prompt, ours, theirs in zip(prompts, actual, expected, strict=True):
        if ours == theirs:
            continue
        at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        assert at is not None, f"same tokens, different lengths: {len(ours)} against {len(theirs)}"
        prefix = list(prompt) + theirs[:at]
        reference_logits = next_token_logits(reference, prefix)
        disagreement = np.abs(next_token_logits(llm, prefix) - reference_logits).max()
        gap = reference_logits[theirs[at]] - reference_logits[ours[at]]
        exact_margin, reference_spread = np.inf, 0.0
        if exact is not None:
            exact_logits = next_token_logits(exact, prefix)
            exact_margin = exact_logits[theirs[at]] - exact_logits[ours[at]]
            reference_spread = np.abs(reference_logits - exact_logits).max()
        print(f"parting at token {at}: ours {ours[at]}, reference {theirs[at]}; reference logit gap {gap:.4f}, "
              f"largest disagreement {disagreement:.4f}; exact margin {exact_margin:.4f}, "
              f"reference's distance from exact {reference_spread:.4f}")  # fmt: skip
        assert gap <= disagreement, (at, ours[at], theirs[at], gap, disagreement)
        partings += exact_margin > reference_spread
    assert partings <= max_partings, partings


def sass_listing(lines: list[str]) -> str:
    """SASS text in nvdisasm's layout: labels (".L_x_N") on lines of their own, each
    instruction after its address."""
    out, address = [".text.kernel:"], 0
    for line in lines:
        if line.startswith(".L_x_"):
            out.append(f"{line}:")
        else:
            out.append(f"        /*{address:04x}*/                   {line} ;")
            address += 16
    return "\n".join(out)
