"""Logprobs end to end on the NumPy backend, against a float64 log-softmax of the reference
forward's logits for each prefix (a fresh prefill each time, `next_token_logits`), which
knows nothing of the engine's batching, slots, graphs or preemption."""

import numpy as np
import pytest

from tests.helpers import SIMULATOR, next_token_logits
from tests.random_llama import BYTES_SPECIAL_TOKENS, TINY_OVERRIDES, make_random_llama_dir, save_bytes_tokenizer
from tests.test_engine import ENGINE_SIMULATOR_OVERRIDES
from tinyvllm import LLM, Logprob, SamplingParams
from tinyvllm.backends.sampler_options import SamplerOptions
from tinyvllm.engine.prompt_logprobs import ROWS_PER_SLICE

TOLERANCE = 1e-4
"""Nats, between the NumPy engine's float32 logits (in a batch) and the same forward alone."""
BF16_LOGPROB_GAP = 0.05
"""Nats, between two bf16 pipelines' logprobs (their logits differ by about 1e-2)."""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_random_llama_dir(tmp_path_factory.mktemp("tiny"), tokenizer="bytes", config_overrides=TINY_OVERRIDES)


@pytest.fixture(scope="module")
def reference(tiny_model):
    return LLM(tiny_model, backend="numpy")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def assert_logprobs_match(reference: LLM, prompt: list[int], completion, count: int) -> None:
    """Each generated token's entry against the oracle: the sampled token and the `count`
    most likely ones, their logprobs, ranks and texts; the cumulative logprob their sum."""
    tokenizer = reference.engine.tokenizer
    assert len(completion.logprobs) == len(completion.token_ids)
    for position, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
        logits = next_token_logits(reference, prompt + completion.token_ids[:position])
        expected = log_softmax(logits)
        top = np.argsort(-logits, kind="stable")[:count].tolist()
        assert list(entry)[:count] == top and set(entry) == set(top) | {token}, position
        for token_id, logprob in entry.items():
            assert isinstance(logprob, Logprob)
            assert logprob.logprob == pytest.approx(expected[token_id], abs=TOLERANCE)
            assert logprob.rank == int((logits > logits[token_id]).sum()) + 1
            assert logprob.decoded_token == tokenizer.decode([token_id])
    expected_sum = sum(entry[token].logprob for entry, token in zip(completion.logprobs, completion.token_ids))
    assert completion.cumulative_logprob == pytest.approx(expected_sum, abs=1e-9)


def _prompts(count: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=int(rng.integers(2, 10))).tolist() for _ in range(count)]


def test_greedy_logprobs_are_the_raw_log_softmax_with_penalties_and_preemption(tiny_model, reference):
    """Penalties change which token is drawn, never the logprobs (raw mode); a recomputed
    sequence gets one entry per token, not two."""
    prompts = _prompts(3, seed=5)
    params = [
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=4),
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2, repetition_penalty=1.8),
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
    ]
    llm = LLM(tiny_model, backend="numpy", block_size=4, max_num_seqs=3, num_blocks=8)
    outputs = llm.generate(prompts, params)
    assert llm.engine.scheduler.num_preemptions > 0
    for prompt, output, param in zip(prompts[:2], outputs[:2], params[:2]):
        assert_logprobs_match(reference, prompt, output.outputs[0], param.logprobs)
    plain = outputs[2].outputs[0]
    assert plain.logprobs is None and plain.cumulative_logprob is None and outputs[2].prompt_logprobs is None


def test_sampled_logprobs_with_n_and_a_seed(tiny_model, reference):
    prompt = [7, 8, 9, 10]
    params = SamplingParams(
        n=3, temperature=1.5, top_k=50, min_p=0.01, seed=3, max_tokens=5, ignore_eos=True, logprobs=3
    )
    llm = LLM(tiny_model, backend="numpy")
    first = llm.generate([prompt], params)[0]
    again = llm.generate([prompt], params)[0]
    assert len(first.outputs) == 3
    for completion, repeat in zip(first.outputs, again.outputs):
        assert_logprobs_match(reference, prompt, completion, 3)
        assert completion.logprobs == repeat.logprobs
    ranks = [entry[token].rank for c in first.outputs for entry, token in zip(c.logprobs, c.token_ids)]
    assert max(ranks) > 1  # sampling drew tokens that are not the argmax, and their ranks show it


def test_logprobs_zero_gives_the_sampled_token_alone(tiny_model, reference):
    prompt = [40, 41]
    llm = LLM(tiny_model, backend="numpy")
    completion = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4, logprobs=0))[0].outputs[0]
    assert [list(entry) for entry in completion.logprobs] == [[token] for token in completion.token_ids]
    assert_logprobs_match(reference, prompt, completion, 0)
    assert all(entry[token].rank == 1 for entry, token in zip(completion.logprobs, completion.token_ids))


def test_streamed_outputs_carry_the_logprobs_of_their_tokens(tiny_model):
    llm = LLM(tiny_model, backend="numpy")
    engine = llm.engine
    engine.add_request([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=1))
    seen = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            completion = output.outputs[0]
            assert len(completion.logprobs) == len(completion.token_ids)
            assert completion.logprobs[: len(seen)] == seen  # cumulative: earlier entries unchanged
            seen = list(completion.logprobs)
    assert len(seen) == 5


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("logprobs", -1, r"logprobs must be in \[0, 20\]"),
        ("logprobs", 21, r"logprobs must be in \[0, 20\]"),
        ("logprobs", 1.5, "logprobs must be an integer"),
        ("prompt_logprobs", 21, r"prompt_logprobs must be in \[0, 20\]"),
        ("prompt_logprobs", "3", "prompt_logprobs must be an integer"),
    ],
)
def test_bad_logprobs_are_refused_naming_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})


def assert_prompt_logprobs_match(reference: LLM, prompt: list[int], prompt_logprobs, count: int) -> None:
    """Entry t + 1 against the oracle's logits after prompt[: t + 1]; entry 0 is None."""
    assert len(prompt_logprobs) == len(prompt) and prompt_logprobs[0] is None
    for position in range(len(prompt) - 1):
        logits = next_token_logits(reference, prompt[: position + 1])
        expected, entry, token = log_softmax(logits), prompt_logprobs[position + 1], prompt[position + 1]
        top = np.argsort(-logits, kind="stable")[:count].tolist()
        assert list(entry)[:count] == top and set(entry) == set(top) | {token}, position
        for token_id, logprob in entry.items():
            assert logprob.logprob == pytest.approx(expected[token_id], abs=TOLERANCE)
            assert logprob.rank == int((logits > logits[token_id]).sum()) + 1


@pytest.mark.parametrize(
    "limits",
    [
        {},  # one prefill: the positions span two LM-head slices
        {"max_num_batched_tokens": 8, "enable_prefix_caching": True},  # chunked, and never read from the cache
        {"block_size": 4, "max_num_seqs": 3, "num_blocks": 22},  # preempted and recomputed
    ],
    ids=["slices", "chunked-cached", "preempted"],
)
def test_prompt_logprobs_are_the_raw_log_softmax_at_each_prompt_position(tiny_model, reference, limits):
    rng = np.random.default_rng(8)
    long_prompt = rng.integers(0, 256, size=ROWS_PER_SLICE + 6).tolist()
    prompts = [long_prompt, rng.integers(0, 256, size=12).tolist(), long_prompt[:20]]
    params = [
        SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=4, ignore_eos=True, prompt_logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, prompt_logprobs=0, logprobs=1),
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
    ]
    llm = LLM(tiny_model, backend="numpy", **limits)
    if limits.get("enable_prefix_caching"):
        llm.generate([long_prompt], SamplingParams(max_tokens=1))  # the prompt's blocks are cached now
    outputs = llm.generate(prompts, params)
    if "num_blocks" in limits:
        assert llm.engine.scheduler.num_preemptions > 0
    assert_prompt_logprobs_match(reference, prompts[0], outputs[0].prompt_logprobs, 2)
    assert_prompt_logprobs_match(reference, prompts[1], outputs[1].prompt_logprobs, 0)
    assert_logprobs_match(reference, prompts[1], outputs[1].outputs[0], 1)
    assert outputs[2].prompt_logprobs is None


def _cuda_engine_model(tmp_path):
    overrides = ENGINE_SIMULATOR_OVERRIDES if SIMULATOR else TINY_OVERRIDES
    # the simulator's model has a smaller vocabulary than the byte tokenizer's
    num_bytes = overrides["vocab_size"] - len(BYTES_SPECIAL_TOKENS)
    tokenizer = save_bytes_tokenizer(tmp_path / "tokenizer.json", num_bytes) if SIMULATOR else "bytes"
    return make_random_llama_dir(tmp_path / "model", tokenizer=tokenizer, config_overrides=overrides)


def test_cuda_backend_logprobs_match_the_bf16_reference(tmp_path):
    """The kernel in the engine, with a penalized row (whose raw logits the runner copies
    before the penalty kernel changes them) and prompt logprobs (the LM head over prompt
    rows), against the bf16 NumPy forward: two bf16
    pipelines whose logits differ by rounding, so the logprobs agree to BF16_LOGPROB_GAP
    and a top id may swap only with one that close."""
    model = _cuda_engine_model(tmp_path)
    limits = {"block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 16, "max_model_len": 64}
    reference = LLM(model, backend="numpy", activation_dtype="bf16", num_blocks=64, **limits)
    llm = LLM(model, backend="cuda", linear_backend="tiled" if SIMULATOR else "auto", num_blocks=64, **limits)
    prompts, count = [[3, 1, 4, 1], [9, 2, 6]], 3
    params = [
        SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=count, repetition_penalty=1.5),
        SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=count, prompt_logprobs=count),
    ]
    outputs = llm.generate(prompts, params)
    assert outputs[0].prompt_logprobs is None and outputs[1].prompt_logprobs[0] is None
    for position, entry in enumerate(outputs[1].prompt_logprobs[1:]):
        expected = log_softmax(next_token_logits(reference, prompts[1][: position + 1]))
        assert prompts[1][position + 1] in entry
        for token_id, logprob in entry.items():
            assert logprob.logprob == pytest.approx(expected[token_id], abs=BF16_LOGPROB_GAP)
    for prompt, output in zip(prompts, outputs):
        completion = output.outputs[0]
        assert len(completion.logprobs) == len(completion.token_ids) == 3
        for position, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
            expected = log_softmax(next_token_logits(reference, prompt + completion.token_ids[:position]))
            assert token in entry and len(entry) in (count, count + 1)
            for token_id, logprob in entry.items():
                assert logprob.logprob == pytest.approx(expected[token_id], abs=BF16_LOGPROB_GAP)
            third_best = np.sort(expected)[-count]
            assert all(expected[token_id] >= third_best - BF16_LOGPROB_GAP for token_id in list(entry)[:count])


@pytest.mark.gpu
def test_graph_replay_gives_the_eager_logprobs(tiny_model):
    prompts = _prompts(6, seed=23)
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=16, ignore_eos=True, logprobs=i * 4)
        for i in range(len(prompts))
    ]
    params[1] = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=20, presence_penalty=1.0)
    params[2] = SamplingParams(temperature=0.7, max_tokens=16, ignore_eos=True, seed=9)
    # num_blocks given: other test workers share the GPU, so its free memory says little
    graphs = LLM(tiny_model, backend="cuda", num_blocks=256)
    eager = LLM(tiny_model, backend="cuda", num_blocks=256, enforce_eager=True)
    replayed, expected = graphs.generate(prompts, params), eager.generate(prompts, params)
    for ours, theirs in zip(replayed, expected):
        assert ours.outputs[0].token_ids == theirs.outputs[0].token_ids
        assert ours.outputs[0].logprobs == theirs.outputs[0].logprobs
        assert ours.outputs[0].cumulative_logprob == theirs.outputs[0].cumulative_logprob
    captured_options = {options for _, options, _ in graphs.engine.runner.graphs.graphs}
    assert SamplerOptions(penalties=True, logprobs=True) in captured_options
