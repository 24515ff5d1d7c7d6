"""The quickstart's `openai` client against `tinyvllm serve`: a streamed chat reply, greedy.
The file starts the server itself, on a free port, and stops it at the end, so it runs alone.

Run it from the repository root: python docs/examples/openai_client.py
"""

import socket
import subprocess
import sys
import time

import httpx
from openai import OpenAI

# Start `tinyvllm serve --port PORT` with this Python (its log goes to stderr); wait for /health.
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
command = [sys.executable, "-c", "from tinyvllm.cli import main; main()", "serve", "--port", str(port)]
server = subprocess.Popen(command, stdout=sys.stderr)
try:
    deadline = time.monotonic() + 50
    while server.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                break
        except httpx.TransportError:
            pass  # not listening yet
        time.sleep(0.2)
    assert server.poll() is None and time.monotonic() < deadline, "the server did not start"

    # --8<-- [start:client]
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",  # the model directory's name, or --served-model-name
        messages=[{"role": "user", "content": "Write a haiku about the sea."}],
        max_tokens=24,
        temperature=0,
        stream=True,
    )
    for chunk in stream:
        print(chunk.choices[0].delta.content or "", end="", flush=True)
    # --8<-- [end:client]
    print()
    assert chunk.choices[0].finish_reason in ("stop", "length")  # the last chunk says why the reply ended
finally:
    # Stop the server: it answers SIGTERM by shutting down and exiting with status 0.
    server.terminate()
    assert server.wait(timeout=15) == 0
