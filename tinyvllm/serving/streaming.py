"""Server-sent events: one request's outputs as OpenAI's stream chunks.

Per step, one chunk for each choice whose text that step made final (with the logprobs of its
tokens since the chunk before), then its finish reason, usage when asked, and `data: [DONE]`.
Text that could be the start of a stop string is held back until the next tokens tell (the
engine cuts a stop string when it completes; with include_stop_str_in_output nothing is cut, so
nothing is held), so the streamed deltas always add up to the non-streamed text. The response
aborts its request however it ends: finished, client gone, or an error.
"""

import json
from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tinyvllm.engine.async_engine import EngineClosedError, RequestStream
from tinyvllm.engine.detokenizer import partial_stop_length
from tinyvllm.engine.sequence import RequestOutput
from tinyvllm.serving.protocol import API, GenerationRequest, OpenAIError, usage


# --8<-- [start:stream-events]
async def stream_events(
    api: API, head: dict, outputs: AsyncIterator[RequestOutput], generation: GenerationRequest
) -> AsyncIterator[bytes]:
    """The SSE chunks of one request's outputs: for each choice, deltas of final text (with
    the logprobs of the tokens since the last chunk) and its finish reason; then usage, [DONE]."""
    params = generation.params
    stop = [] if params.include_stop_str_in_output else params.stop  # kept in the text: nothing to hold back
    top = params.logprobs
    extra = {"usage": None} if generation.include_usage else {}
    n = generation.params.n
    for index in range(n):
        first = api.first_chunk_choice(index)
        if first is not None:
            yield _event({**head, "choices": [first], **extra})
    sent = [""] * n
    sent_tokens = [0] * n
    ended = [False] * n
    try:
        async for output in outputs:
            for completion in output.outputs:
                index, text, finished = completion.index, completion.text, completion.finished()
                if ended[index]:
                    continue
                if not finished:
                    text = text[: len(text) - partial_stop_length(text, stop)]
                if len(text) > len(sent[index]) or finished:
                    logprobs = api.logprobs(completion, sent_tokens[index], top)
                    choice = api.chunk_choice(index, text[len(sent[index]) :], completion.finish_reason, logprobs)
                    yield _event({**head, "choices": [choice], **extra})
                    sent[index], sent_tokens[index], ended[index] = text, len(completion.token_ids), finished
        if generation.include_usage:
            yield _event({**head, "choices": [], "usage": usage(output)})
    except EngineClosedError as error:
        yield _event(OpenAIError(503, str(error)).body())
    yield b"data: [DONE]\n\n"


# --8<-- [end:stream-events]


def _event(value: dict) -> bytes:
    # ASCII-only JSON: raw U+2028, U+2029 and U+0085 in generated text end a line for the line
    # readers many SSE clients use (str.splitlines, httpx's aiter_lines) and cut the event.
    return b"data: " + json.dumps(value, separators=(",", ":")).encode() + b"\n\n"


class EventStream(StreamingResponse):
    """Server-sent events that abort their request however the response ends: finished,
    client gone (Starlette cancels the stream), or an error."""

    def __init__(self, events: AsyncIterator[bytes], stream: RequestStream) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.request_stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.request_stream.abort()
