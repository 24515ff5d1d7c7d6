"""The OpenAI-compatible server, through the official `openai` client and raw HTTP.

One server subprocess (NumPy backend, a tiny random model) serves the whole module. The
oracle for generated text is the offline engine (`LLM.generate`) on the same model: greedy
and seeded requests must come back exactly as it makes them, streamed or not, alone or 20
at a time; usage counts come from the model's own tokenizer.
"""

import asyncio
import dataclasses
import json

import httpx
import openai
import pytest

from tests.server_fixtures import serve, tiny_model_dir  # noqa: F401
from tinyvllm.llm import LLM
from tinyvllm.sampling_params import SamplingParams

MODEL_NAME = "tiny-test"
MAX_TOKENS_LIMIT = 64
MAX_BODY_BYTES = 4096
MAX_MODEL_LEN = 256
PROMPTS = ["The quick brown fox", "Once upon a time", "abc", "Hello, world", "1 2 3 4"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def server_url(tiny_model_dir):  # noqa: F811
    args = ["--model", str(tiny_model_dir), "--backend", "numpy", "--num-blocks", "256",
            "--max-model-len", str(MAX_MODEL_LEN), "--served-model-name", MODEL_NAME,
            "--max-tokens-limit", str(MAX_TOKENS_LIMIT), "--max-body-bytes", str(MAX_BODY_BYTES)]  # fmt: skip
    with serve(args) as url:
        yield url


@pytest.fixture(scope="module")
def oracle(tiny_model_dir):  # noqa: F811
    return LLM(tiny_model_dir, backend="numpy", num_blocks=64, max_model_len=MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def client(server_url):
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0)


def expected(oracle, prompt, **params):
    """(text, finish_reason, prompt tokens) from the offline engine; chats are lists of messages.
    Parameters left out take the model's generation_config defaults, as the server's do."""
    params = dataclasses.replace(oracle.engine.default_sampling_params(), **params)
    is_chat = isinstance(prompt, list) and isinstance(prompt[0], dict)
    [output] = oracle.chat(prompt, params) if is_chat else oracle.generate(prompt, params)
    return output.outputs[0].text, output.outputs[0].finish_reason, len(output.prompt_token_ids)


def test_models_and_health(client, server_url):
    assert [model.id for model in client.models.list()] == [MODEL_NAME]
    assert httpx.get(f"{server_url}/health").json() == {"status": "ok"}


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_completion_matches_the_offline_engine_streamed_or_not(client, oracle, prompt):
    text, finish_reason, prompt_tokens = expected(oracle, prompt, temperature=0, max_tokens=20, ignore_eos=True)
    response = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=20, temperature=0,
                                         extra_body={"ignore_eos": True})  # fmt: skip
    assert response.choices[0].text == text
    assert response.choices[0].finish_reason == finish_reason == "length"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (prompt_tokens, 20)
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=20, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True}))  # fmt: skip
    assert "".join(chunk.choices[0].text for chunk in chunks) == text
    assert [chunk.choices[0].finish_reason for chunk in chunks][-1] == "length"


def test_chat_matches_the_offline_engine_streamed_or_not(client, oracle):
    text, finish_reason, prompt_tokens = expected(oracle, CHAT, temperature=0, max_tokens=24, ignore_eos=True)
    response = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_completion_tokens=24,
                                              temperature=0, extra_body={"ignore_eos": True})  # fmt: skip
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == text
    assert response.usage.prompt_tokens == prompt_tokens
    assert response.usage.completion_tokens == 24
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [chunk.choices[0] for chunk in chunks if chunk.choices]
    assert "".join(choice.delta.content or "" for choice in content) == text
    assert content[-1].finish_reason == "length"
    assert not chunks[-1].choices and chunks[-1].usage == response.usage
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_chat_with_text_parts_equals_plain_content(client):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}]
    plain = [{"role": "user", "content": "Hi\nthere"}]
    answers = [client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0)
               for messages in (parts, plain)]  # fmt: skip
    assert answers[0].choices[0].message.content == answers[1].choices[0].message.content
    assert answers[0].usage == answers[1].usage


def test_max_tokens_defaults(client):
    """16 for completions (OpenAI's default); for chat the rest of the context, capped by the server's limit."""
    completion = client.completions.create(model=MODEL_NAME, prompt="hi", extra_body={"ignore_eos": True})
    assert completion.usage.completion_tokens == 16
    chat = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, extra_body={"ignore_eos": True})
    assert chat.usage.prompt_tokens + MAX_TOKENS_LIMIT < MAX_MODEL_LEN
    assert chat.usage.completion_tokens == MAX_TOKENS_LIMIT


def test_token_id_prompt_and_seeded_sampling(client, oracle):
    token_ids = oracle.tokenizer.encode("Once upon a time")
    text, _, _ = expected(oracle, token_ids, temperature=1.0, seed=7, max_tokens=16, ignore_eos=True)
    for _ in range(2):
        response = client.completions.create(model=MODEL_NAME, prompt=token_ids, max_tokens=16, temperature=1.0,
                                             seed=7, extra_body={"ignore_eos": True})  # fmt: skip
        assert response.choices[0].text == text
        assert response.usage.prompt_tokens == len(token_ids)


def test_penalties_and_minimums_reach_the_engine(client, oracle):
    """Penalties that reward repeats (negative, and a repetition factor below 1) change this
    model's greedy text, so the request must carry them to the engine to match."""
    fields = {"presence_penalty": -2.0, "frequency_penalty": -1.0}
    extra = {"repetition_penalty": 0.7, "min_p": 0.1, "min_tokens": 5}
    text, reason, _ = expected(oracle, "Once upon a time", temperature=0.0, max_tokens=12, **fields, **extra)
    assert text != expected(oracle, "Once upon a time", temperature=0.0, max_tokens=12)[0]
    response = client.completions.create(
        model=MODEL_NAME, prompt="Once upon a time", max_tokens=12, temperature=0.0, **fields, extra_body=extra
    )
    assert (response.choices[0].text, response.choices[0].finish_reason) == (text, reason)


@pytest.mark.parametrize("include_stop", [False, True])
def test_stop_string_cuts_streamed_and_plain_text_alike(client, oracle, include_stop):
    params = dict(temperature=1.0, seed=3, max_tokens=48, ignore_eos=True)
    full, _, _ = expected(oracle, PROMPTS[0], **params)
    # a two-character stop string from the middle of the text: its first character is held back while streaming
    start = next(i for i in range(4, len(full) - 1) if full[i : i + 2].isascii() and full[i : i + 2].isprintable())
    stop = full[start : start + 2]
    cut = full[: full.index(stop) + (len(stop) if include_stop else 0)]  # include_stop_str_in_output keeps it
    request = dict(model=MODEL_NAME, prompt=PROMPTS[0], stop=[stop], max_tokens=48, temperature=1.0, seed=3,
                   extra_body={"ignore_eos": True, "include_stop_str_in_output": include_stop})  # fmt: skip
    response = client.completions.create(**request)
    assert (response.choices[0].text, response.choices[0].finish_reason) == (cut, "stop")
    chunks = list(client.completions.create(**request, stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_batch_of_prompts_answers_each_as_the_offline_engine_does(client, oracle):
    """A list of prompts (text or token ids) is one response, streamed or not: prompt i's choice j
    at index i * n + j."""
    params = dict(temperature=1.0, seed=5, max_tokens=6, ignore_eos=True, n=2)
    ids = oracle.get_tokenizer().encode(PROMPTS[2])
    prompts = [PROMPTS[0], ids, PROMPTS[1]]
    response = client.completions.create(model=MODEL_NAME, prompt=prompts, max_tokens=6, temperature=1.0, n=2,
                                         seed=5, extra_body={"ignore_eos": True})  # fmt: skip
    wanted = [(c.text, c.finish_reason) for o in oracle.generate(prompts, SamplingParams(**params), use_tqdm=False)
              for c in o.outputs]  # fmt: skip
    assert [choice.index for choice in response.choices] == list(range(6))
    assert [(choice.text, choice.finish_reason) for choice in response.choices] == wanted
    prompt_tokens = sum(len(oracle.get_tokenizer().encode(p)) if isinstance(p, str) else len(p) for p in prompts)
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (prompt_tokens, 6 * 6)
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=prompts, max_tokens=6, temperature=1.0, n=2,
                                            seed=5, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))  # fmt: skip
    texts, reasons = [""] * 6, [None] * 6
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    assert list(zip(texts, reasons)) == wanted
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (prompt_tokens, 6 * 6)


def test_truncate_prompt_tokens_keeps_the_last_tokens_and_the_context_check_counts_them(client, oracle):
    ids = oracle.get_tokenizer().encode(PROMPTS[0])
    long_prompt = (ids * MAX_MODEL_LEN)[: MAX_MODEL_LEN + 5]  # longer than the context: kept to its last 8
    text, reason, _ = expected(oracle, long_prompt[-8:], temperature=0.0, max_tokens=5)
    for prompt in (long_prompt, oracle.get_tokenizer().decode(long_prompt)):
        response = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=5, temperature=0.0,
                                             extra_body={"truncate_prompt_tokens": 8})  # fmt: skip
        assert response.usage.prompt_tokens == 8
        assert (response.choices[0].text, response.choices[0].finish_reason) == (text, reason)


def test_n_gives_n_choices_of_the_offline_engine_streamed_or_not(client, oracle):
    params = dict(temperature=1.0, seed=11, max_tokens=12, ignore_eos=True)
    for prompt in (PROMPTS[1], CHAT):
        sampling = dataclasses.replace(oracle.engine.default_sampling_params(), n=2, **params)
        [output] = oracle.chat(prompt, sampling) if prompt is CHAT else oracle.generate(prompt, sampling)
        texts = [completion.text for completion in output.outputs]
        assert texts[0] != texts[1], "two seeded samples at temperature 1 differ"
        request = dict(model=MODEL_NAME, n=2, max_tokens=12, temperature=1.0, seed=11, extra_body={"ignore_eos": True})
        if prompt is CHAT:
            response = client.chat.completions.create(messages=CHAT, **request)
            assert [choice.message.content for choice in response.choices] == texts
        else:
            response = client.completions.create(prompt=prompt, **request)
            assert [choice.text for choice in response.choices] == texts
        assert [choice.index for choice in response.choices] == [0, 1]
        assert [choice.finish_reason for choice in response.choices] == ["length", "length"]
        assert response.usage.completion_tokens == 24
        assert response.usage.prompt_tokens == len(output.prompt_token_ids)
        if prompt is CHAT:
            chunks = list(client.chat.completions.create(messages=CHAT, stream=True, **request))
        else:
            chunks = list(client.completions.create(prompt=prompt, stream=True, **request))
        streamed, finish_reasons, roles = ["", ""], [None, None], set()
        for chunk in chunks:
            for choice in chunk.choices:
                if prompt is CHAT:
                    streamed[choice.index] += choice.delta.content or ""
                    roles |= {choice.index} if choice.delta.role == "assistant" else set()
                else:
                    streamed[choice.index] += choice.text
                assert finish_reasons[choice.index] is None, "nothing after a choice's finish reason"
                finish_reasons[choice.index] = choice.finish_reason
        assert streamed == texts and finish_reasons == ["length", "length"]
        assert roles == ({0, 1} if prompt is CHAT else set())


def test_twenty_concurrent_requests_match_the_offline_engine(server_url, oracle):
    cases = [(PROMPTS[i % len(PROMPTS)] if i % 3 else [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
              i % 2 == 0, None if i % 4 < 2 else i) for i in range(20)]  # fmt: skip
    wanted = [expected(oracle, prompt, temperature=0 if seed is None else 1.0, seed=seed, max_tokens=12,
                       ignore_eos=True)[0] for prompt, _, seed in cases]  # fmt: skip

    async def one(client, prompt, stream, seed):
        common = dict(model=MODEL_NAME, max_tokens=12, temperature=0 if seed is None else 1.0, seed=seed,
                      stream=stream, extra_body={"ignore_eos": True})  # fmt: skip
        if isinstance(prompt, str):
            response = await client.completions.create(prompt=prompt, **common)
            if not stream:
                return response.choices[0].text
            return "".join([chunk.choices[0].text async for chunk in response])
        response = await client.chat.completions.create(messages=prompt, **common)
        if not stream:
            return response.choices[0].message.content
        return "".join([chunk.choices[0].delta.content or "" async for chunk in response])

    async def run_all():
        async with openai.AsyncOpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, *case) for case in cases)), timeout=120)

    assert asyncio.run(run_all()) == wanted


# -- errors -------------------------------------------------------------------------------
def post(server_url, path, body, **kwargs) -> httpx.Response:
    content = json.dumps(body) if isinstance(body, dict) else body
    return httpx.post(f"{server_url}{path}", content=content, headers={"Content-Type": "application/json"},
                      timeout=30, **kwargs)  # fmt: skip


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    if param is not None:
        assert param in error["message"]
    return error


COMPLETION_ERRORS = [
    ({"temperature": -1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "ten"}, "max_tokens"),
    ({"max_tokens": MAX_TOKENS_LIMIT + 1}, "max_tokens"),
    ({"stop": [1]}, "stop"),
    ({"stop_token_ids": [10**6]}, "stop_token_ids"),
    ({"seed": -1}, "seed"),
    ({"n": 0}, "n"),
    ({"n": 1.5}, "n"),
    ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options"),
    ({"ignore_eos": "no"}, "ignore_eos"),
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": True}, "logprobs"),
    ({"echo": "yes"}, "echo"),
    ({"echo": True, "stream": True}, "echo"),
    ({"max_tokens": 0, "echo": False}, "max_tokens"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": "high"}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_p": 1.5}, "min_p"),
    ({"min_tokens": 17}, "min_tokens"),
    ({"prompt": ["one", 2]}, "prompt"),
    ({"prompt": ["one", ""]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["one", [1, 10**6]]}, "prompt"),  # the engine refuses the second: the first is aborted
    ({"prompt": None}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt_logprobs": 21}, "prompt_logprobs"),
    ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ({"prompt": [1, 10**6]}, "prompt"),
    ({"prompt": [65] * (MAX_MODEL_LEN + 1)}, "prompt"),
]


@pytest.mark.parametrize("fields, param", COMPLETION_ERRORS)
def test_bad_completion_fields_are_400s_that_name_the_field(server_url, fields, param):
    assert_error(post(server_url, "/v1/completions", {"model": MODEL_NAME, "prompt": "hi", **fields}), 400, param)


CHAT_ERRORS = [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"max_completion_tokens": MAX_TOKENS_LIMIT + 1}, "max_completion_tokens"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"top_p": 2}, "top_p"),
    ({"logprobs": 1}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"echo": True}, "echo"),
]


@pytest.mark.parametrize("fields, param", CHAT_ERRORS)
def test_bad_chat_fields_are_400s_that_name_the_field(server_url, fields, param):
    body = {"messages": [{"role": "user", "content": "hi"}], **fields}
    assert_error(post(server_url, "/v1/chat/completions", body), 400, param)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_malformed_or_oversized_bodies_and_unknown_models(server_url, path):
    assert "not valid JSON" in assert_error(post(server_url, path, '{"prompt": "hi",'), 400)["message"]
    assert "not valid JSON" in assert_error(post(server_url, path, "[" * 3000), 400)["message"]
    assert "JSON object" in assert_error(post(server_url, path, "[1, 2]"), 400)["message"]
    oversized = {"prompt": "x" * MAX_BODY_BYTES, "messages": [{"role": "user", "content": "x"}]}
    assert_error(post(server_url, path, oversized), 413)
    chunked = post(server_url, path, iter([b'{"prompt": "', b"x" * MAX_BODY_BYTES, b'"}']))
    assert_error(chunked, 413)
    body = {"model": "gpt-4o", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}
    error = assert_error(post(server_url, path, body), 404, "model")
    assert error["code"] == "model_not_found"


def test_openai_client_raises_on_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4o", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=MODEL_NAME, messages=CHAT, temperature=-0.5)


def test_unknown_routes_and_methods_answer_in_the_error_shape(server_url):
    assert_error(httpx.get(f"{server_url}/v1/nothing"), 404)
    assert_error(httpx.get(f"{server_url}/v1/completions"), 405)
