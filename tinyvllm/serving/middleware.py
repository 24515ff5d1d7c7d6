"""The server's API key check, its access log and its periodic stats log, as vLLM has them.

`ServingMiddleware` wraps the Starlette app: with an API key set, every `/v1/*` request needs
`Authorization: Bearer <key>` (401 in OpenAI's error shape otherwise; /health and /metrics stay
open, as in vLLM), and each request is logged once its response has been sent, with its method,
path, status, duration and, for a generation, its prompt and generated token counts.
`log_stats_forever` logs vLLM's periodic line: prompt and generation throughput since the last
line, running and waiting requests, KV-cache usage. Both log to the `tinyvllm.serving` logger.
"""

import asyncio
import hmac
import json
import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tinyvllm.engine.async_engine import AsyncEngine
from tinyvllm.serving.errors import OpenAIError
from tinyvllm.serving.metrics import RequestRecord, ServerMetrics, kv_cache_usage

logger = logging.getLogger("tinyvllm.serving")
RECORD_KEY = "tinyvllm_record"  # the RequestRecord's key in the request's state


class ServingMiddleware:
    """API key check and access log around `app` (a plain ASGI middleware, so that streamed
    responses are logged when they end, not when they start, and with their token counts)."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, log_requests: bool) -> None:
        self.app = app
        self.api_key = api_key
        self.log_requests = log_requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord()
        scope.setdefault("state", {})[RECORD_KEY] = record
        status = 500  # what the log says if the app fails before answering

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if self.api_key is not None and scope["path"].startswith("/v1/") and not self._authorized(scope):
                await _unauthorized(send_status)
            else:
                await self.app(scope, receive, send_status)
        finally:  # a streamed response has been sent in full (or its client left) by now
            self._log(scope, status, record)

    def _authorized(self, scope: Scope) -> bool:
        headers = dict(scope["headers"])
        given = headers.get(b"authorization", b"")
        return hmac.compare_digest(given, b"Bearer " + self.api_key.encode())

    def _log(self, scope: Scope, status: int, record: RequestRecord) -> None:
        if not self.log_requests:
            return
        duration_ms = (time.perf_counter() - record.start) * 1000
        tokens = ""
        if record.prompt_tokens is not None:
            tokens = f" prompt_tokens={record.prompt_tokens} generation_tokens={record.generation_tokens}"
        logger.info("%s %s %d %.1f ms%s", scope["method"], scope["path"], status, duration_ms, tokens)


async def _unauthorized(send: Send) -> None:
    body = json.dumps(OpenAIError(401, "invalid or missing API key", code="invalid_api_key").body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def default_logging() -> None:
    """Print the `tinyvllm.serving` logger's INFO lines to stderr, unless it has a handler already."""
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


async def log_stats_forever(engine: AsyncEngine, metrics: ServerMetrics, interval_s: float | None) -> None:
    """Every `interval_s`, log throughput since the last line and the scheduler's state (until
    cancelled); None logs nothing."""
    if interval_s is None:
        return
    last = (time.perf_counter(), metrics.prompt_tokens, metrics.generation_tokens)
    while True:
        await asyncio.sleep(interval_s)
        now = (time.perf_counter(), metrics.prompt_tokens, metrics.generation_tokens)
        elapsed = now[0] - last[0]
        stats = engine.stats()
        logger.info(
            "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
            "Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, Preemptions: %d",
            (now[1] - last[1]) / elapsed, (now[2] - last[2]) / elapsed,
            stats["num_requests_running"], stats["num_requests_waiting"], 100 * kv_cache_usage(stats),
            stats["num_preemptions"],
        )  # fmt: skip
        last = now
