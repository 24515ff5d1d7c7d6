"""Start `tinyvllm serve` from Python on a free port, wait until it answers, and stop it.

The other server examples take `running_server` from here, so that each still runs alone.
Run alone, this one serves the embedded SmolLM2 and asks the server what it serves.

Run it from the repository root: python docs/examples/serve_in_background.py
"""

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx


# --8<-- [start:server]
@contextlib.contextmanager
def running_server(*flags: str, timeout: float = 50) -> Iterator[str]:
    """`tinyvllm serve` with these flags, on a free port, run by this Python (its log goes to
    stderr); yields its URL once /health answers, and stops it on leaving."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-c", "from tinyvllm.cli import main; main()", "serve", "--port", str(port), *flags]
    server = subprocess.Popen(command, stdout=sys.stderr)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while server.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass  # not listening yet
            time.sleep(0.2)
        assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
        yield url
    finally:
        server.terminate()  # it answers SIGTERM by shutting down and exiting with status 0
        assert server.wait(timeout=15) == 0


# --8<-- [end:server]

if __name__ == "__main__":
    with running_server() as url:
        models = httpx.get(f"{url}/v1/models").json()["data"]
        print(f"{url} serves {[model['id'] for model in models]}")
        assert models
