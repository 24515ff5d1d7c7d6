"""Server-sent events from every intermediate engine output, in process (no HTTP).

Over HTTP a fast engine's outputs coalesce (a stream skips to the newest), so whether a
stop string's first characters arrive one step before the rest is luck there. Here the
SSE generator sees every step's output of a real engine (the tiny random model): the
streamed deltas must add up to the engine's final text whatever stop string cuts it, and
that text must be the unstopped text up to the stop string's first occurrence.
"""

import asyncio
import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.server_fixtures import tiny_model_dir  # noqa: F401
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.serving.protocol import GenerationRequest
from tinyvllm.serving.responses import ChatAPI, CompletionsAPI, response_head
from tinyvllm.serving.streaming import stream_events

PROMPT = "The quick brown fox"
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def engine(tiny_model_dir):  # noqa: F811
    return LLMEngine(tiny_model_dir, backend="numpy", num_blocks=64, max_model_len=256)


def every_output(engine: LLMEngine, params) -> list:
    request_id = engine.add_request(PROMPT, params)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [output for output in engine.step() if output.request_id == request_id]
    return outputs


async def replay(outputs):
    for output in outputs:
        yield output


def streamed(api, outputs, generation) -> tuple[str, list[dict]]:
    """The concatenated deltas and the parsed chunks of the SSE stream over `outputs`."""

    async def collect():
        head = response_head(api, "id", "model", chunk=True)
        return [event async for event in stream_events(api, head, [(replay(outputs), generation)])]

    events = asyncio.run(collect())
    assert events[-1] == b"data: [DONE]\n\n"
    chunks = [json.loads(event.removeprefix(b"data: ")) for event in events[:-1]]
    choices = [chunk["choices"][0] for chunk in chunks if chunk["choices"]]
    if api is ChatAPI:
        return "".join(choice["delta"].get("content", "") for choice in choices), chunks
    return "".join(choice["text"] for choice in choices), chunks


@given(seed=st.integers(0, 2**31), position=st.integers(0, 2**31), length=st.integers(2, 4),
       chat=st.booleans(), include_usage=st.booleans())  # fmt: skip
def test_streamed_deltas_add_up_to_the_stopped_text(engine, seed, position, length, chat, include_usage):
    base = dataclasses.replace(engine.default_sampling_params(), seed=seed, max_tokens=MAX_TOKENS, ignore_eos=True)
    full = every_output(engine, base)[-1].outputs[0].text
    start = position % max(len(full) - 1, 1)
    stop = full[start : start + length] or "never generated \u2603"
    params = dataclasses.replace(base, stop=[stop])
    outputs = every_output(engine, params)
    final = outputs[-1].outputs[0]
    assert final.text == (full[: full.index(stop)] if stop in full else full)
    api = ChatAPI if chat else CompletionsAPI
    generation = GenerationRequest(PROMPT, params, stream=True, include_usage=include_usage, prompt_field="prompt")
    text, chunks = streamed(api, outputs, generation)
    assert text == final.text
    finish_reasons = [chunk["choices"][0]["finish_reason"] for chunk in chunks if chunk["choices"]]
    assert finish_reasons[-1] == final.finish_reason and not any(finish_reasons[:-1])
    if include_usage:
        assert chunks[-1]["usage"]["completion_tokens"] == len(final.token_ids)


@given(seed=st.integers(0, 2**31), position=st.integers(0, 2**31), chat=st.booleans())
def test_each_of_n_choices_streams_its_own_text_and_one_finish_reason(engine, seed, position, chat):
    base = dataclasses.replace(engine.default_sampling_params(), n=3, seed=seed, max_tokens=MAX_TOKENS, ignore_eos=True)
    full = every_output(engine, base)[-1].outputs[1].text
    start = position % max(len(full) - 1, 1)
    params = dataclasses.replace(base, stop=[full[start : start + 2] or "never generated \u2603"])
    outputs = every_output(engine, params)
    api = ChatAPI if chat else CompletionsAPI
    generation = GenerationRequest(PROMPT, params, stream=True, include_usage=True, prompt_field="prompt")
    _, chunks = streamed(api, outputs, generation)
    texts, finish_reasons = ["", "", ""], [[], [], []]
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["delta"].get("content", "") if chat else choice["text"]
        finish_reasons[choice["index"]].append(choice["finish_reason"])
    assert texts == [completion.text for completion in outputs[-1].outputs]
    for reasons, completion in zip(finish_reasons, outputs[-1].outputs):
        assert reasons[-1] == completion.finish_reason and not any(reasons[:-1])
    assert chunks[-1]["usage"]["completion_tokens"] == sum(len(c.token_ids) for c in outputs[-1].outputs)


def test_each_event_is_one_line_whatever_the_text_holds(engine):
    """Characters that str.splitlines and httpx's line reader take for line ends (U+2028,
    U+2029, U+0085, CR) arrive escaped: every event is one `data:` line and a blank one."""
    params = dataclasses.replace(engine.default_sampling_params(), max_tokens=4, ignore_eos=True)
    final = every_output(engine, params)[-1]
    text = "a\u2028b\u2029c\x85d\re\nf \u00e9\u2603"
    generation = GenerationRequest(PROMPT, params, stream=True, include_usage=False, prompt_field="prompt")

    async def collect():
        head = response_head(CompletionsAPI, "id", "model", chunk=True)
        completion = dataclasses.replace(final.outputs[0], text=text)
        outputs = replay([dataclasses.replace(final, outputs=[completion])])
        return [event async for event in stream_events(CompletionsAPI, head, [(outputs, generation)])]

    events = asyncio.run(collect())
    for event in events:
        assert event.decode().splitlines() == [event.decode().removesuffix("\n\n"), ""], event
    assert json.loads(events[0].removeprefix(b"data: "))["choices"][0]["text"] == text
