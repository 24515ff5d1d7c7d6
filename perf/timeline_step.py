"""A decode graph's critical path, kernel by kernel: what each kernel adds to the step.

    python -m perf.timeline_step [--model llama-1b] [--contexts 128 384 1000] [--batch 1]

Under programmatic dependent launch (`tinyvllm/kernels/device/pdl.py`) a kernel starts while the
one ahead of it still runs, so its own duration overstates what it adds to the step, and
`perf/ablate_step.py` can only measure a kernel together with the boundary its removal
takes away. The decode graph is a chain, each kernel waiting for the one before it, so a
kernel adds the time from the previous kernel's end to its own end: its *exposed* time.
The exposed times add up to the graph's span.

The GPU's own start and end of every kernel come from CUPTI through torch's profiler
(torch measures here, as it is the peer in `bench_decode`; the engine never imports it).
For each context the engine decodes `batch` sequences of that context (distinct random
prompts), the graph of that batch's bucket is replayed REPLAYS times under the profiler, and
each kernel's exposed time is the median over the replays. Kernels are named by their Python
function, Numba's specialization tag and launch shape; the table sums each name over the step.
Results: perf/results/timeline_step.json.
"""

import argparse
import json
import re
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from perf.models import model_dir
from perf.profile_step import run_prefills
from perf.timing import result_header
from tinyvllm.backends.sampler_options import PLAIN_SAMPLER
from tinyvllm.config import EngineConfig
from tinyvllm.engine.block_manager import blocks_needed
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.sampling_params import SamplingParams

RESULTS = Path(__file__).resolve().parent / "results" / "timeline_step.json"
REPLAYS = 5
NEW_TOKENS = 64
"""Tokens each sequence may decode: the steps before the profile and the KV blocks they need."""


def kernel_label(event: dict) -> str:
    """'gemv_normalized[v87] 768x64' from a demangled Numba kernel name and its launch shape.

    The [vN] tag is Numba's for one specialization of a function: it tells apart GEMVs whose
    grids agree but whose epilogues differ (gate|up with SiLU, the LM head).
    """
    function = re.split(r"\[abi:|\(", event["name"])[0].split("::")[-1]
    version = re.search(r"\[abi:(v\d+)\]", event["name"])
    tag = f"[{version.group(1)}]" if version else ""
    grid = "x".join(str(n) for n in event["args"]["grid"] if n > 1) or "1"
    return f"{function}{tag} {grid}x{event['args']['block'][0]}"


def profiled_kernels(run: Callable[[], None]) -> list[dict]:
    """The GPU's kernel events, in start order, of what run() launches and waits for, read
    under torch's profiler (CUPTI)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.init()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        run()
    with tempfile.TemporaryDirectory() as scratch:
        trace = Path(scratch) / "trace.json"
        profiler.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    return sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])


def replay_kernels(engine: LLMEngine, bucket: int) -> list[list[dict]]:
    """The kernel events of REPLAYS replays of one bucket's decode graph, one list per replay."""
    backend, graphs = engine.runner.backend, engine.runner.graphs

    def replay() -> None:
        backend.launch_graph(graphs.graphs[bucket, PLAIN_SAMPLER, False])
        backend.synchronize()

    replays = []
    for _ in range(REPLAYS):
        backend.synchronize()
        replays.append(profiled_kernels(replay))
    return replays


def exposed_times(replays: list[list[dict]]) -> tuple[list[dict], float]:
    """Per kernel of the chain (label, median start, duration and exposed µs); the median span."""
    counts = {len(kernels) for kernels in replays}
    if len(counts) != 1:
        raise RuntimeError(f"replays profiled different kernel counts: {sorted(counts)}")
    chain = []
    for i, event in enumerate(replays[0]):
        starts, durations, exposed = [], [], []
        for kernels in replays:
            origin = kernels[0]["ts"]
            end = kernels[i]["ts"] + kernels[i]["dur"]
            before = kernels[i - 1]["ts"] + kernels[i - 1]["dur"] if i else origin
            starts.append(kernels[i]["ts"] - origin)
            durations.append(kernels[i]["dur"])
            exposed.append(end - before)
        chain.append(
            {
                "kernel": kernel_label(event),
                "start_us": statistics.median(starts),
                "duration_us": statistics.median(durations),
                "exposed_us": statistics.median(exposed),
            }
        )
    span = statistics.median(k[-1]["ts"] + k[-1]["dur"] - k[0]["ts"] for k in replays)
    return chain, span


def by_kernel(chain: list[dict]) -> list[dict]:
    totals, launches = defaultdict(float), defaultdict(int)
    for step in chain:
        totals[step["kernel"]] += step["exposed_us"]
        launches[step["kernel"]] += 1
    rows = [
        {
            "kernel": name,
            "launches": launches[name],
            "exposed_us": total,
            "exposed_us_per_launch": total / launches[name],
        }
        for name, total in totals.items()
    ]
    return sorted(rows, key=lambda row: -row["exposed_us"])


def profile_context(model: str, context: int, batch: int) -> dict:
    blocks_per_sequence = blocks_needed(context + NEW_TOKENS, EngineConfig().block_size)
    engine = LLMEngine(
        model_dir(model),
        max_model_len=2048,
        num_blocks=max(2000, batch * blocks_per_sequence + 64),  # a little room past the exact need
        max_num_seqs=batch,
        disable_cascade_attn=True,
    )
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(rng.integers(0, engine.config.vocab_size, context).tolist(), params, final_only=True)
    run_prefills(engine)
    for _ in range(4):
        engine.step()
    bucket = next(size for size in engine.runner.graphs.buckets if size >= batch)
    chain, span = exposed_times(replay_kernels(engine, bucket))
    return {"context": context, "batch": batch, "span_us": span, "kernels": by_kernel(chain), "chain": chain}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 384, 1000])
    parser.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    args = parser.parse_args()
    runs = [profile_context(args.model, context, args.batch) for context in args.contexts]
    for run in runs:
        span = f"graph span {run['span_us']:.1f} us, {len(run['chain'])} kernels"
        print(f"\nbatch {run['batch']}, context {run['context']}: {span}")
        print(f"{'kernel (grid x block)':<40} {'launches':>8} {'exposed us':>10} {'us/launch':>9} {'share':>6}")
        for row in run["kernels"]:
            print(
                f"{row['kernel']:<40} {row['launches']:>8} {row['exposed_us']:>10.1f} "
                f"{row['exposed_us_per_launch']:>9.2f} {row['exposed_us'] / run['span_us']:>6.1%}"
            )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result_header() | {"model": args.model, "runs": runs}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
