"""AsyncEngine in process: outputs as the offline engine makes them, refusals, aborts, and
what open requests see when the engine thread stops (shut down, or a step that raises)."""

import asyncio
import dataclasses

import pytest

from tests.server_fixtures import tiny_model_dir  # noqa: F401
from tinyvllm.engine.async_engine import AsyncEngine, EngineClosedError
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.llm import LLM

PROMPT = "Once upon a time"
TIMEOUT_S = 60


@pytest.fixture
def engine(tiny_model_dir):  # noqa: F811
    async_engine = AsyncEngine(LLMEngine(tiny_model_dir, backend="numpy", num_blocks=64, max_model_len=256))
    async_engine.start()
    yield async_engine
    async_engine.shutdown()


def params(engine: AsyncEngine, **fields):
    return dataclasses.replace(engine.engine.default_sampling_params(), ignore_eos=True, **fields)


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, TIMEOUT_S))


def test_outputs_match_the_offline_engine_and_blocks_come_back(engine, tiny_model_dir):  # noqa: F811
    wanted = [params(engine, temperature=0, max_tokens=10), params(engine, temperature=1.0, seed=4, max_tokens=14)]
    offline = LLM(tiny_model_dir, backend="numpy", num_blocks=64, max_model_len=256).generate([PROMPT] * 2, wanted)

    async def generate(request_id, sampling):
        outputs = [output async for output in await engine.add_request(PROMPT, sampling, request_id)]
        assert all(not output.finished for output in outputs[:-1]) and outputs[-1].finished
        return outputs[-1]

    async def both():
        return await asyncio.gather(*(generate(str(i), sampling) for i, sampling in enumerate(wanted)))

    def summary(outputs):
        return [(c.text, c.token_ids, c.finish_reason) for output in outputs for c in output.outputs]

    assert summary(run(both())) == summary(offline)
    stats = engine.stats()
    assert stats["num_requests_served"] == 2 and stats["num_free_blocks"] == stats["num_total_blocks"]


def test_bad_requests_raise_the_engines_value_error(engine):
    async def bad():
        with pytest.raises(ValueError, match="prompt"):
            await engine.add_request("", params(engine), "empty")
        with pytest.raises(ValueError, match="max_model_len"):
            await engine.add_request([65] * 300, params(engine), "long")

    run(bad())
    assert engine.stats()["num_requests_rejected"] == 2


def test_abort_frees_the_blocks_at_once(engine):
    async def abort_after_one():
        stream = await engine.add_request(PROMPT, params(engine, max_tokens=200), "long")
        await anext(stream)
        stream.abort()
        with pytest.raises(StopAsyncIteration):
            await anext(stream)

    run(abort_after_one())
    engine.shutdown()  # the thread applies the abort before it stops
    stats = engine.stats()
    assert stats["num_requests_aborted"] == 1 and stats["num_requests_served"] == 0
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_shutdown_fails_open_requests_and_refuses_new_ones(engine):
    async def shut_down_midway():
        stream = await engine.add_request(PROMPT, params(engine, max_tokens=200), "open")
        await anext(stream)
        await asyncio.to_thread(engine.shutdown)
        with pytest.raises(EngineClosedError, match="shutting down"):
            async for _ in stream:
                pass
        with pytest.raises(EngineClosedError):
            await engine.add_request(PROMPT, params(engine), "late")

    run(shut_down_midway())
    assert not engine.is_alive


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_failing_step_fails_open_requests_instead_of_hanging(engine, monkeypatch):
    def broken_step():
        raise RuntimeError("simulated device fault")

    async def fail_midway():
        stream = await engine.add_request(PROMPT, params(engine, max_tokens=200), "open")
        await anext(stream)
        monkeypatch.setattr(engine.engine, "step", broken_step)
        with pytest.raises(EngineClosedError, match="engine failed"):
            async for _ in stream:
                pass
        with pytest.raises(EngineClosedError):
            await engine.add_request(PROMPT, params(engine), "late")

    run(fail_midway())
    assert not engine.is_alive
