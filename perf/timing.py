"""Timing GPU work from Python, and the header every perf result carries.

`median_ms(call)` times `call()` with CUDA events and returns the median over many runs,
after warm-up runs that also compile the kernels. Two things stand in the way of an
honest number, and each timed run deals with both before its start event:

- A Numba launch costs 20 to 60 microseconds of Python, more than many kernels take.
  Events recorded around one launch on an idle GPU would time the launch overhead. So a
  hold kernel first sleeps on the GPU for HOLD_US; the start event, the call's kernels
  and the end event queue up behind it and run back to back once it finishes.
- The H200's 60 MB L2 would serve small inputs from cache on every run after the first,
  where the model reads them from HBM. So a flush kernel first writes a buffer several
  times the L2's size, which evicts the inputs (the same effect as rotating copies of
  them, for inputs of any size).

`result_header()` is what each results JSON starts with: device, date, git revision and
the command that produced it. Outside a git checkout (the device machine gets a copy of
the work tree) the revision comes from the GIT_REV environment variable.
"""

import datetime
import functools
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numba import cuda

import tinyvllm.kernels  # noqa: F401  (its numpy shim must be in place before these kernels compile)

FLUSH_BYTES = 256 << 20
HOLD_US = 300
THREADS = 256


@cuda.jit
def _flush_kernel(buffer, value):
    for i in range(cuda.grid(1), buffer.size, cuda.gridsize(1)):
        buffer[i] = value


@cuda.jit
def _hold_kernel(microseconds):
    for _ in range(microseconds):
        cuda.nanosleep(1000)


@functools.cache
def _flush_buffer():
    return cuda.device_array(FLUSH_BYTES // 4, dtype=np.uint32)


# --8<-- [start:median]
def _prepare(run: int, stream) -> None:
    buffer = _flush_buffer()
    _flush_kernel[1024, THREADS, stream](buffer, np.uint32(run))
    _hold_kernel[1, 1, stream](HOLD_US)


def median_ms(call: Callable[[], None], *, warmup: int = 5, repeats: int = 50, stream=0) -> float:
    """Median milliseconds of `call()` (which launches on `stream`), each run with a cold L2."""
    for _ in range(warmup):
        call()
    events = []
    for run in range(repeats):
        _prepare(run, stream)
        start, end = cuda.event(), cuda.event()
        start.record(stream)
        call()
        end.record(stream)
        events.append((start, end))
    cuda.synchronize()
    return statistics.median(cuda.event_elapsed_time(start, end) for start, end in events)
# --8<-- [end:median]


def _git_revision() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        status = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True)
    except FileNotFoundError:
        return os.environ.get("GIT_REV", "unknown")
    if head.returncode != 0:
        return os.environ.get("GIT_REV", "unknown")
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def result_header() -> dict:
    """device, date (UTC), git revision and command, for the top of a results JSON."""
    device = cuda.get_current_device()
    name = device.name.decode() if isinstance(device.name, bytes) else str(device.name)
    return {
        "device": name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_rev": _git_revision(),
        "command": " ".join(sys.orig_argv),
    }
