"""vLLM's output shape and LLM's conveniences on a tiny random Llama (NumPy backend).

Every field of RequestOutput and CompletionOutput is checked against what made it: the prompt
given, the tokenizer (text is the decode of the token ids), and for stop_reason the stop
string or stop token id passed in. Dict prompts are the plain prompts they wrap; use_tqdm
shows vLLM's bar.
"""

import dataclasses
import json

import pytest

from tests.helpers import assert_no_leak
from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir
from tinyvllm import LLM, CompletionOutput, RequestOutput, SamplingParams

TEXT = "Hello there, tiny model"


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    model = make_random_llama_dir(tmp_path_factory.mktemp("tiny"), tokenizer="bytes", config_overrides=TINY_OVERRIDES)
    return LLM(model, backend="numpy", block_size=4)


def greedy(**fields) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "max_tokens": 24, "ignore_eos": True, **fields})


def completions(llm, runs: list[SamplingParams]) -> list:
    """TEXT's first completion under each of `runs`, generated together."""
    return [output.outputs[0] for output in llm.generate([TEXT] * len(runs), runs, use_tqdm=False)]


def test_every_field_of_a_finished_output(llm):
    (output,) = llm.generate(TEXT, greedy(n=2), use_tqdm=False)
    assert [field.name for field in dataclasses.fields(RequestOutput)] == [
        "request_id", "prompt", "prompt_token_ids", "prompt_logprobs", "outputs", "finished", "num_cached_tokens",
    ]  # fmt: skip
    assert [field.name for field in dataclasses.fields(CompletionOutput)] == [
        "index", "text", "token_ids", "cumulative_logprob", "logprobs", "finish_reason", "stop_reason",
    ]  # fmt: skip
    assert isinstance(output.request_id, str)
    assert output.prompt == TEXT
    assert output.prompt_token_ids == llm.get_tokenizer().encode(TEXT)
    assert output.prompt_logprobs is None
    assert output.finished
    assert output.num_cached_tokens == 0
    assert len(output.outputs) == 2
    for index, completion in enumerate(output.outputs):
        assert isinstance(completion, CompletionOutput)
        assert completion.index == index
        assert len(completion.token_ids) == 24
        assert completion.text == llm.get_tokenizer().decode(completion.token_ids)
        assert completion.cumulative_logprob is None and completion.logprobs is None
        assert (completion.finish_reason, completion.stop_reason) == ("length", None)
        assert completion.finished()
    # The same prompt again finds its full blocks cached.
    again = llm.generate(TEXT, greedy(), use_tqdm=False)[0]
    assert again.num_cached_tokens == (len(output.prompt_token_ids) - 1) // 4 * 4
    assert again.outputs[0] == output.outputs[0]


def test_a_token_id_prompt_has_no_prompt_text(llm):
    (output,) = llm.generate([[72, 101, 108, 108]], greedy(max_tokens=3), use_tqdm=False)
    assert (output.prompt, output.prompt_token_ids) == (None, [72, 101, 108, 108])


def test_stop_reason_is_the_stop_string_that_ended_it(llm):
    free = llm.generate(TEXT, greedy(), use_tqdm=False)[0].outputs[0]
    stop = free.text[6:8]
    assert len(stop) == 2, "the tiny model produced too little text for this test"
    (output,) = llm.generate(TEXT, greedy(stop=["\x00never", stop]), use_tqdm=False)
    completion = output.outputs[0]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop)
    assert completion.text == free.text[: free.text.index(stop)]
    assert_no_leak(llm)


def test_stop_reason_is_the_stop_token_id_that_ended_it(llm):
    free = llm.generate(TEXT, greedy(), use_tqdm=False)[0].outputs[0]
    stop_token = free.token_ids[5]
    (output,) = llm.generate(TEXT, greedy(stop_token_ids=[stop_token]), use_tqdm=False)
    completion = output.outputs[0]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop_token)
    assert completion.token_ids == free.token_ids[: free.token_ids.index(stop_token) + 1]
    assert_no_leak(llm)


def test_what_stopped_it_is_in_the_text_only_when_asked(llm):
    """vLLM's rule: the stop string, or the text of the stop token id, is left out of the text
    unless include_stop_str_in_output. Oracle for a token: the same request ended by length one
    token earlier (without it) or at it (with it)."""
    free = llm.generate(TEXT, greedy(), use_tqdm=False)[0].outputs[0]
    stop = free.text[6:8]
    cut, kept = completions(llm, [greedy(stop=[stop]), greedy(stop=[stop], include_stop_str_in_output=True)])
    assert cut.text == free.text[: free.text.index(stop)]
    assert (kept.text, kept.stop_reason) == (free.text[: free.text.index(stop) + len(stop)], stop)

    stop_token = next(t for t in free.token_ids[1:] if 32 <= t < 127)  # a printable byte: its text is not empty
    length = free.token_ids.index(stop_token) + 1
    runs = [greedy(stop_token_ids=[stop_token]), greedy(stop_token_ids=[stop_token], include_stop_str_in_output=True),
            greedy(max_tokens=length - 1), greedy(max_tokens=length)]  # fmt: skip
    without, with_token, shorter, as_long = completions(llm, runs)
    assert without.token_ids == with_token.token_ids == as_long.token_ids  # the ids keep the stop token
    assert (without.text, with_token.text) == (shorter.text, as_long.text) and shorter.text != as_long.text
    assert_no_leak(llm)


def test_vllm_names_for_the_engine_and_the_default_sampling(llm):
    assert llm.llm_engine is llm.engine
    config = json.loads((llm.engine.model_dir / "generation_config.json").read_text())
    params = llm.get_default_sampling_params()
    assert (params.temperature, params.top_p, params.top_k) == (config["temperature"], config["top_p"], -1)


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(llm):
    """Oracle: the same request given only those last tokens."""
    ids = llm.get_tokenizer().encode(TEXT)
    truncated, direct = outputs_of(llm, [(TEXT, greedy(truncate_prompt_tokens=5)), (ids[-5:], greedy())])
    assert truncated.prompt_token_ids == ids[-5:] and truncated.outputs[0].token_ids == direct.outputs[0].token_ids
    max_model_len = llm.engine.max_model_len
    too_long = (ids * (max_model_len // len(ids) + 2))[: max_model_len + 3]
    with pytest.raises(ValueError, match="longer than max_model_len"):
        llm.generate([too_long], greedy(), use_tqdm=False)
    (kept,) = llm.generate([too_long], greedy(truncate_prompt_tokens=-1), use_tqdm=False)
    assert kept.prompt_token_ids == too_long[-max_model_len:]
    assert (len(kept.outputs[0].token_ids), kept.outputs[0].finish_reason) == (1, "length")
    assert_no_leak(llm)


def outputs_of(llm, requests: list[tuple]) -> list:
    """The RequestOutput of each (prompt, SamplingParams) pair, generated together."""
    prompts, params = zip(*requests)
    return llm.generate(list(prompts), list(params), use_tqdm=False)


def test_special_tokens_are_in_the_text_only_when_not_skipped(llm):
    tokenizer = llm.get_tokenizer()
    special = set(tokenizer.backend.get_added_tokens_decoder())  # the tiny tokenizer's BOS, EOS and chat markers
    runs = [SamplingParams(temperature=1.0, seed=2, max_tokens=80, ignore_eos=True, skip_special_tokens=skip)
            for skip in (True, False)]  # fmt: skip
    skipped, kept = completions(llm, runs)
    assert skipped.token_ids == kept.token_ids
    names = [tokenizer.id_to_token(t) for t in kept.token_ids if t in special]
    assert names, "the tiny model sampled no special token for this test"
    assert [kept.text.count(name) for name in names] == [names.count(name) for name in names]
    assert not any(name in skipped.text for name in names)


def test_a_request_aborted_midway_has_reported_only_unfinished_outputs(llm):
    engine = llm.engine
    request_id = engine.add_request(TEXT, greedy(max_tokens=40, n=2))
    engine.step()
    engine.step()
    outputs = engine.step()
    assert engine.abort(request_id)
    assert outputs and not outputs[-1].finished
    assert all(completion.finish_reason is None for completion in outputs[-1].outputs)
    assert_no_leak(llm)


def test_dict_prompts_are_the_prompts_they_wrap(llm):
    ids = llm.get_tokenizer().encode(TEXT)
    plain = llm.generate([TEXT, ids], greedy(max_tokens=6), use_tqdm=False)
    wrapped = llm.generate([{"prompt": TEXT}, {"prompt_token_ids": ids}], greedy(max_tokens=6), use_tqdm=False)
    assert [o.outputs for o in wrapped] == [o.outputs for o in plain]
    assert [(o.prompt, o.prompt_token_ids) for o in wrapped] == [(TEXT, ids), (None, ids)]
    (single,) = llm.generate({"prompt": TEXT}, greedy(max_tokens=6), use_tqdm=False)
    assert single.outputs == plain[0].outputs


@pytest.mark.parametrize(
    "prompt",
    [{}, {"prompt": TEXT, "prompt_token_ids": [1]}, {"text": TEXT}, {"prompt": [1, 2]}, {"prompt_token_ids": "ab"}],
)
def test_a_bad_dict_prompt_is_refused_naming_prompt(llm, prompt):
    with pytest.raises(ValueError, match="prompt"):
        llm.generate([TEXT, prompt], greedy(), use_tqdm=False)
    assert_no_leak(llm)


def test_get_tokenizer_is_the_engines(llm):
    assert llm.get_tokenizer() is llm.engine.tokenizer


def test_use_tqdm_shows_vllms_progress_bar_or_nothing(llm, capsys):
    llm.generate([TEXT] * 3, greedy(max_tokens=4))
    bar = capsys.readouterr().err
    assert "Processed prompts" in bar and "3/3" in bar and "est. speed input" in bar
    llm.generate([TEXT] * 3, greedy(max_tokens=4), use_tqdm=False)
    assert capsys.readouterr().err == ""


def test_use_tqdm_takes_a_bar_class(llm):
    made = []

    class Bar:
        def __init__(self, total, **kwargs):
            made.append(self)
            self.total, self.count, self.closed, self.postfix = total, 0, False, kwargs.get("postfix")

        def update(self, count):
            self.count += count

        def close(self):
            self.closed = True

    llm.generate([TEXT, TEXT[:5]], greedy(max_tokens=4), use_tqdm=Bar)
    (bar,) = made
    assert (bar.total, bar.count, bar.closed) == (2, 2, True)
    assert "output:" in bar.postfix
