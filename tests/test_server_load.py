"""The server under load and when clients go away: /metrics must show every request
finished or aborted and every KV block back in the free pool."""

import asyncio
import json
import time

import httpx
import pytest

from tests.server_fixtures import serve, tiny_model_dir  # noqa: F401

NUM_BLOCKS = 1024
MAX_MODEL_LEN = 8192
LONG = 8000  # tokens: seconds of work, far longer than a client waits before leaving
LOAD_CLIENTS = 200
LOAD_TOKENS = 4
LOAD_TIMEOUT_S = 150
SETTLE_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def server_url(tiny_model_dir):  # noqa: F811
    args = ["--model", str(tiny_model_dir), "--backend", "numpy", "--num-blocks", str(NUM_BLOCKS),
            "--max-model-len", str(MAX_MODEL_LEN)]  # fmt: skip
    with serve(args) as url:
        yield url


def metrics(url: str) -> dict:
    return httpx.get(f"{url}/metrics?format=json").json()


def settled(url: str, aborted: int) -> dict:
    """/metrics once nothing runs or waits and `aborted` requests have been aborted (or the timeout)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        now = metrics(url)
        idle = now["num_requests_running"] == now["num_requests_waiting"] == 0
        if (idle and now["num_requests_aborted"] >= aborted) or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


def long_request(chat: bool, stream: bool) -> tuple[str, dict]:
    body = {"max_tokens": LONG, "ignore_eos": True, "temperature": 0, "stream": stream}
    if chat:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "Tell me everything."}]}
    return "/v1/completions", {**body, "prompt": "Tell me everything."}


@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
def test_a_client_leaving_mid_stream_aborts_its_request(server_url, chat):
    before = metrics(server_url)
    path, body = long_request(chat, stream=True)
    with httpx.Client(base_url=server_url, timeout=30) as client:
        with client.stream("POST", path, json=body) as response:
            assert response.status_code == 200
            assert next(response.iter_lines()).startswith("data: ")
    after = settled(server_url, before["num_requests_aborted"] + 1)
    assert after["num_requests_aborted"] == before["num_requests_aborted"] + 1
    assert after["num_requests_served"] == before["num_requests_served"]
    assert after["num_free_blocks"] == after["num_total_blocks"] == NUM_BLOCKS


def test_a_client_leaving_before_a_plain_answer_aborts_its_request(server_url):
    before = metrics(server_url)
    path, body = long_request(chat=False, stream=False)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server_url}{path}", json=body, timeout=httpx.Timeout(30, read=0.5))
    after = settled(server_url, before["num_requests_aborted"] + 1)
    assert after["num_requests_aborted"] == before["num_requests_aborted"] + 1
    assert after["num_requests_served"] == before["num_requests_served"]
    assert after["num_free_blocks"] == NUM_BLOCKS


def test_a_batch_frees_every_prompt_when_the_client_leaves_or_one_prompt_is_bad(server_url):
    before = metrics(server_url)
    body = {"prompt": ["Tell me everything.", "And more."], "max_tokens": LONG, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server_url}/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.5))
    after = settled(server_url, before["num_requests_aborted"] + 2)
    assert after["num_requests_aborted"] == before["num_requests_aborted"] + 2
    bad = httpx.post(f"{server_url}/v1/completions", json={**body, "prompt": ["queued first", [1, 10**6]]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    after = settled(server_url, before["num_requests_aborted"] + 3)
    assert after["num_requests_served"] == before["num_requests_served"]
    assert after["num_free_blocks"] == NUM_BLOCKS


async def stream_one(client: httpx.AsyncClient, index: int) -> tuple[str, dict]:
    """One streamed completion: (its text, its usage)."""
    body = {"prompt": f"request {index}", "max_tokens": LOAD_TOKENS, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    text, usage, done = "", None, False
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line:
                continue
            assert not done, "data after [DONE]"
            payload = line.removeprefix("data: ")
            if payload == "[DONE]":
                done = True
                continue
            chunk = json.loads(payload)
            assert "error" not in chunk, chunk
            if chunk["choices"]:
                text += chunk["choices"][0]["text"]
            else:
                usage = chunk["usage"]
    assert done
    return text, usage


def test_200_concurrent_streams_all_complete(server_url):
    before = metrics(server_url)

    async def run_all():
        limits = httpx.Limits(max_connections=LOAD_CLIENTS)
        async with httpx.AsyncClient(base_url=server_url, limits=limits, timeout=LOAD_TIMEOUT_S) as client:
            tasks = (stream_one(client, index) for index in range(LOAD_CLIENTS))
            return await asyncio.wait_for(asyncio.gather(*tasks), LOAD_TIMEOUT_S)

    results = asyncio.run(run_all())
    assert len(results) == LOAD_CLIENTS
    assert all(usage["completion_tokens"] == LOAD_TOKENS for _, usage in results)
    after = settled(server_url, before["num_requests_aborted"])
    assert after["num_requests_served"] == before["num_requests_served"] + LOAD_CLIENTS
    assert after["num_requests_aborted"] == before["num_requests_aborted"]
    assert after["num_free_blocks"] == NUM_BLOCKS
