"""An OpenAI-compatible HTTP server (`tinyvllm serve`): Starlette on uvicorn, over AsyncEngine.

    GET  /v1/models            the one served model
    POST /v1/completions       prompt (text or token ids, or a list of them) -> text
    POST /v1/chat/completions  messages -> assistant message
    GET  /health               200 while the engine thread runs; 503 once it stopped, or while
                               one step has run past the stall timeout
    GET  /metrics              Prometheus text (`tinyvllm.serving.metrics`); ?format=json: the
                               engine's stats as JSON
    POST /tokenize, /detokenize  vLLM's: the model's token ids of a prompt or chat, and back
                               (`tinyvllm.serving.tokenize`)
    GET  /version              {"version": tinyvllm's}

Both generation endpoints stream server-sent events with `"stream": true` (per step, one chunk
for each choice whose text that step made final, then `data: [DONE]`), and answer with one JSON
object otherwise. With `n`, a response has n choices, told apart by their `index`.
Request fields are described in `tinyvllm.serving.protocol` (a chat's: `messages`), the answers'
shapes in `responses`. Errors come in OpenAI's shape (`errors`): 400 for a bad field or malformed
JSON, 404 for another model's name, 413 for a body over the limit, 503 once the engine has stopped.
A client that goes away aborts its request, freeing its KV blocks at once, streaming or not.

Streaming (`tinyvllm.serving.streaming`) holds back text that could be the start of a stop
string, so the streamed deltas always add up to the non-streamed text.

With an API key (`--api-key` or VLLM_API_KEY), /v1/* needs `Authorization: Bearer <key>`; without
one it binds 127.0.0.1 unless told otherwise. Request and stats logs: `tinyvllm.serving.middleware`.
"""

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tinyvllm import __version__
from tinyvllm.config import EngineConfig
from tinyvllm.engine.async_engine import AsyncEngine, EngineClosedError
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.engine.sequence import RequestOutput
from tinyvllm.model.tokenizer import load_chat_template
from tinyvllm.serving.echo import echo_choice
from tinyvllm.serving.errors import OpenAIError
from tinyvllm.serving.logprobs import prompt_logprobs
from tinyvllm.serving.metrics import CONTENT_TYPE, ServerMetrics
from tinyvllm.serving.middleware import ServingMiddleware, default_logging, log_stats_forever, logger
from tinyvllm.serving.protocol import (
    GenerationRequest,
    bad_request,
    check_model,
    completion_prompts,
    parse_chat,
    parse_completion,
)  # fmt: skip
from tinyvllm.serving.responses import API, ChatAPI, CompletionsAPI, response_head, usage
from tinyvllm.serving.streaming import EventStream, stream_events
from tinyvllm.serving.tokenize import detokenize, tokenize

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_BODY_BYTES = 1 << 20
STATS_INTERVAL_S = 10.0
STALL_TIMEOUT_S = 60.0
"""A step longer than this makes /health answer 503 "stalled" (GPU steps take milliseconds,
NumPy steps seconds: its token budget is sized so)."""
GRACEFUL_SHUTDOWN_S = 2  # then open responses are cut (the engine has failed their requests already)
ENGINE_STOP_S = 2  # then the process exits without waiting for the step in progress
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client left first"; nobody reads it


@dataclass(kw_only=True)
class ServerConfig:
    served_model_name: str
    max_tokens_limit: int  # the most max_tokens a request may ask for
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    api_key: str | None = None  # required on /v1/* when set
    log_requests: bool = True
    stats_interval_s: float | None = STATS_INTERVAL_S  # None: no periodic stats line
    stall_timeout_s: float = STALL_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("max_tokens_limit", "max_body_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


class OpenAIServer:
    def __init__(self, engine: AsyncEngine, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self.defaults = engine.engine.default_sampling_params()
        self.created = int(time.time())
        self.request_metrics = ServerMetrics(config.served_model_name, engine.stats)

    def app(self) -> Starlette:
        routes = [
            Route("/health", self.health),
            Route("/metrics", self.metrics),
            Route("/version", self.version),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/v1/models", self.models),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
        ]
        handlers = {OpenAIError: _error_response, HTTPException: _http_error, EngineClosedError: _engine_closed}
        app = Starlette(routes=routes, exception_handlers=handlers, lifespan=self._lifespan)
        app.add_middleware(ServingMiddleware, api_key=self.config.api_key, log_requests=self.config.log_requests)
        return app

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette):
        self.engine.start()
        stats = asyncio.create_task(log_stats_forever(self.engine, self.request_metrics, self.config.stats_interval_s))
        yield
        stats.cancel()
        if not await asyncio.to_thread(self.engine.shutdown, ENGINE_STOP_S):
            logger.warning("the engine is inside a step after %s s; exiting without waiting for it", ENGINE_STOP_S)

    # -- endpoints ----------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        if not self.engine.is_alive:
            raise EngineClosedError("the engine is not running")
        running = self.engine.step_seconds()
        if running > self.config.stall_timeout_s:
            return JSONResponse({"status": "stalled", "step_seconds": round(running, 1)}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(self, request: Request) -> Response:
        if request.query_params.get("format") == "json":
            return JSONResponse(self.engine.stats())
        return Response(self.request_metrics.render(), media_type=CONTENT_TYPE)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": __version__})

    async def tokenize(self, request: Request) -> Response:
        body = await read_json(request, self.config.max_body_bytes)
        check_model(body, self.config.served_model_name)
        return JSONResponse(tokenize(body, self.engine.engine.tokenizer, self.engine.engine.max_model_len))

    async def detokenize(self, request: Request) -> Response:
        body = await read_json(request, self.config.max_body_bytes)
        check_model(body, self.config.served_model_name)
        return JSONResponse(detokenize(body, self.engine.engine.tokenizer))

    async def models(self, request: Request) -> Response:
        model = {"id": self.config.served_model_name, "object": "model", "created": self.created,
                 "owned_by": "tinyvllm", "max_model_len": self.engine.engine.max_model_len}  # fmt: skip
        return JSONResponse({"object": "list", "data": [model]})

    async def completions(self, request: Request) -> Response:
        body = await read_json(request, self.config.max_body_bytes)
        check_model(body, self.config.served_model_name)
        engine = self.engine.engine
        limit = self.config.max_tokens_limit
        generations = [
            parse_completion({**body, "prompt": prompt}, self.defaults, limit, engine.tokenizer, engine.max_model_len)
            for prompt in completion_prompts(body)
        ]
        return await self._generate(request, CompletionsAPI, generations)

    async def chat_completions(self, request: Request) -> Response:
        body = await read_json(request, self.config.max_body_bytes)
        check_model(body, self.config.served_model_name)
        engine = self.engine.engine
        limit = self.config.max_tokens_limit
        generation = parse_chat(body, self.defaults, limit, engine.tokenizer, engine.max_model_len)
        return await self._generate(request, ChatAPI, [generation])

    async def _generate(self, request: Request, api: API, generations: list[GenerationRequest]) -> Response:
        """Run the request's prompts (a completions batch has several; each is an engine request
        of its own) and answer: a stream when asked, else one JSON response; choices go prompt by
        prompt (prompt i's choice j is index i * n + j, vLLM's order)."""
        request_id = f"{api.id_prefix}-{uuid.uuid4().hex}"
        streams = []
        try:
            for number, generation in enumerate(generations):
                engine_id = request_id if len(generations) == 1 else f"{request_id}-{number}"
                streams.append(await self.engine.add_request(generation.prompt, generation.params, engine_id))
        except ValueError as error:
            for stream in streams:  # the batch's prompts queued before the bad one
                stream.abort()
            raise bad_request(error, generations[0].prompt_field) from None
        first = generations[0]
        head = response_head(api, request_id, self.config.served_model_name, chunk=first.stream)
        outputs = [self.request_metrics.track(stream, request.state.tinyvllm_record) for stream in streams]
        if first.stream:
            return EventStream(stream_events(api, head, list(zip(outputs, generations))), streams)
        try:
            finals = await _final_outputs(request, outputs)
        finally:
            for stream in streams:
                stream.abort()
        if finals is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        response = {**head, "choices": []}
        for number, (generation, output) in enumerate(zip(generations, finals)):
            part = {"choices": self._choices(api, generation, output, first_index=number * generation.params.n)}
            if generation.prompt_logprobs_field:  # where vLLM puts them: in each choice, or in the response
                api.add_prompt_logprobs(part, prompt_logprobs(output))
            response["choices"] += part.pop("choices")
            response.update(part)
        response["usage"] = usage(*finals)
        return JSONResponse(response)

    def _choices(self, api: API, generation: GenerationRequest, output: RequestOutput, first_index: int) -> list:
        top = generation.params.logprobs
        choices = []
        for completion in output.outputs:
            if generation.echo is not None:
                choice = echo_choice(generation, output, completion, self.engine.engine.tokenizer)
            else:
                logprobs = api.logprobs(completion, 0, top)
                choice = api.choice(completion.index, completion.text, completion.finish_reason, logprobs)
            choices.append({**choice, "index": first_index + completion.index})
        return choices


async def read_json(request: Request, limit: int) -> dict:
    """The body as a JSON object; 413 past `limit` bytes (read no further), 400 if not a JSON object."""
    too_large = OpenAIError(413, f"the request body is larger than this server's limit of {limit} bytes",
                            code="request_too_large")  # fmt: skip
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as error:  # RecursionError: absurdly deep nesting
        raise OpenAIError(400, f"the request body is not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise OpenAIError(400, f"the request body must be a JSON object, got {type(value).__name__}")
    return value


async def _final_outputs(request: Request, outputs: list[AsyncIterator[RequestOutput]]) -> list[RequestOutput] | None:
    """Each stream's finished output, or None when the client disconnects first."""
    collect = asyncio.ensure_future(asyncio.gather(*(_last_output(stream) for stream in outputs)))
    disconnect = asyncio.ensure_future(_until_disconnected(request))
    try:
        done, _ = await asyncio.wait((collect, disconnect), return_when=asyncio.FIRST_COMPLETED)
    finally:
        collect.cancel()  # a no-op on a finished task
        disconnect.cancel()
    return collect.result() if collect in done else None


async def _last_output(outputs: AsyncIterator[RequestOutput]) -> RequestOutput:
    async for output in outputs:
        last = output
    return last


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _error_response(request: Request, error: OpenAIError) -> Response:
    return JSONResponse(error.body(), status_code=error.status)


async def _http_error(request: Request, error: HTTPException) -> Response:
    message = f"{request.method} {request.url.path}: {error.detail}"
    return await _error_response(request, OpenAIError(error.status_code, message))


async def _engine_closed(request: Request, error: EngineClosedError) -> Response:
    return await _error_response(request, OpenAIError(503, str(error)))


def run_server(
    model: str | Path | None,
    engine_config: EngineConfig,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    served_model_name: str | None = None,
    max_tokens_limit: int | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    api_key: str | None = None,
    log_requests: bool = True,
    log_stats: bool = True,
    chat_template: str | None = None,
) -> None:
    """Load the model, then serve until interrupted (SIGTERM: see `tinyvllm.serving.shutdown`).
    max_tokens_limit defaults to max_model_len; chat_template (a file's path or Jinja text, as
    `load_chat_template` reads it) replaces the model's for every chat."""
    import uvicorn

    from tinyvllm.serving.shutdown import EngineFirstServer, exit_on_sigterm

    default_logging()

    template = None if chat_template is None else load_chat_template(chat_template)  # before the model loads
    engine = LLMEngine(model, engine_config=engine_config)
    if template is not None:
        engine.tokenizer.chat_template = template
    config = ServerConfig(
        served_model_name=served_model_name or engine.model_dir.name,
        max_tokens_limit=engine.max_model_len if max_tokens_limit is None else max_tokens_limit,
        max_body_bytes=max_body_bytes,
        api_key=api_key,
        log_requests=log_requests,
        stats_interval_s=STATS_INTERVAL_S if log_stats else None,
    )
    async_engine = AsyncEngine(engine)
    app = OpenAIServer(async_engine, config).app()
    settings = uvicorn.Config(
        app, host=host, port=port, access_log=False, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S
    )
    exit_on_sigterm()
    EngineFirstServer(settings, async_engine).run()
