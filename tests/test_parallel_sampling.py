"""n > 1 on the engine (NumPy backend, a tiny random Llama): one request, n completions.

The oracles are independent runs: each completion of a seeded request is the n = 1 run with
the seed vLLM derives for it (the request's seed + index), greedy completions are the n = 1
greedy run, and the tokens the runner computes (counted at its `launch`) show that the
prompt was computed once, whether the prefix cache shares it or the allocator's owner counts
do, in both batching modes, with chunked prefill and under preemption.
"""

import itertools

import pytest

from tests.helpers import assert_no_leak
from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir
from tinyvllm import LLM, SamplingParams
from tinyvllm.config import MODES

CONFIGS = [
    pytest.param(mode, caching, id=f"{mode}-{'cache' if caching else 'no-cache'}")
    for mode, caching in itertools.product(MODES, (True, False))
]
PROMPT = list(range(40, 63))  # 23 tokens: five full blocks of 4 before the last one
BLOCK_SIZE = 4
SHARED = (len(PROMPT) - 1) // BLOCK_SIZE * BLOCK_SIZE  # 20 tokens the completions share


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_random_llama_dir(tmp_path_factory.mktemp("tiny"), tokenizer="bytes", config_overrides=TINY_OVERRIDES)


def make_llm(tiny_model, mode="continuous", caching=True, **options) -> LLM:
    return LLM(tiny_model, backend="numpy", block_size=BLOCK_SIZE, mode=mode, enable_prefix_caching=caching, **options)


def sampled(**fields) -> SamplingParams:
    return SamplingParams(**{"temperature": 1.0, "max_tokens": 12, "ignore_eos": True, **fields})


def completions(output) -> list[list[int]]:
    assert [completion.index for completion in output.outputs] == list(range(len(output.outputs)))
    return [completion.token_ids for completion in output.outputs]


def count_computed_tokens(llm: LLM) -> list[int]:
    """A list that the runner's launches add their batches' token counts to."""
    counted = [0]
    launch = llm.engine.runner.launch

    def counting(batch):
        counted[0] += batch.num_tokens
        return launch(batch)

    llm.engine.runner.launch = counting
    return counted


@pytest.mark.parametrize("mode, caching", CONFIGS)
def test_seeded_completions_are_the_n1_runs_of_their_seeds_and_differ(tiny_model, mode, caching):
    llm = make_llm(tiny_model, mode, caching)
    (output,) = llm.generate([PROMPT], sampled(n=4, seed=1234), use_tqdm=False)
    tokens = completions(output)
    assert len({tuple(t) for t in tokens}) == 4, "four samples at temperature 1 all differ"
    # Independent oracle: a fresh engine, one n = 1 request per derived seed.
    oracle = make_llm(tiny_model, caching=False)
    assert tokens == [completions(oracle.generate([PROMPT], sampled(seed=1234 + i), use_tqdm=False)[0])[0]
                      for i in range(4)]  # fmt: skip
    # And again on the same engine, whose prefix cache now holds the prompt.
    assert completions(llm.generate([PROMPT], sampled(n=4, seed=1234), use_tqdm=False)[0]) == tokens
    assert_no_leak(llm)


def test_unseeded_completions_differ_from_run_to_run(tiny_model):
    llm = make_llm(tiny_model)
    first, second = (completions(llm.generate([PROMPT], sampled(n=3), use_tqdm=False)[0]) for _ in range(2))
    assert len({tuple(t) for t in first + second}) == 6


@pytest.mark.parametrize("mode, caching", CONFIGS)
def test_greedy_completions_all_equal_the_n1_greedy_run(tiny_model, mode, caching):
    greedy = dict(temperature=0.0, max_tokens=10, ignore_eos=True)
    expected = completions(make_llm(tiny_model).generate([PROMPT], SamplingParams(**greedy), use_tqdm=False)[0])
    llm = make_llm(tiny_model, mode, caching)
    outputs = llm.generate([PROMPT, PROMPT[:7]], SamplingParams(n=3, **greedy), use_tqdm=False)
    assert completions(outputs[0]) == expected * 3
    short = completions(make_llm(tiny_model).generate([PROMPT[:7]], SamplingParams(**greedy), use_tqdm=False)[0])
    assert completions(outputs[1]) == short * 3
    assert_no_leak(llm)


@pytest.mark.parametrize("max_num_batched_tokens", [None, 8])  # 8: the prompt's prefill is chunked
@pytest.mark.parametrize("mode, caching", CONFIGS)
def test_the_prompt_is_computed_once(tiny_model, mode, caching, max_num_batched_tokens):
    options = {} if max_num_batched_tokens is None else {"max_num_batched_tokens": max_num_batched_tokens}
    llm = make_llm(tiny_model, mode, caching, **options)
    computed = count_computed_tokens(llm)
    n, max_tokens = 3, 6
    (output,) = llm.generate([PROMPT], sampled(n=n, max_tokens=max_tokens, seed=5), use_tqdm=False)
    assert [len(t) for t in completions(output)] == [max_tokens] * n
    # The prompt once, the tail after the shared blocks by each other completion, and each
    # completion's decodes (its last token is sampled, never computed).
    assert computed[0] == len(PROMPT) + (n - 1) * (len(PROMPT) - SHARED) + n * (max_tokens - 1)
    assert output.num_cached_tokens == 0, "nothing of this prompt was cached when it came"
    scheduler = llm.engine.scheduler
    assert scheduler.prefix_cache_hits == ((n - 1) * SHARED if caching else 0)
    assert_no_leak(llm)


@pytest.mark.parametrize("mode, caching", CONFIGS)
def test_preemption_changes_no_completion(tiny_model, mode, caching):
    requests = [PROMPT, PROMPT[3:17], list(range(100, 130))]
    params = [sampled(n=3, seed=seed, max_tokens=14) for seed in (7, 8, 9)]
    expected = [completions(o) for o in make_llm(tiny_model).generate(requests, params, use_tqdm=False)]
    small = make_llm(tiny_model, mode, caching, num_blocks=24, max_num_seqs=8)
    assert [completions(o) for o in small.generate(requests, params, use_tqdm=False)] == expected
    assert small.engine.scheduler.num_preemptions > 0
    assert_no_leak(small)


@pytest.mark.parametrize("steps_before_abort", [0, 1, 2, 5])
@pytest.mark.parametrize("mode, caching", CONFIGS)
def test_aborting_a_request_aborts_all_its_completions_and_leaks_nothing(tiny_model, mode, caching,
                                                                         steps_before_abort):  # fmt: skip
    llm = make_llm(tiny_model, mode, caching)
    engine = llm.engine
    dropped = engine.add_request(PROMPT, sampled(n=4, max_tokens=40))
    kept = engine.add_request(PROMPT[:9], sampled(n=2, max_tokens=6, seed=3))
    for _ in range(steps_before_abort):  # 1: the first completion's prefill is on the device
        engine.step()
    assert engine.abort(dropped)
    assert not engine.abort(dropped)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert {output.request_id for output in outputs} == {kept} and outputs[-1].finished
    assert [len(t) for t in completions(outputs[-1])] == [6, 6]
    assert_no_leak(llm)


def test_streaming_outputs_are_cumulative_and_end_with_the_generate_result(tiny_model):
    params = sampled(n=3, seed=21, max_tokens=8, stop=["\x00never"])
    expected = make_llm(tiny_model).generate([PROMPT], params, use_tqdm=False)[0]
    engine = make_llm(tiny_model).engine
    request_id = engine.add_request(PROMPT, params)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert all(output.request_id == request_id for output in outputs)
    assert [output.finished for output in outputs] == [False] * (len(outputs) - 1) + [True]
    for before, after in zip(outputs, outputs[1:]):
        for old, new in zip(before.outputs, after.outputs):
            assert new.token_ids[: len(old.token_ids)] == old.token_ids
            assert new.text.startswith(old.text)
    assert outputs[-1] == expected


def test_completions_finish_on_their_own(tiny_model):
    """A stop token ends one completion; the request goes on until the last one ends."""
    llm = make_llm(tiny_model)
    free = llm.generate([PROMPT], sampled(n=3, seed=99, max_tokens=10), use_tqdm=False)[0]
    stop_token = free.outputs[1].token_ids[2]
    (output,) = llm.generate([PROMPT], sampled(n=3, seed=99, max_tokens=10, stop_token_ids=[stop_token]),
                             use_tqdm=False)  # fmt: skip
    for free_completion, completion in zip(free.outputs, output.outputs):
        tokens = free_completion.token_ids
        if stop_token in tokens:
            cut = tokens[: tokens.index(stop_token) + 1]
            assert (completion.token_ids, completion.finish_reason, completion.stop_reason) == (cut, "stop", stop_token)
        else:
            assert (completion.token_ids, completion.finish_reason, completion.stop_reason) == (tokens, "length", None)
    assert output.outputs[1].finish_reason == "stop" and len(output.outputs[1].token_ids) <= 3
    assert_no_leak(llm)
