"""The engine with the prefix cache on the NumPy backend: greedy tokens are exactly those
with the cache off, under eviction, preemption and chunked prefill, and RequestOutput
reports the cached prompt tokens."""

import numpy as np
import pytest

from tests.helpers import assert_no_leak
from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir
from tinyvllm import LLM, SamplingParams


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_random_llama_dir(tmp_path_factory.mktemp("tiny"), tokenizer="bytes", config_overrides=TINY_OVERRIDES)


def _shared_prefix_prompts(count: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 256, size=int(rng.integers(6, 24))).tolist() for _ in range(3)]
    return [
        prefixes[int(rng.integers(3))] + rng.integers(0, 256, size=int(rng.integers(0, 8))).tolist()
        for _ in range(count)
    ]


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


@pytest.mark.parametrize(
    "options",
    [
        {"mode": "continuous"},
        {"mode": "static"},
        {"mode": "continuous", "max_num_batched_tokens": 16},
        {"mode": "continuous", "num_blocks": 16},  # about two sequences: eviction and preemption
    ],
    ids=["continuous", "static", "chunked", "tiny-arena"],
)
def test_greedy_tokens_are_those_without_the_cache(tiny_model, options):
    prompts = _shared_prefix_prompts(24, seed=5)
    params = [_greedy(int(n)) for n in np.random.default_rng(6).integers(1, 16, size=len(prompts))]
    limits = dict(backend="numpy", block_size=4, max_num_seqs=8, **options)
    off = LLM(tiny_model, enable_prefix_caching=False, **limits)
    on = LLM(tiny_model, **limits)
    expected = [output.outputs[0].token_ids for output in off.generate(prompts, params)]
    # Twice: the second round finds its prompts cached.
    for _ in range(2):
        outputs = on.generate(prompts, params)
        assert [output.outputs[0].token_ids for output in outputs] == expected
        assert_no_leak(on)
    scheduler = on.engine.scheduler
    assert 0 < scheduler.prefix_cache_hits < scheduler.prefix_cache_queries
    assert off.engine.scheduler.prefix_cache_queries == 0
    assert all(output.num_cached_tokens == 0 for output in off.generate(prompts, params))
    if "num_blocks" in options:
        assert scheduler.num_preemptions > 0


def test_num_cached_tokens_counts_the_reused_full_blocks(tiny_model):
    llm = LLM(tiny_model, backend="numpy", block_size=4)
    prompt = list(range(10, 23))  # 13 tokens: 3 full blocks
    first = llm.generate([prompt], _greedy(4))[0]
    second = llm.generate([prompt], _greedy(4))[0]
    longer = llm.generate([prompt + [7, 8, 9]], _greedy(4))[0]
    assert (first.num_cached_tokens, second.num_cached_tokens, longer.num_cached_tokens) == (0, 12, 12)
    assert first.outputs[0].token_ids == second.outputs[0].token_ids
    stats = llm.engine.scheduler
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (13 + 13 + 16, 24)


def test_requests_added_together_compute_their_shared_prefix_once(tiny_model):
    """Six requests sharing a 20-token prefix that nothing has cached, added before the first
    step: the first computes the prefix and the other five attach its blocks in that same
    step (every layer writes the step's K/V before its attention reads), with the tokens the
    engine makes with the cache off."""
    prefix = list(range(30, 50))  # 5 full blocks of 4
    prompts = [prefix + [i, i + 1] for i in range(6)]
    limits = dict(backend="numpy", block_size=4, max_num_seqs=8)
    off = LLM(tiny_model, enable_prefix_caching=False, **limits)
    on = LLM(tiny_model, **limits)
    expected = [output.outputs[0].token_ids for output in off.generate(prompts, _greedy(6))]
    engine = on.engine
    for prompt in prompts:
        engine.add_request(prompt, _greedy(6))
    engine.step()  # schedules and launches the first step
    assert [seq.num_computed_tokens for seq in engine.scheduler.running] == [len(prompts[0])] * 6
    assert [seq.num_cached_tokens for seq in engine.scheduler.running] == [0] + [len(prefix)] * 5
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({output.request_id: output for output in engine.step() if output.finished})
    assert [finished[str(i)].outputs[0].token_ids for i in range(6)] == expected
    assert_no_leak(on)
