"""A benchmark's engine in a child process of its own, its results back as JSON.

Benchmarks that compare engines (`bench_peers`: vLLM and tinyvllm; `bench_prefix`: the cache on
and off) build each in a fresh process, so that none holds the GPU's memory or inherits another's
process state. The child writes its results to a file the parent names, in a scratch directory.
"""

import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path


def child_json(
    command: Callable[[Path], list[str]], env: dict | None = None
) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Run command(out) and return it finished (stderr captured) with the JSON it wrote to
    out, or None if it wrote none or failed."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "result.json"
        done = subprocess.run(command(out), env=env, stderr=subprocess.PIPE, text=True)
        result = json.loads(out.read_text()) if done.returncode == 0 and out.exists() else None
    return done, result
