"""Timing GPU work from Python, and the header every perf result carries.

`median_ms(call)` times `call()` with CUDA events and returns the median over many runs,
after warm-up runs that also compile the kernels. Two things stand in the way of an
honest number, and each timed run deals with both before its start event:

- A Numba launch costs 20 to 60 microseconds of Python, more than many kernels take.
  Events recorded around one launch on an idle GPU would time the launch overhead. So a
  hold kernel first sleeps on the GPU for HOLD_US; the start event, the call's kernels
  and the end event queue up behind it and run back to back once it finishes.
- The H200's 60 MB L2 would serve small inputs from cache on every run after the first,
  where the model reads them from HBM. So a flush kernel first reads a buffer several
  times the L2's size, which evicts the inputs (the same effect as rotating copies of
  them, for inputs of any size). It reads rather than writes: a written buffer would
  leave the L2 full of dirty lines, and the timed kernel would pay for writing them back
  to HBM as it evicts them (about one byte written per byte read, which halves the
  bandwidth a streaming kernel sees).

`result_header()` is what each results JSON starts with: device, date, git revision and
the command that produced it. The revision is GIT_REV when that is set (the device
machine gets a copy of the work tree, whose .git may be stale), else git's.
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
def _flush_kernel(buffer, never, sink):
    """Reads every word of buffer; writes sink only if one equals `never`, which none does."""
    found = np.uint32(0)
    for i in range(cuda.grid(1), buffer.size, cuda.gridsize(1)):
        found |= np.uint32(buffer[i] == never)
    if found:
        sink[0] = never


@cuda.jit
def _hold_kernel(microseconds):
    for _ in range(microseconds):
        cuda.nanosleep(1000)


@functools.cache
def _flush_buffers():
    """A zeroed buffer to read (zeroed so that `never` = 1 is never found) and a sink."""
    buffer = cuda.to_device(np.zeros(FLUSH_BYTES // 4, dtype=np.uint32))
    return buffer, cuda.device_array(1, dtype=np.uint32)


# --8<-- [start:median]
def _prepare(stream) -> None:
    buffer, sink = _flush_buffers()
    _flush_kernel[1024, THREADS, stream](buffer, np.uint32(1), sink)
    _hold_kernel[1, 1, stream](HOLD_US)


def median_ms(call: Callable[[], None], *, warmup: int = 5, repeats: int = 50, stream=0) -> float:
    """Median milliseconds of `call()` (which launches on `stream`), each run with a cold L2."""
    for _ in range(warmup):
        call()
    events = []
    for _ in range(repeats):
        _prepare(stream)
        start, end = cuda.event(), cuda.event()
        start.record(stream)
        call()
        end.record(stream)
        events.append((start, end))
    cuda.synchronize()
    return statistics.median(cuda.event_elapsed_time(start, end) for start, end in events)
# --8<-- [end:median]


def _git_revision() -> str:
    """GIT_REV when set (the device machine's copy of the tree may carry a stale .git), else git's."""
    if os.environ.get("GIT_REV"):
        return os.environ["GIT_REV"]
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        status = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True)
    except FileNotFoundError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
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
