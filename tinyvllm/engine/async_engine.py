"""AsyncEngine: the LLMEngine driven by one background thread, for asyncio servers.

LLMEngine is not thread-safe, so one thread owns it: every add_request, abort and step
happens there. Coroutines talk to that thread through a thread-safe command queue, and
the thread answers each request on the request's own asyncio queue, through the request's
event loop (`call_soon_threadsafe`, once per step and loop, not once per token).

    stream = await engine.add_request(prompt, params, request_id)  # ValueError: refused
    try:
        async for output in stream: ...          # cumulative RequestOutputs, last one finished
    finally:
        stream.abort()                           # no-op once finished; frees the KV blocks

When no request is unfinished the thread blocks on the command queue: an idle server
costs nothing. Outputs are cumulative (whole text so far), so a consumer that falls behind
skips to the newest one and loses nothing. `stats()` is a snapshot the thread publishes
before it sends anything, so a client that has its answer finds it counted there.

A request is checked before it is queued (`LLMEngine.check_request`, in the caller's
thread: tokenizing, the vocabulary, the context and the KV cache's size), so a bad one is
refused at once even while a long step runs; only what depends on the engine's state (a
request id in use) is left to the engine thread. Each stream records, for each completion,
when the steps that gave it tokens ended (`token_times`), which the server's latency metrics
read: exact even for a consumer that skipped outputs.

If a step raises, the thread fails every open request with EngineClosedError, re-raises
(the traceback goes to stderr) and refuses requests from then on, as does `shutdown()`.
`step_seconds()` says how long the step in progress has run, so that a health check can
tell a stalled engine from a busy one; `shutdown(timeout)` gives up waiting for a step
that will not end (the thread is a daemon: it ends with the process).
"""

import asyncio
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

from tinyvllm.engine.llm_engine import LLMEngine, Prompt
from tinyvllm.engine.sequence import RequestOutput
from tinyvllm.sampling_params import SamplingParams

_ACCEPTED = object()  # the first item on a stream's queue when add_request succeeded


@dataclass
class _Output:
    output: RequestOutput
    time: float  # time.perf_counter() when the step that made it ended


class EngineClosedError(RuntimeError):
    """The engine thread has stopped (shut down or failed); no request can be served."""


@dataclass
class _Add:
    prompt: Prompt
    params: SamplingParams
    stream: "RequestStream"


@dataclass
class _Abort:
    request_id: str


_STOP = object()


class RequestStream:
    """One request's outputs, as an async iterator ending with the finished output."""

    def __init__(self, request_id: str, engine: "AsyncEngine") -> None:
        self.request_id = request_id
        self.loop = asyncio.get_running_loop()
        self.finished = False
        self._engine = engine
        self.items: asyncio.Queue = asyncio.Queue()
        self.token_times: list[list[float]] = []  # by completion: when each step that gave it a token ended

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = self._note(await self.items.get())
        while not self.items.empty():  # outputs are cumulative: the newest one says it all
            item = self._note(self.items.get_nowait())
        if isinstance(item, Exception):
            self.finished = True
            raise item
        self.finished = item.output.finished
        return item.output

    def _note(self, item: object) -> object:
        """Record the step time of each completion that this output (one step's) gave a token; return the item."""
        if isinstance(item, _Output):
            completions = item.output.outputs
            self.token_times = self.token_times or [[] for _ in completions]
            for completion, times in zip(completions, self.token_times):
                if len(completion.token_ids) > len(times):
                    times.append(item.time)
        return item

    def abort(self) -> None:
        """Stop the request and free its blocks, unless it has finished already."""
        if not self.finished:
            self.finished = True
            self._engine.abort(self.request_id)


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}  # the engine thread's own, as is the outbox
        self._outbox: dict[asyncio.AbstractEventLoop, list] = defaultdict(list)
        self._lock = threading.Lock()  # orders "closed" against putting a command
        self._closed: EngineClosedError | None = None
        self._thread = threading.Thread(target=self._run, name="tinyvllm-engine", daemon=True)
        self._counters = {"num_requests_served": 0, "num_requests_aborted": 0, "num_requests_rejected": 0}
        self._refused_before_queueing = 0  # under _lock: callers' threads count these
        self._step_began: float | None = None  # time.monotonic() when the step in progress began
        self._stats = self._snapshot()

    # -- any thread ---------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float | None = None) -> bool:
        """Fail the open requests with EngineClosedError and stop the thread; False if the
        thread is still inside a step after `timeout` seconds (it stops when the step ends)."""
        with self._lock:
            if self._closed is None:
                self._commands.put(_STOP)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def step_seconds(self) -> float:
        """How long the step in progress has run (0.0 between steps)."""
        began = self._step_began
        return 0.0 if began is None else time.monotonic() - began

    @property
    def is_alive(self) -> bool:
        return self._closed is None and self._thread.is_alive()

    def stats(self) -> dict:
        """Scheduler state and request counters, as of the engine thread's last iteration (and
        the requests refused before they were queued, as of now)."""
        stats = dict(self._stats)
        with self._lock:
            stats["num_requests_rejected"] += self._refused_before_queueing
        return stats

    async def add_request(self, prompt: Prompt, params: SamplingParams, request_id: str) -> RequestStream:
        """Queue a request; returns its stream once the engine has accepted it. Raises the
        engine's ValueError for a bad request (without waiting for the engine thread, when the
        request alone is at fault) and EngineClosedError once the engine stopped."""
        try:
            self.engine.check_request(prompt, params)
        except ValueError:
            with self._lock:
                self._refused_before_queueing += 1
            raise
        stream = RequestStream(request_id, self)
        self._put(_Add(prompt, params, stream))
        try:
            first = await stream.items.get()
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        if isinstance(first, Exception):
            stream.finished = True
            raise first
        return stream

    def abort(self, request_id: str) -> None:
        """Abort a request (a no-op when it has finished); safe from any thread."""
        with self._lock:
            if self._closed is None:
                self._commands.put(_Abort(request_id))

    def _put(self, command) -> None:
        with self._lock:
            if self._closed is not None:
                raise self._closed
            self._commands.put(command)

    # -- the engine thread --------------------------------------------------------------
    # --8<-- [start:run]
    def _run(self) -> None:
        stopped = False
        try:
            while self._take_commands(block=not self.engine.has_unfinished_requests()):
                self._send()  # acceptances and refusals go out before the step
                if self.engine.has_unfinished_requests():
                    self._step_began = time.monotonic()
                    outputs = self.engine.step()
                    self._step_began = None
                    self._route(outputs)
                    self._send()
            stopped = True
        finally:  # however the thread ends, no request may wait for it forever
            failed = "the engine failed (its traceback is in the server log)"
            self._close(EngineClosedError("the server is shutting down" if stopped else failed))

    def _take_commands(self, block: bool) -> bool:
        """Apply queued commands (waiting for one if `block`); False on the stop command."""
        try:
            command = self._commands.get(block=block)
        except queue.Empty:
            return True
        while True:
            if command is _STOP:
                return False
            if isinstance(command, _Add):
                self._add(command)
            elif self._streams.pop(command.request_id, None) is not None:
                self.engine.abort(command.request_id)
                self._counters["num_requests_aborted"] += 1
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    # --8<-- [end:run]

    def _add(self, command: _Add) -> None:
        stream = command.stream
        if stream.request_id in self._streams:
            self._reject(stream, ValueError(f"request id {stream.request_id!r} is already in use"))
            return
        self._streams[stream.request_id] = stream  # from here on, a failing engine still answers it
        try:
            self.engine.add_request(command.prompt, command.params, stream.request_id)
        except ValueError as error:
            del self._streams[stream.request_id]
            self._reject(stream, error)
            return
        self._post(stream, _ACCEPTED)

    def _reject(self, stream: RequestStream, error: ValueError) -> None:
        self._counters["num_requests_rejected"] += 1
        self._post(stream, error)

    def _route(self, outputs: list[RequestOutput]) -> None:
        now = time.perf_counter()
        for output in outputs:
            stream = self._streams[output.request_id]
            if output.finished:
                del self._streams[output.request_id]
                self._counters["num_requests_served"] += 1
            self._post(stream, _Output(output, now))

    def _post(self, stream: RequestStream, item: object) -> None:
        """Queue an _Output, an exception or _ACCEPTED for `stream`; `_send` delivers it."""
        self._outbox[stream.loop].append((stream.items, item))

    def _send(self) -> None:
        """Publish the stats, then deliver the outbox: one wake-up per event loop, and whoever
        reads an item (a finished output, a refusal) finds it counted in the stats already."""
        self._stats = self._snapshot()
        for loop, items in self._outbox.items():
            _call_soon(loop, _put_all, items)
        self._outbox.clear()

    def _close(self, error: EngineClosedError) -> None:
        with self._lock:
            self._closed = error
        for stream in self._streams.values():
            self._post(stream, error)
        self._streams.clear()
        while not self._commands.empty():
            command = self._commands.get_nowait()
            if isinstance(command, _Add):
                self._post(command.stream, error)
        self._send()

    def _snapshot(self) -> dict:
        scheduler = self.engine.scheduler
        return {
            "num_requests_running": scheduler.num_running,
            "num_requests_waiting": scheduler.num_waiting,
            "num_free_blocks": scheduler.num_free_blocks,
            "num_total_blocks": scheduler.allocator.num_blocks,
            "num_preemptions": scheduler.num_preemptions,
            "prefix_cache_queries": scheduler.prefix_cache_queries,
            "prefix_cache_hits": scheduler.prefix_cache_hits,
            **self._counters,
        }


def _put_all(items: list) -> None:
    for request_queue, item in items:
        request_queue.put_nowait(item)


def _call_soon(loop: asyncio.AbstractEventLoop, callback, *args) -> None:
    """loop.call_soon_threadsafe, skipping a loop that has closed: nobody is left to read."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        if not loop.is_closed():
            raise
