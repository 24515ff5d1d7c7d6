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
  to HBM as it evicts them (on the H200 that cost the memory-bound kernels about a third
  of their bandwidth, docs/performance.md).

Inputs are `random_bf16` arrays, filled on the GPU: never zeros, whose arithmetic can be
faster than real data's. `copy_tbps` times the device-to-device copy that every
memory-bound kernel is compared against.

`result_header()` is what each results JSON starts with: device, date, git revision and
the command that produced it, the fields of `tinyvllm.provenance.run_header`, which
`tinyvllm bench --output-json` writes too.
"""

import functools
import pstats
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numba import cuda

import tinyvllm.kernels  # noqa: F401  (its numpy shim must be in place before these kernels compile)
from tinyvllm.kernels.device.pdl import programmatic_launches
from tinyvllm.provenance import run_header

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


@cuda.jit
def _fill_random_bf16(flat, seed):
    """bf16 of magnitude 1/8 to 2 with random signs, from a hash of the index (splitmix64)."""
    for i in range(cuda.grid(1), flat.size, cuda.gridsize(1)):
        x = np.uint64(i) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(seed)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
        magnitude = np.uint64(0x3E00) + (x & np.uint64(0x1FF))
        sign = (x >> np.uint64(40)) & np.uint64(0x8000)
        flat[i] = np.uint16(magnitude | sign)


_seeds = iter(range(1, 1 << 30))


def random_bf16(*shape: int):
    """A device array of bf16 values of magnitude 1/8 to 2 with random signs, filled on the
    GPU (a benchmark never times zeros, and multi-GB inputs would take long on the host)."""
    array = cuda.device_array(shape, dtype=np.uint16)
    _fill_random_bf16[1024, THREADS](array.reshape(-1), next(_seeds) * 0x1234567)
    return array


def hold(stream, microseconds: int = HOLD_US) -> None:
    """Keep `stream` busy for a while, so that the work launched after it queues up behind."""
    _hold_kernel[1, 1, stream](microseconds)


def copy_tbps(num_elements: int, repeats: int) -> float:
    """The ceiling: a device-to-device copy of num_elements bf16, bytes read plus written over the time."""
    source, target = random_bf16(num_elements), random_bf16(num_elements)
    milliseconds = median_ms(lambda: target.copy_to_device(source), repeats=repeats)
    return 2 * source.nbytes / milliseconds / 1e9


@functools.cache
def _flush_buffers():
    """A zeroed buffer to read (zeroed so that `never` = 1 is never found) and a sink."""
    buffer = cuda.to_device(np.zeros(FLUSH_BYTES // 4, dtype=np.uint32))
    return buffer, cuda.device_array(1, dtype=np.uint32)


# --8<-- [start:median]
def _prepare(stream) -> None:
    buffer, sink = _flush_buffers()
    _flush_kernel[1024, THREADS, stream](buffer, np.uint32(1), sink)
    hold(stream)


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


def captured(cupy_stream, launches: Callable[[], None]) -> Callable[[], None]:
    """launches() captured on cupy_stream into one CUDA graph, its Numba kernels with PDL as in
    the engine's graphs (`kernels/device/pdl.py`); returns the graph's launch. Run launches once
    before: nothing may compile, and cuBLAS must have its stream, during a capture."""
    cupy_stream.begin_capture()
    with programmatic_launches():
        launches()
    graph = cupy_stream.end_capture()
    return lambda: graph.launch(stream=cupy_stream)


def result_header() -> dict:
    """`provenance.run_header` for this command, the device named by Numba's current device
    (which `perf.kernel_registers` stands in for an H200 it compiles for offline)."""
    device = cuda.get_current_device()
    name = device.name.decode() if isinstance(device.name, bytes) else str(device.name)
    return {**run_header("cuda", " ".join(sys.orig_argv)), "device": name}


def profile_rows(profiler, steps: int, top: int) -> list[dict]:
    """A cProfile run's `top` functions by time of their own, each per step of `steps`."""
    rows = sorted(pstats.Stats(profiler).stats.items(), key=lambda item: -item[1][2])[:top]
    return [
        {
            "function": f"{Path(file).name}:{line}({name})",
            "calls_per_step": calls / steps,
            "own_us_per_step": own * 1e6 / steps,
            "total_us_per_step": total * 1e6 / steps,
        }
        for (file, line, name), (_, calls, own, total, _) in rows
    ]
