"""Where a prefill step's time goes: GPU time per operator, the host's launch, whole prompts.

    python -m perf.profile_prefill [--model llama-1b] [--prompts 64] [--prompt-len 1024]
                                   [--linear-backend auto] [--out FILE]

Prefill is not a replayed graph: the host launches each of its kernels (about 90 for Llama
3.2 1B, a cuBLAS call for each product besides), and the engine runs a step ahead so that
this launching overlaps the GPU's work on the step before. The script shows both sides on a
fresh engine (default token budget), first warmed up with prompts of the same shapes:

- one prefill step of the prompts the step's token budget takes: per operator, each call
  between two CUDA events behind a hold kernel (`profile_step.operator_times`); its wall
  time from launch to the sampled token with nothing queued before it, of which the host's
  launch (schedule, step inputs, kernel launches); a cProfile of that launch;
- all --prompts prompts at once, one output token each, as `perf/bench_throughput.py`'s
  prefill figure counts them: total time, prompt tok/s and each engine step's wall time, and
  on the GPU each step's span and the idle time before it (`gpu_step_times`): where a step's
  wall time exceeds its kernels' sum, whether the GPU waited between steps or inside them.

`--linear-backend tiled` runs the products on the library's tiled tensor-core GEMM instead
of cuBLAS. Results: perf/results/profile_prefill.json (or --out).
"""

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numba import cuda

from perf.models import model_dir
from perf.profile_step import host_functions, operator_times, print_host_functions, print_operators
from perf.timing import result_header
from tinyvllm.config import LINEAR_BACKENDS
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.sampling_params import SamplingParams

RESULTS = Path(__file__).resolve().parent / "results" / "profile_prefill.json"


def gpu_step_times(engine: LLMEngine, run: Callable[[], list[float]]) -> tuple[list[float], dict]:
    """run()'s result, and the GPU's side of each step it launched, from CUDA events recorded
    on the engine's stream before and after each launch: `span_ms`, from the step's first
    kernel to its last (the GPU's idle time inside it included: where it ran out of launched
    work), and `gap_ms`, the GPU's time between the step before and this one (idle, if the host
    had not launched this step when the one before finished)."""
    runner, launch = engine.runner, engine.runner.launch
    marks = []

    def marked_launch(batch):
        before, after = cuda.event(), cuda.event()  # timing events, numba-cuda's default
        before.record(runner.backend.stream)
        step = launch(batch)
        after.record(runner.backend.stream)
        marks.append((before, after))
        return step

    runner.launch = marked_launch
    try:
        result = run()
    finally:
        del runner.launch  # the instance attribute goes: the method shows again
    cuda.synchronize()
    spans = [before.elapsed_time(after) for before, after in marks]
    gaps = [marks[i - 1][1].elapsed_time(marks[i][0]) for i in range(1, len(marks))]
    return result, {"span_ms": spans, "gap_ms": gaps}


def profile_prefill(engine: LLMEngine, num_prompts: int, prompt_len: int, rng) -> dict:
    """One prefill step (the prompts of num_prompts that the token budget takes; a first set
    warms up the shapes), then all num_prompts prompts, their steps pipelined as in serving."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    vocab = engine.config.vocab_size
    budget = engine.scheduler.config.max_num_batched_tokens
    per_step = max(1, min(num_prompts, budget // prompt_len))

    def admit(count: int) -> None:
        for _ in range(count):
            engine.add_request(rng.integers(0, vocab, prompt_len).tolist(), params, final_only=True)

    def drain() -> list[float]:
        """Step until every request is done; each step's wall milliseconds."""
        times = []
        while engine.has_unfinished_requests():
            start = time.perf_counter()
            engine.step()
            times.append((time.perf_counter() - start) * 1e3)
        return times

    admit(per_step)
    drain()
    admit(per_step)
    summary, operators = operator_times(engine)
    drain()
    admit(per_step)
    cuda.synchronize()
    start = time.perf_counter()
    engine.step()  # launches the prefill; the next call waits for its token
    launched = time.perf_counter()
    engine.step()
    cuda.synchronize()
    wall, launch = (time.perf_counter() - start) * 1e6, (launched - start) * 1e6
    drain()
    admit(per_step)
    host = host_functions(engine, top=25, steps=1)  # the launch alone
    drain()
    admit(num_prompts)
    start = time.perf_counter()
    steps_ms, gpu = gpu_step_times(engine, drain)
    seconds = time.perf_counter() - start
    tokens = per_step * prompt_len
    return {"prompts": num_prompts, "prompt_len": prompt_len, "step_tokens": tokens,
            "eager_span_us": summary["span_us"], "step_wall_us": wall, "launch_us": launch,
            "operators": operators, "launch_host_functions": host,
            "all_prompts": {"seconds": seconds, "prompt_tok_per_s": num_prompts * prompt_len / seconds,
                            "steps_ms": steps_ms, "gpu": gpu}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--num-blocks", type=int, help="KV blocks; default: sized from free memory")
    parser.add_argument("--linear-backend", default="auto", choices=LINEAR_BACKENDS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    engine = LLMEngine(model_dir(args.model), num_blocks=args.num_blocks, linear_backend=args.linear_backend)
    run = profile_prefill(engine, args.prompts, args.prompt_len, np.random.default_rng(0))
    print(
        f"prefill step of {run['step_tokens']} tokens ({args.prompt_len} each): eager kernels "
        f"{run['eager_span_us']:.0f} us, step wall {run['step_wall_us']:.0f} us (host launch "
        f"{run['launch_us']:.0f} us), {run['step_tokens'] / run['step_wall_us'] * 1e6:.0f} tok/s"
    )
    print_operators(run["operators"])
    print_host_functions(run["launch_host_functions"])
    every = run["all_prompts"]
    steps = ", ".join(f"{ms:.1f}" for ms in every["steps_ms"])
    print(f"all {args.prompts} prompts: {every['seconds'] * 1e3:.1f} ms, {every['prompt_tok_per_s']:.0f} tok/s; "
          f"steps (ms): {steps}")  # fmt: skip
    spans, gaps = (", ".join(f"{ms:.1f}" for ms in every["gpu"][key]) for key in ("span_ms", "gap_ms"))
    print(f"on the GPU, each step's kernels (ms): {spans}; idle before each next step (ms): {gaps}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    header = result_header() | {"model": args.model, "linear_backend": args.linear_backend}
    args.out.write_text(json.dumps(header | run, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
