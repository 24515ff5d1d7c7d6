"""CUDA graphs for the decode step: one capture per batch-size bucket, replayed each step.

A decode step launches several kernels for each layer of the model. From Python each Numba
launch costs 18 to 57 microseconds; replaying a captured graph costs about 0.9 per
kernel. So the runner captures the whole decode step (forward and sampling) once for
each bucket of batch sizes, and a step of B sequences replays the smallest bucket that
holds B, the extra rows padded with harmless work.

What makes a replay correct is that every input the kernels read lives in the runner's
persistent buffers (token ids, positions, slot mapping, block tables, context lengths,
sampling parameters), which are overwritten before each replay, and that every shape-
dependent choice (grid sizes, split-K partitions, which GEMM) depends only on the
bucket. Padding rows write no KV (slot -1), attend to one token of block 0 and sample
greedily; their outputs are never read. The captures allocate nothing: every buffer is
the runner's, so all graphs share the same memory. With `enforce_eager` the runner still pads
a decode step to its bucket and launches it kernel by kernel, so that eager and replayed
steps make the same choices: a split-K cut into four parts for 37 sequences and three for
the 48 of their bucket rounds differently, and sampled tokens part.

A graph is also keyed by the step's sampler options (`sampler_options.SamplerOptions`) and by
whether its decode attention reads a shared prefix once (cascade attention, whose length
the graph reads from the step's buffers): the plain sampler's graphs without cascade are
captured up front; the first decode step of a bucket that needs the penalty or min-p
kernels, or cascade attention, runs eagerly and is then captured, for the steps after it.
"""

import numpy as np

from tinyvllm.backends.sampler_options import PLAIN_SAMPLER, SamplerOptions
from tinyvllm.engine.step_inputs import HostStep, StepBuffers, empty_step
from tinyvllm.model.step_fields import STEP_FIELDS, Pad

SMALL_BUCKETS = (1, 2, 4, 8)
BUCKET_STEP = 16


def graph_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to max_num_seqs (capped at 256)."""
    top = min(max_num_seqs, 256)
    buckets = [b for b in SMALL_BUCKETS if b <= top]
    buckets += list(range(BUCKET_STEP, top + 1, BUCKET_STEP))
    if buckets[-1] != top:
        buckets.append(top)
    return buckets


# Read once per padded step: module globals, not enum attributes.
_PADS = tuple((field.name, field.pad) for field in STEP_FIELDS)
_KEEP, _ROW_INDEX = Pad.KEEP, Pad.ROW_INDEX


def pad_decode_step(step: HostStep, size: int) -> HostStep:
    """The decode step padded with `size - B` rows that are safe to compute and ignore:
    each field's rows past B hold its `STEP_FIELDS` pad value."""
    padded = []
    for name, pad in _PADS:
        array = getattr(step, name)
        if pad is _KEEP:
            padded.append(array)
        elif pad is _ROW_INDEX:
            padded.append(np.arange(size, dtype=array.dtype))
        else:
            rows = np.full((size, *array.shape[1:]), pad, dtype=array.dtype)
            rows[: array.shape[0]] = array
            padded.append(rows)
    return HostStep(*padded, size)


# --8<-- [start:graphs]
class DecodeGraphs:
    """The captured decode steps of one runner, keyed by bucket size.

    The runner is passed to each call rather than kept: the runner holds this object, and
    a reference back would make a cycle that keeps a dropped engine's GPU memory alive
    until the garbage collector happens to run.
    """

    def __init__(self, buckets: list[int]):
        self.buckets = buckets
        self.graphs = {}

    def capture(self, runner) -> None:
        """Capture every bucket with the plain sampler, largest first, each from a step of
        padding rows only."""
        template = empty_step(runner.limits.max_blocks_per_seq)
        for size in reversed(self.buckets):
            inputs = runner.buffers.upload(pad_decode_step(template, size))
            runner.forward_and_sample(inputs)
            self.graphs[size, PLAIN_SAMPLER, False] = self._capture(runner, inputs, PLAIN_SAMPLER)

    def replay(self, runner, padded: HostStep, options: SamplerOptions) -> None:
        """Launch a decode step padded to one of the buckets (`pad_decode_step`): its sampled
        tokens go to the leading rows of the runner's `buffers.sampled`."""
        buffers: StepBuffers = runner.buffers
        buffers.stage(padded)
        key = padded.token_ids.shape[0], options, bool(padded.shared_prefix_len[0])
        graph = self.graphs.get(key)
        if graph is None:
            inputs = buffers.views(padded)
            runner.forward_and_sample(inputs, options)
            self.graphs[key] = self._capture(runner, inputs, options)
        else:
            runner.backend.launch_graph(graph)

    @staticmethod
    def _capture(runner, inputs, options: SamplerOptions):
        """The graph of one step on `inputs` (after the step ran once, so its kernels are compiled)."""
        runner.backend.synchronize()
        runner.backend.begin_capture()
        runner.forward_and_sample(inputs, options)
        return runner.backend.end_capture()


# --8<-- [end:graphs]
