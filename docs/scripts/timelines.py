"""The batching and preemption timelines of the docs: the real Scheduler over a fake model.

No GPU is needed: every request is queued at step 0, every sampled token is 0 and EOS is
ignored, and the figures show which request computed what (prefill chunk, decode, waiting)
in each engine step, and where a request was preempted. `make_figures.py` calls
`simulated_figures`; this module also holds the plotting helpers both share.
"""

import datetime
import sys
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout, installed or not

from tinyvllm.config import ResolvedEngineConfig  # noqa: E402
from tinyvllm.engine.block_manager import BlockAllocator  # noqa: E402
from tinyvllm.engine.scheduler import Scheduler  # noqa: E402
from tinyvllm.engine.sequence import Sequence, SequenceStatus  # noqa: E402
from tinyvllm.sampling_params import SamplingParams  # noqa: E402

COLORS = {"prefill": "#1f4e79", "decode": "#7fb3e0", "waiting": "#e3e3e3", "preempted": "#c0392b"}
DPI = 110


def save(figure, path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)
    plt.close(figure)
    print(f"wrote {path}")
    return path.name


@dataclass
class Trace:
    """What each request did in each step: "prefill", "decode" or "waiting"; and preemptions."""

    mode: str
    states: list[dict[int, str]] = field(default_factory=list)
    preempted: list[tuple[int, int]] = field(default_factory=list)  # (step, request)
    batch_sizes: list[int] = field(default_factory=list)
    max_num_seqs: int = 0


def simulate(mode: str, prompt_lens, output_lens, **config) -> Trace:
    """Run every request to completion (all queued at step 0) through the real Scheduler."""
    scheduler_config = ResolvedEngineConfig(mode=mode, **config)
    scheduler = Scheduler(scheduler_config, BlockAllocator(scheduler_config.num_blocks))
    seqs = []
    for index, (prompt_len, output_len) in enumerate(zip(prompt_lens, output_lens)):
        params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
        seqs.append(Sequence(str(index), [1] * prompt_len, params))
        scheduler.add(seqs[-1])
    trace = Trace(mode, max_num_seqs=scheduler_config.max_num_seqs)
    while True:
        running_before = list(scheduler.running)
        batch = scheduler.schedule()
        if batch is None:
            return trace
        step = len(trace.states)
        trace.preempted += [(step, int(s.request_id)) for s in running_before if s.status is SequenceStatus.WAITING]
        idle = list(scheduler.waiting) + scheduler.running  # those scheduled are overwritten below
        states = {int(s.request_id): "waiting" for s in idle}
        for position, seq in enumerate(batch.seqs):
            states[int(seq.request_id)] = "decode" if position < batch.num_decodes else "prefill"
        trace.states.append(states)
        trace.batch_sizes.append(len(batch.seqs))
        scheduler.launched(batch)
        scheduler.postprocess(batch, np.zeros(batch.num_samples, dtype=np.int64))


def draw_trace(timeline, occupancy, trace: Trace, num_requests: int) -> None:
    for step, states in enumerate(trace.states):
        for request, state in states.items():
            timeline.broken_barh([(step, 1)], (request - 0.4, 0.8), facecolors=COLORS[state], linewidth=0)
    for step, request in trace.preempted:
        timeline.plot(step + 0.5, request, marker="x", color=COLORS["preempted"], markersize=7, mew=2)
    timeline.set_yticks(range(num_requests))
    timeline.set_yticklabels([f"request {i}" for i in range(num_requests)], fontsize=7)
    timeline.invert_yaxis()
    timeline.set_title(f"{trace.mode} batching: {len(trace.states)} steps", fontsize=10, loc="left")
    occupancy.bar(np.arange(len(trace.batch_sizes)) + 0.5, trace.batch_sizes, width=1.0, color="#888888")
    occupancy.axhline(trace.max_num_seqs, color="black", linewidth=0.8, linestyle=":")
    occupancy.set_ylim(0, trace.max_num_seqs + 0.5)
    occupancy.set_yticks([0, trace.max_num_seqs])
    occupancy.set_ylabel("batch", fontsize=7)


def timeline_figure(traces: list[Trace], num_requests: int, title: str):
    steps = max(len(t.states) for t in traces)
    ratios = [4, 1] * len(traces)
    figure, axes = plt.subplots(2 * len(traces), 1, figsize=(9, 1.2 + 3.0 * len(traces)), sharex=True,
                                gridspec_kw={"height_ratios": ratios})  # fmt: skip
    for index, trace in enumerate(traces):
        draw_trace(axes[2 * index], axes[2 * index + 1], trace, num_requests)
    axes[-1].set_xlim(0, steps)
    axes[-1].set_xlabel("engine step (one forward pass each)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[s]) for s in ("prefill", "decode", "waiting")]
    labels = ["prefill (chunk)", "decode", "waiting"]
    if any(t.preempted for t in traces):
        handles.append(plt.Line2D([], [], marker="x", color=COLORS["preempted"], linestyle="", mew=2))
        labels.append("preempted (blocks freed)")
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    figure.suptitle(title, fontsize=9, x=0.01, ha="left")
    figure.tight_layout(rect=(0, 0.04, 1, 0.97))
    return figure


BATCHING_WORKLOAD = {
    "prompt_lens": [24, 8, 40, 16, 12, 32, 8, 20, 28, 16],
    "output_lens": [30, 6, 12, 24, 4, 18, 10, 26, 8, 14],
}
BATCHING_CONFIG = {"num_blocks": 256, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 48,
                   "max_model_len": 128}  # fmt: skip
PREEMPTION_CONFIG = {**BATCHING_CONFIG, "num_blocks": 24, "max_num_seqs": 6}


def simulated_figures(figures: Path) -> list[str]:
    today = datetime.date.today().isoformat()
    count = len(BATCHING_WORKLOAD["prompt_lens"])
    setup = (f"{count} requests queued at once, max_num_seqs {BATCHING_CONFIG['max_num_seqs']}, "
             f"max_num_batched_tokens {BATCHING_CONFIG['max_num_batched_tokens']}")  # fmt: skip
    traces = [simulate(mode, **BATCHING_WORKLOAD, **BATCHING_CONFIG) for mode in ("static", "continuous")]
    title = f"tinyvllm Scheduler simulated on the CPU (no GPU), {today}\n{setup}"
    written = [save(timeline_figure(traces, count, title), figures / "batching_timeline.png")]
    trace = simulate("continuous", **BATCHING_WORKLOAD, **PREEMPTION_CONFIG)
    blocks = PREEMPTION_CONFIG["num_blocks"] * PREEMPTION_CONFIG["block_size"]
    title = (f"tinyvllm Scheduler simulated on the CPU (no GPU), {today}\nthe same requests, continuous, "
             f"max_num_seqs {PREEMPTION_CONFIG['max_num_seqs']}, a KV arena of only {blocks} tokens")  # fmt: skip
    written.append(save(timeline_figure([trace], count, title), figures / "preemption_timeline.png"))
    return written
