"""Prompt plus max_tokens beyond the context: a 400 that gives both numbers, as vLLM answers
(in process, Starlette's TestClient over a tiny NumPy engine of 256 positions), and the prompt's
tokens counted once. The oracle for the numbers is the engine's own tokenizer and max_model_len."""

import pytest
from starlette.testclient import TestClient

from tests.server_fixtures import tiny_model_dir  # noqa: F401
from tinyvllm.engine.async_engine import AsyncEngine
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.serving.server import OpenAIServer, ServerConfig

MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def client(tiny_model_dir):  # noqa: F811
    engine = LLMEngine(tiny_model_dir, backend="numpy", num_blocks=64, max_model_len=MAX_MODEL_LEN)
    config = ServerConfig(served_model_name="tiny", max_tokens_limit=MAX_MODEL_LEN, stats_interval_s=None)
    with TestClient(OpenAIServer(AsyncEngine(engine), config).app()) as client:
        yield client, engine


def assert_refused_with_both_numbers(response, param: str, prompt_len: int, max_tokens: int) -> None:
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in error["message"]
    assert f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens}" in error["message"]


def test_a_text_prompt_and_max_tokens_past_the_context_are_refused(client):
    client, engine = client
    prompt = "Hello there"
    prompt_len = len(engine.tokenizer.encode(prompt))
    max_tokens = MAX_MODEL_LEN - prompt_len + 1
    response = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens})
    assert_refused_with_both_numbers(response, "max_tokens", prompt_len, max_tokens)


def test_token_ids_that_just_fit_are_served_and_one_more_is_refused(client):
    client, _ = client
    prompt = list(range(1, 201))
    fits = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": MAX_MODEL_LEN - 200, "temperature": 0})
    assert fits.status_code == 200
    over = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": MAX_MODEL_LEN - 199})
    assert_refused_with_both_numbers(over, "max_tokens", 200, MAX_MODEL_LEN - 199)


def test_chat_names_max_completion_tokens(client):
    client, engine = client
    messages = [{"role": "user", "content": "Hi"}]
    prompt_len = len(engine.tokenizer.encode_chat(messages))
    body = {"messages": messages, "max_completion_tokens": MAX_MODEL_LEN}
    response = client.post("/v1/chat/completions", json=body)
    assert_refused_with_both_numbers(response, "max_completion_tokens", prompt_len, MAX_MODEL_LEN)


def test_a_default_max_tokens_is_not_refused_and_stops_at_the_context(client):
    client, _ = client
    response = client.post("/v1/completions", json={"prompt": list(range(1, MAX_MODEL_LEN - 2)), "temperature": 0})
    assert response.status_code == 200
    (choice,) = response.json()["choices"]
    assert choice["finish_reason"] == "length"
    assert response.json()["usage"]["total_tokens"] == MAX_MODEL_LEN


def test_a_text_prompt_is_tokenized_once_and_served_as_its_tokens(client, monkeypatch):
    client, engine = client
    prompt = "Hello there, how are you"
    expected = engine.tokenizer.encode(prompt)
    calls = []
    encode = engine.tokenizer.encode
    monkeypatch.setattr(engine.tokenizer, "encode", lambda text, **kw: calls.append(text) or encode(text, **kw))
    response = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, "temperature": 0})
    assert response.status_code == 200
    assert calls == [prompt]
    assert response.json()["usage"]["prompt_tokens"] == len(expected)
    direct = client.post("/v1/completions", json={"prompt": expected, "max_tokens": 2, "temperature": 0}).json()
    assert response.json()["choices"][0]["text"] == direct["choices"][0]["text"]
