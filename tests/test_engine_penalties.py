"""Penalties, min_p and min_tokens end to end, against a greedy loop written here.

The loop asks for the logits after each prefix (here a NumPy engine's fresh prefill each
time; transformers' in tests/test_reference_forward.py) and applies the penalties with its
own counts, so the engine's slots, device counts and their refill after preemption are all
judged by an oracle that has none of them.
"""

from collections.abc import Callable
from functools import partial

import numpy as np
import pytest

from tests.helpers import SIMULATOR, next_token_logits
from tests.random_llama import BYTES_SPECIAL_TOKENS, TINY_OVERRIDES, make_random_llama_dir, save_bytes_tokenizer
from tests.test_engine import ENGINE_SIMULATOR_OVERRIDES
from tinyvllm import LLM, SamplingParams
from tinyvllm.backends.sampler_options import PLAIN_SAMPLER, SamplerOptions

PENALTIES = {"presence_penalty": 0.8, "frequency_penalty": 0.6, "repetition_penalty": 1.5}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_random_llama_dir(tmp_path_factory.mktemp("tiny"), tokenizer="bytes", config_overrides=TINY_OVERRIDES)


def greedy_loop(
    logits_after: Callable[[list[int]], np.ndarray],
    prompt,
    max_tokens,
    presence=0.0,
    frequency=0.0,
    repetition=1.0,
    stops=(),
    min_tokens=0,
):
    """Greedy tokens after prompt with OpenAI's and vLLM's penalties, stopping at a stop
    token once min_tokens tokens are out (before that, stop tokens are masked);
    logits_after(token ids) is the model's next-token logits."""
    tokens = []
    while len(tokens) < max_tokens:
        logits = logits_after(prompt + tokens)
        counts = np.bincount(np.array(tokens, dtype=np.int64), minlength=logits.size)
        seen = np.zeros(logits.size, bool)
        seen[prompt + tokens] = True
        logits = np.where(seen, np.where(logits > 0, logits / repetition, logits * repetition), logits)
        logits = logits - frequency * counts - presence * (counts > 0)
        if len(tokens) < min_tokens:
            logits[list(stops)] = -np.inf
        tokens.append(int(np.argmax(logits)))
        if tokens[-1] in stops:
            break
    return tokens


def _prompts(count: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=int(rng.integers(2, 12))).tolist() for _ in range(count)]


def test_penalized_greedy_matches_the_loop_with_preemption_and_plain_rows(tiny_model):
    reference = LLM(tiny_model, backend="numpy")
    prompts = _prompts(4, seed=11)
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, **PENALTIES) for _ in prompts]
    params[1] = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    expected = [
        greedy_loop(partial(next_token_logits, reference), prompt, 12, **({} if index == 1 else _loop_penalties()))
        for index, prompt in enumerate(prompts)
    ]
    plain = [greedy_loop(partial(next_token_logits, reference), prompt, 12) for prompt in prompts]
    assert expected[0] != plain[0] and expected[2] != plain[2]  # the penalties change the tokens
    for limits in ({"num_blocks": 256}, {"num_blocks": 12}):
        llm = LLM(tiny_model, backend="numpy", block_size=4, max_num_seqs=4, **limits)
        assert [out.outputs[0].token_ids for out in llm.generate(prompts, params)] == expected, limits
        if limits["num_blocks"] == 12:
            assert llm.engine.scheduler.num_preemptions > 0


def _loop_penalties() -> dict:
    return {
        "presence": PENALTIES["presence_penalty"],
        "frequency": PENALTIES["frequency_penalty"],
        "repetition": PENALTIES["repetition_penalty"],
    }


def test_min_tokens_holds_back_eos_that_greedy_would_pick_first(tiny_model, tmp_path):
    """A model whose EOS is its own greedy first token: it stops at once, unless min_tokens."""
    prompt = [5, 17, 99]
    first = next_token_logits(LLM(tiny_model, backend="numpy"), prompt).argmax()
    stopping = make_random_llama_dir(
        tmp_path, tokenizer="bytes", config_overrides={**TINY_OVERRIDES, "eos_token_id": int(first)}
    )
    llm = LLM(stopping, backend="numpy")
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=10))[0]
    assert (out.outputs[0].token_ids, out.outputs[0].finish_reason) == ([first], "stop")
    expected = greedy_loop(partial(next_token_logits, llm), prompt, 10, stops=(int(first),), min_tokens=4)
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=10, min_tokens=4))[0]
    assert out.outputs[0].token_ids == expected
    assert first not in out.outputs[0].token_ids[:4]


def test_stop_strings_wait_for_min_tokens(tiny_model):
    llm = LLM(tiny_model, backend="numpy")
    prompt = [40, 41, 42]
    free = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0]
    stop = llm.engine.tokenizer.decode(free.outputs[0].token_ids[:1])
    assert stop and stop not in llm.engine.tokenizer.decode(free.outputs[0].token_ids[1:3])
    stopped = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, stop=stop))[0]
    assert (stopped.outputs[0].token_ids, stopped.outputs[0].finish_reason) == (free.outputs[0].token_ids[:1], "stop")
    held = llm.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, stop=stop, min_tokens=3)
    )
    held_tokens = held[0].outputs[0].token_ids
    assert len(held_tokens) >= 3 and held_tokens == free.outputs[0].token_ids[: len(held_tokens)]


def test_cuda_backend_penalties_and_min_tokens_match_the_loop(tmp_path):
    overrides = ENGINE_SIMULATOR_OVERRIDES if SIMULATOR else TINY_OVERRIDES
    # the simulator's model has a smaller vocabulary than the byte tokenizer's
    num_bytes = overrides["vocab_size"] - len(BYTES_SPECIAL_TOKENS)
    tokenizer = save_bytes_tokenizer(tmp_path / "tokenizer.json", num_bytes) if SIMULATOR else "bytes"
    model = make_random_llama_dir(tmp_path / "model", tokenizer=tokenizer, config_overrides=overrides)
    limits = {"block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 16, "max_model_len": 64}
    reference = LLM(model, backend="numpy", activation_dtype="bf16", num_blocks=64, **limits)
    prompts, max_tokens = [[3, 1, 4, 1], [9, 2, 6]], pick_tokens()
    stop = next_token_logits(reference, prompts[1]).argmax()
    params = [
        SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **PENALTIES),
        SamplingParams(
            temperature=0.0, max_tokens=max_tokens, ignore_eos=True, stop_token_ids=[int(stop)], min_tokens=2
        ),
    ]
    expected = [
        greedy_loop(partial(next_token_logits, reference), prompts[0], max_tokens, **_loop_penalties()),
        greedy_loop(partial(next_token_logits, reference), prompts[1], max_tokens, stops=(int(stop),), min_tokens=2),
    ]
    llm = LLM(model, backend="cuda", linear_backend="tiled" if SIMULATOR else "auto", num_blocks=64, **limits)
    assert [out.outputs[0].token_ids for out in llm.generate(prompts, params)] == expected


def pick_tokens() -> int:
    return 3 if SIMULATOR else 12


@pytest.mark.gpu
def test_graph_replay_samples_what_eager_samples_with_every_option(tiny_model):
    prompts = _prompts(6, seed=21)
    params = [
        SamplingParams(
            temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, seed=i, max_tokens=24, min_tokens=8, **PENALTIES
        )
        for i in range(len(prompts))
    ]
    params[0] = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    # num_blocks given: other test workers share the GPU, so its free memory says little
    graphs = LLM(tiny_model, backend="cuda", num_blocks=256)
    eager = LLM(tiny_model, backend="cuda", num_blocks=256, enforce_eager=True)
    replayed = [out.outputs[0].token_ids for out in graphs.generate(prompts, params)]
    assert replayed == [out.outputs[0].token_ids for out in eager.generate(prompts, params)]
    captured_options = {options for _, options, _ in graphs.engine.runner.graphs.graphs}
    assert captured_options == {PLAIN_SAMPLER, SamplerOptions(penalties=True, min_p=True)}
