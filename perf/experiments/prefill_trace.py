"""Where a prefill run's GPU time goes, kernel by kernel, and where the GPU waits between kernels.

    python -m perf.experiments.prefill_trace [--model llama-1b] [--prompts 64] [--prompt-len 1024]

`perf/profile_prefill.py` times each operator alone behind a hold kernel, and each step's span
on the GPU, and the operators of a step can add up to less than its span with no idle time
between steps (`perf/LOG.md`, 2026-12-07). This script tells idle time inside a step from
kernels that run longer there than alone: it runs the same all-prompts prefill (after a warm-up
of the same shapes) under torch's profiler (CUPTI, as `perf/timeline_step.py` does; the engine
never imports torch) and reads every kernel's start and end on the GPU. It reports the kernels'
summed durations by name, the run's span, the time no kernel ran (the gaps between one kernel's
end and the next one's start) and the largest gaps with the kernels on either side. Profiling
slows the host's launches; a gap behind a slow launch shows here that would not without the
profiler, so the gaps are an upper bound.
Results: perf/results/experiments/prefill_trace.json.
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from perf.models import model_dir
from perf.timeline_step import kernel_label, profiled_kernels
from perf.timing import result_header
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.sampling_params import SamplingParams

RESULTS = Path(__file__).resolve().parents[1] / "results" / "experiments" / "prefill_trace.json"
TOP_GAPS = 15


def traced_kernels(engine: LLMEngine, prompts: list[list[int]]) -> list[dict]:
    """The GPU's kernel events, in start order, of running `prompts` to one token each."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(prompt, params, final_only=True)

    def drain() -> None:
        while engine.has_unfinished_requests():
            engine.step()
        engine.runner.backend.synchronize()

    engine.runner.backend.synchronize()
    return profiled_kernels(drain)


def summarize(kernels: list[dict]) -> dict:
    """Durations by kernel label, the span, the idle time and the largest gaps (µs)."""
    durations, launches = defaultdict(float), defaultdict(int)
    gaps, busy_until = [], kernels[0]["ts"]
    previous = kernels[0]
    for event in kernels:
        label = kernel_label(event)
        durations[label] += event["dur"]
        launches[label] += 1
        if event["ts"] > busy_until:
            gaps.append({"gap_us": event["ts"] - busy_until, "after": kernel_label(previous), "before": label})
        if event["ts"] + event["dur"] >= busy_until:
            busy_until, previous = event["ts"] + event["dur"], event
    span = busy_until - kernels[0]["ts"]
    rows = sorted(
        ({"kernel": k, "launches": launches[k], "us": us} for k, us in durations.items()), key=lambda row: -row["us"]
    )
    idle = sum(gap["gap_us"] for gap in gaps)
    return {"span_us": span, "idle_us": idle, "gaps": len(gaps), "kernels": rows,
            "largest_gaps": sorted(gaps, key=lambda gap: -gap["gap_us"])[:TOP_GAPS]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=1024)
    args = parser.parse_args()

    engine = LLMEngine(model_dir(args.model))
    rng = np.random.default_rng(0)

    def prompts() -> list[list[int]]:
        return [rng.integers(0, engine.config.vocab_size, args.prompt_len).tolist() for _ in range(args.prompts)]

    traced_kernels(engine, prompts())  # the warm-up: every step shape compiled and run once
    run = summarize(traced_kernels(engine, prompts()))
    tokens = args.prompts * args.prompt_len
    print(f"{tokens} prompt tokens: span {run['span_us'] / 1e3:.2f} ms, no kernel running for "
          f"{run['idle_us'] / 1e3:.2f} ms in {run['gaps']} gaps")  # fmt: skip
    print(f"{'kernel (grid x block)':<60} {'launches':>8} {'ms':>8} {'share':>6}")
    for row in run["kernels"][:25]:
        share = row["us"] / run["span_us"]
        print(f"{row['kernel'][:60]:<60} {row['launches']:>8} {row['us'] / 1e3:>8.2f} {share:>6.1%}")
    print("largest gaps (us): after -> before")
    for gap in run["largest_gaps"]:
        print(f"{gap['gap_us']:>9.1f}  {gap['after'][:50]} -> {gap['before'][:50]}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    header = result_header() | {"model": args.model, "prompts": args.prompts, "prompt_len": args.prompt_len}
    RESULTS.write_text(json.dumps(header | run, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
