"""Server-sent events: a request's outputs as OpenAI's stream chunks.

Per step, one chunk for each choice whose text that step made final (with the logprobs of its
tokens since the chunk before), then its finish reason, usage when asked, and `data: [DONE]`.
A completions batch streams its prompts' chunks merged as they come, prompt i's choice j at
index i * n + j, as vLLM numbers them. Text that could be the start of a stop string is held
back until the next tokens tell (the engine cuts a stop string when it completes; with
include_stop_str_in_output nothing is cut, so nothing is held), so the streamed deltas always add
up to the non-streamed text. The response aborts its requests however it ends: finished, client
gone, or an error.
"""

import asyncio
import json
from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tinyvllm.engine.async_engine import EngineClosedError, RequestStream
from tinyvllm.engine.detokenizer import partial_stop_length
from tinyvllm.engine.sequence import RequestOutput
from tinyvllm.serving.errors import OpenAIError
from tinyvllm.serving.protocol import GenerationRequest
from tinyvllm.serving.responses import API, usage


# --8<-- [start:stream-events]
async def stream_events(
    api: API, head: dict, prompts: list[tuple[AsyncIterator[RequestOutput], GenerationRequest]]
) -> AsyncIterator[bytes]:
    """The SSE chunks of a request's prompts (one, or a completions batch), each prompt's outputs
    with its GenerationRequest: chunks as they come, then usage (all prompts'), then [DONE]."""
    include_usage = prompts[0][1].include_usage
    extra = {"usage": None} if include_usage else {}
    chunks: asyncio.Queue = asyncio.Queue()  # a choice per chunk; a prompt's number when it has ended
    index = 0
    for _, generation in prompts:
        for choice in filter(None, (api.first_chunk_choice(index + i) for i in range(generation.params.n))):
            yield _event({**head, "choices": [choice], **extra})
        index += generation.params.n
    pumps = [asyncio.ensure_future(_pump(api, outputs, generation, number, chunks))
             for number, (outputs, generation) in enumerate(prompts)]  # fmt: skip
    last = []
    try:
        while len(last) < len(prompts):
            chunk = await chunks.get()
            if isinstance(chunk, int):
                last.append(await pumps[chunk])  # its last output, or the error that ended it
            else:
                yield _event({**head, "choices": [chunk], **extra})
        if include_usage:
            yield _event({**head, "choices": [], "usage": usage(*last)})
    except EngineClosedError as error:
        yield _event(OpenAIError(503, str(error)).body())
    finally:
        for pump in pumps:  # the response ended early (client gone, error): stop the rest
            pump.cancel()
    yield b"data: [DONE]\n\n"


async def _pump(
    api: API, outputs: AsyncIterator[RequestOutput], generation: GenerationRequest, number: int, chunks
) -> RequestOutput:
    """Prompt `number`'s choice chunks into `chunks`: for each choice, deltas of final text (with
    the logprobs of the tokens since the last chunk) and its finish reason. Returns the prompt's
    last output; its number goes into `chunks` however it ends, so the reader never waits on it."""
    params = generation.params
    stop = [] if params.include_stop_str_in_output else params.stop  # kept in the text: nothing to hold back
    sent, sent_tokens, ended = [""] * params.n, [0] * params.n, [False] * params.n
    try:
        async for output in outputs:
            for completion in output.outputs:
                index, text, finished = completion.index, completion.text, completion.finished()
                if ended[index]:
                    continue
                if not finished:
                    text = text[: len(text) - partial_stop_length(text, stop)]
                if len(text) > len(sent[index]) or finished:
                    logprobs = api.logprobs(completion, sent_tokens[index], params.logprobs)
                    delta, reason = text[len(sent[index]) :], completion.finish_reason
                    chunks.put_nowait(api.chunk_choice(number * params.n + index, delta, reason, logprobs))
                    sent[index], sent_tokens[index], ended[index] = text, len(completion.token_ids), finished
        return output
    finally:
        chunks.put_nowait(number)


# --8<-- [end:stream-events]


def _event(value: dict) -> bytes:
    # ASCII-only JSON: raw U+2028, U+2029 and U+0085 in generated text end a line for the line
    # readers many SSE clients use (str.splitlines, httpx's aiter_lines) and cut the event.
    return b"data: " + json.dumps(value, separators=(",", ":")).encode() + b"\n\n"


class EventStream(StreamingResponse):
    """Server-sent events that abort their request however the response ends: finished,
    client gone (Starlette cancels the stream), or an error."""

    def __init__(self, events: AsyncIterator[bytes], streams: list[RequestStream]) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.request_streams = streams

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for stream in self.request_streams:
                stream.abort()
