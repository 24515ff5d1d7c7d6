"""A step that will not end: /health says the engine is stalled, a bad request is still refused
at once (its checks do not wait for the engine thread) while a good one queues, and shutdown
does not wait for the step (in process, Starlette's TestClient over a tiny NumPy engine whose
step is held on an event, so the test decides how long a step runs)."""

import asyncio
import threading
import time

import pytest
from starlette.testclient import TestClient

from tests.server_fixtures import tiny_model_dir  # noqa: F401
from tinyvllm.engine.async_engine import AsyncEngine
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.sampling_params import SamplingParams
from tinyvllm.serving.server import OpenAIServer, ServerConfig

BODY = {"prompt": "Hello", "max_tokens": 4, "temperature": 0}


@pytest.fixture
def held_engine(tiny_model_dir, monkeypatch):  # noqa: F811
    """An engine whose steps wait for `release` (set it to let them run)."""
    engine = LLMEngine(tiny_model_dir, backend="numpy", num_blocks=64, max_model_len=256)
    release, entered = threading.Event(), threading.Event()
    step = engine.step

    def held_step():
        entered.set()
        release.wait()
        return step()

    monkeypatch.setattr(engine, "step", held_step)
    return engine, entered, release


def client_for(engine: LLMEngine) -> TestClient:
    config = ServerConfig(served_model_name="tiny", max_tokens_limit=16, stats_interval_s=None, stall_timeout_s=0.5)
    return TestClient(OpenAIServer(AsyncEngine(engine), config).app())


def test_health_reports_a_step_past_the_stall_timeout_then_recovers(held_engine):
    engine, entered, release = held_engine
    with client_for(engine) as client:
        assert client.get("/health").json() == {"status": "ok"}
        answers = []
        request = threading.Thread(target=lambda: answers.append(client.post("/v1/completions", json=BODY)))
        request.start()
        assert entered.wait(30)
        time.sleep(0.7)
        stalled = client.get("/health")
        assert stalled.status_code == 503 and stalled.json()["status"] == "stalled"
        assert stalled.json()["step_seconds"] >= 0.5
        release.set()
        request.join(60)
        assert answers[0].status_code == 200
        assert client.get("/health").json() == {"status": "ok"}


REFUSED_AT_ONCE_S = 1.0
BAD_REQUESTS = [  # (path, body, the field the 400 names): checks of the server, then of the engine
    ("/v1/completions", {"prompt": "Hello", "temperature": -1}, "temperature"),
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 250}, "max_tokens"),
    ("/v1/completions", {"prompt": [1, 10**6]}, "prompt"),
    ("/v1/completions", {"prompt": [65] * 257}, "prompt"),
    ("/v1/completions", {"prompt": "Hello", "stop_token_ids": [10**6]}, "stop_token_ids"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 255}, "max_tokens"),
]


def post_in_thread(client: TestClient, path: str, body: dict, answers: list) -> threading.Thread:
    """Start posting `body`; its response is appended to `answers`."""
    thread = threading.Thread(target=lambda: answers.append(client.post(path, json=body)))
    thread.start()
    return thread


def test_bad_requests_are_refused_at_once_while_a_step_runs_and_good_ones_queue(held_engine):
    engine, entered, release = held_engine
    with client_for(engine) as client:
        answers = []
        running = post_in_thread(client, "/v1/completions", BODY, answers)
        assert entered.wait(30)
        queued = post_in_thread(client, "/v1/completions", {**BODY, "prompt": "Queued"}, answers)
        try:
            for path, body, param in BAD_REQUESTS:
                refusal = []
                post_in_thread(client, path, body, refusal).join(REFUSED_AT_ONCE_S)
                assert refusal, f"{body} was not answered within {REFUSED_AT_ONCE_S} s while a step ran"
                assert refusal[0].status_code == 400 and refusal[0].json()["error"]["param"] == param, refusal[0].text
            assert running.is_alive() and queued.is_alive() and not answers, "the step is still held"
            stats = client.get("/metrics", params={"format": "json"}).json()
            assert stats["num_requests_rejected"] == 3  # the engine's checks (the server's own come first)
        finally:
            release.set()
        running.join(60)
        queued.join(60)
        assert [answer.status_code for answer in answers] == [200, 200]


def test_shutdown_does_not_wait_for_a_step_that_will_not_end(held_engine):
    """The server's lifespan gives the engine ENGINE_STOP_S; uvicorn has cut the connections
    by then, and the held step's daemon thread ends with the process."""
    engine, entered, release = held_engine
    async_engine = AsyncEngine(engine)
    async_engine.start()

    async def submit():
        return await async_engine.add_request("Hello", SamplingParams(max_tokens=4), "held")

    asyncio.run(submit())
    assert entered.wait(30)
    began = time.monotonic()
    assert async_engine.shutdown(timeout=0.5) is False
    assert time.monotonic() - began < 2
    release.set()  # the step ends, and the thread sees the stop command
    assert async_engine.shutdown(timeout=30) is True
