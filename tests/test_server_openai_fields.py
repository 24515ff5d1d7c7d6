"""Every request field of the server, through the official openai client: n, presence_penalty,
frequency_penalty, repetition_penalty and min_p (in extra_body), seed, stop, max_tokens,
temperature, top_p and stream_options.include_usage, for completions and chat, streamed and
not (in process: the client's HTTP goes through Starlette's TestClient to a tiny NumPy engine).

Oracles: the offline engine (`LLM`) on the same model gives each request's texts, finish
reasons and token counts; the tokenizer gives the prompt's token count; and properties that
hold whatever the model: top_p near 0 and min_p 1 leave only the most likely token (the greedy
text), a seed repeats its sample, a stop string ends the text before its first occurrence,
penalties that reward repeats make the greedy text repeat, and a repetition_penalty far below 1
keeps it to the prompt's tokens.
"""

import dataclasses
from collections import defaultdict

import openai
import pytest
from starlette.testclient import TestClient

from tests.server_fixtures import tiny_model_dir  # noqa: F401
from tinyvllm.engine.async_engine import AsyncEngine
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.llm import LLM
from tinyvllm.serving.server import OpenAIServer, ServerConfig

MODEL_NAME = "tiny-test"
MAX_MODEL_LEN = 256
MAX_TOKENS = 8
PROMPT = "Once upon a time"
MESSAGES = [{"role": "user", "content": "Hi"}]
MODES = [pytest.param(chat, stream, id=f"{'chat' if chat else 'completion'}-{'stream' if stream else 'plain'}")
         for chat in (False, True) for stream in (False, True)]  # fmt: skip


@dataclasses.dataclass
class Answer:
    texts: list[str]
    finish_reasons: list[str]
    usage: tuple[int, int, int]  # prompt, completion, total tokens


@pytest.fixture(scope="module")
def client(tiny_model_dir):  # noqa: F811
    engine = LLMEngine(tiny_model_dir, backend="numpy", num_blocks=64, max_model_len=MAX_MODEL_LEN)
    config = ServerConfig(served_model_name=MODEL_NAME, max_tokens_limit=32, stats_interval_s=None, log_requests=False)
    with TestClient(OpenAIServer(AsyncEngine(engine), config).app()) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)


@pytest.fixture(scope="module")
def oracle(tiny_model_dir):  # noqa: F811
    return LLM(tiny_model_dir, backend="numpy", num_blocks=64, max_model_len=MAX_MODEL_LEN)


def ask(client: openai.OpenAI, chat: bool, stream: bool, extra: dict | None = None, **fields) -> Answer:
    """One request (ignore_eos, so that max_tokens ends it); streamed, with include_usage. Checks
    the response's shape: choices indexed 0 .. n-1, usage only in a stream's last chunk."""
    request = {
        "model": MODEL_NAME,
        "max_tokens": MAX_TOKENS,
        **fields,
        "extra_body": {"ignore_eos": True, **(extra or {})},
    }
    request |= {"messages": MESSAGES} if chat else {"prompt": PROMPT}
    if stream:
        request |= {"stream": True, "stream_options": {"include_usage": True}}
    response = (client.chat.completions if chat else client.completions).create(**request)
    if not stream:
        assert [choice.index for choice in response.choices] == list(range(len(response.choices)))
        texts = [choice.message.content if chat else choice.text for choice in response.choices]
        usage = response.usage
        return Answer(
            texts,
            [c.finish_reason for c in response.choices],
            (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens),
        )
    chunks = list(response)
    *content, last = chunks
    assert last.choices == [] and all(chunk.usage is None for chunk in content)
    texts, finish_reasons = defaultdict(str), {}
    for chunk in content:
        for choice in chunk.choices:
            assert choice.index not in finish_reasons, "nothing after a choice's finish reason"
            texts[choice.index] += (choice.delta.content or "") if chat else choice.text
            if choice.finish_reason is not None:
                finish_reasons[choice.index] = choice.finish_reason
    assert sorted(texts) == sorted(finish_reasons) == list(range(len(texts)))
    usage = last.usage
    return Answer([texts[i] for i in range(len(texts))], [finish_reasons[i] for i in range(len(texts))],
                  (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens))  # fmt: skip


def offline(oracle: LLM, chat: bool, **params):
    """The offline engine's RequestOutput for the same request (the model's defaults, then `params`)."""
    params = {"max_tokens": MAX_TOKENS, "ignore_eos": True, **params}
    sampling = dataclasses.replace(oracle.engine.default_sampling_params(), **params)
    [output] = oracle.chat(MESSAGES, sampling) if chat else oracle.generate(PROMPT, sampling)
    return output


def expected(oracle: LLM, chat: bool, **params) -> Answer:
    output = offline(oracle, chat, **params)
    tokenizer = oracle.tokenizer
    prompt_tokens = len(tokenizer.encode_chat(MESSAGES) if chat else tokenizer.encode(PROMPT))
    completion_tokens = sum(len(completion.token_ids) for completion in output.outputs)
    return Answer([c.text for c in output.outputs], [c.finish_reason for c in output.outputs],
                  (prompt_tokens, completion_tokens, prompt_tokens + completion_tokens))  # fmt: skip


CASES = [  # (OpenAI fields, vLLM's fields in extra_body)
    pytest.param({"temperature": 0}, {}, id="greedy"),
    pytest.param({"temperature": 0.8, "top_p": 0.9, "seed": 7}, {}, id="temperature-top_p-seed"),
    pytest.param({"n": 3, "temperature": 1.0, "seed": 3}, {}, id="n"),
    pytest.param(
        {"temperature": 0, "presence_penalty": -2.0, "frequency_penalty": -1.5},
        {"repetition_penalty": 0.5, "min_p": 0.05},
        id="penalties-min_p",
    ),  # fmt: skip
    pytest.param({"temperature": 1.0, "seed": 1, "max_tokens": 3}, {}, id="max_tokens"),
]


@pytest.mark.parametrize("chat, stream", MODES)
@pytest.mark.parametrize("fields, extra", CASES)
def test_each_field_round_trips_as_the_offline_engine_answers(client, oracle, chat, stream, fields, extra):
    answer = ask(client, chat, stream, extra, **fields)
    assert answer == expected(oracle, chat, **fields, **extra)
    assert len(answer.texts) == fields.get("n", 1)
    assert answer.finish_reasons == ["length"] * len(answer.texts)
    assert answer.usage[1] == len(answer.texts) * fields.get("max_tokens", MAX_TOKENS)


@pytest.mark.parametrize("chat, stream", MODES)
def test_n_choices_are_distinct_samples(client, chat, stream):
    texts = ask(client, chat, stream, n=3, temperature=1.0, seed=3).texts
    assert len(texts) == 3 and len(set(texts)) > 1


@pytest.mark.parametrize("chat, stream", MODES)
def test_a_seed_repeats_its_sample(client, chat, stream):
    first, again = (ask(client, chat, stream, temperature=1.0, seed=5) for _ in range(2))
    assert first == again
    assert ask(client, chat, stream, temperature=1.0, seed=6).texts != first.texts


@pytest.mark.parametrize("chat, stream", MODES)
def test_top_p_near_zero_and_min_p_one_give_the_greedy_text(client, chat, stream):
    greedy = ask(client, chat, stream, temperature=0).texts
    assert ask(client, chat, stream, temperature=1.0, seed=5).texts != greedy, "the seeded sample is not greedy"
    assert ask(client, chat, stream, temperature=1.0, seed=5, top_p=1e-9).texts == greedy
    assert ask(client, chat, stream, {"min_p": 1.0}, temperature=1.0, seed=5).texts == greedy


@pytest.mark.parametrize("chat, stream", MODES)
def test_a_stop_string_ends_the_text_before_it(client, oracle, chat, stream):
    params = {"temperature": 1.0, "seed": 2, "max_tokens": 24}
    [full] = expected(oracle, chat, **params).texts
    # a character first seen at position >= 2 (printable ASCII, so no partial UTF-8 is involved)
    position = next(i for i, c in enumerate(full) if i >= 2 and c.isascii() and c.isprintable() and c not in full[:i])
    answer = ask(client, chat, stream, stop=["never generated \u2603", full[position]], **params)
    assert answer.texts == [full[:position]] and answer.finish_reasons == ["stop"]
    assert answer == expected(oracle, chat, stop=["never generated \u2603", full[position]], **params)


@pytest.mark.parametrize("chat, stream", MODES)
@pytest.mark.parametrize("penalty", ["presence_penalty", "frequency_penalty"])
def test_penalties_that_reward_repeats_make_the_greedy_text_repeat(client, oracle, chat, stream, penalty):
    greedy = offline(oracle, chat, temperature=0).outputs[0]
    assert len(set(greedy.token_ids)) > 2, "the greedy text does not repeat on its own"
    rewarded = offline(oracle, chat, temperature=0, **{penalty: -2.0}).outputs[0]
    assert len(set(rewarded.token_ids)) <= 2
    assert ask(client, chat, stream, temperature=0, **{penalty: -2.0}).texts == [rewarded.text] != [greedy.text]


@pytest.mark.parametrize("chat, stream", MODES)
def test_a_repetition_penalty_far_below_one_keeps_the_greedy_text_to_prompt_tokens(client, oracle, chat, stream):
    """Below 1 it multiplies the positive logits of prompt and output tokens (by 100 here): the
    greedy choice is always one of them."""
    greedy = offline(oracle, chat, temperature=0).outputs[0]
    output = offline(oracle, chat, temperature=0, repetition_penalty=0.01)
    assert set(output.outputs[0].token_ids) <= set(output.prompt_token_ids)
    assert not set(greedy.token_ids) <= set(output.prompt_token_ids)
    answer = ask(client, chat, stream, {"repetition_penalty": 0.01}, temperature=0)
    assert answer.texts == [output.outputs[0].text] != [greedy.text]
