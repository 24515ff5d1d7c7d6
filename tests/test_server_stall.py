"""A step that will not end: /health says the engine is stalled, and shutdown does not wait
for the step (in process, Starlette's TestClient over a tiny NumPy engine whose step is held
on an event, so the test decides how long a step runs)."""

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
