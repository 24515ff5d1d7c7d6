"""How `tinyvllm serve` stops: SIGTERM (or Ctrl-C) ends the open requests at once, and after
SIGTERM the process exits with status 0.

uvicorn alone, on SIGTERM, waits up to its graceful timeout for the open responses, which a
long generation never ends, then cancels them (a traceback for each) and re-raises the
signal, so the process dies of it. `EngineFirstServer` stops the engine first instead: every
open request fails with EngineClosedError, so a plain one is answered 503 and a stream ends
with an error event and `[DONE]`, and the connections close within a step. After that
graceful shutdown, uvicorn re-raises SIGTERM into the handler that was set before it ran:
`exit_on_sigterm` turns it into exit status 0.
"""

import signal
import socket
from types import FrameType

import uvicorn

from tinyvllm.engine.async_engine import AsyncEngine


class EngineFirstServer(uvicorn.Server):
    """uvicorn's server, telling the engine to stop before it waits for the open connections."""

    def __init__(self, config: uvicorn.Config, engine: AsyncEngine) -> None:
        super().__init__(config)
        self.engine = engine

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Do not wait here: the lifespan's shutdown waits for the engine thread, after the connections.
        self.engine.shutdown(timeout=0)
        await super().shutdown(sockets)


def exit_on_sigterm() -> None:
    """From now on, SIGTERM exits with status 0 (uvicorn replaces this handler while it serves)."""

    def exit_cleanly(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, exit_cleanly)
