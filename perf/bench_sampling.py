"""sample on the GPU: time per call, and how fast each pass streams the logits.

    python -m perf.bench_sampling [--repeats 50]

For S = 1, 64, 256 rows and V = 49152 (SmolLM2) and 128256 (Llama 3) tokens this times
(perf/timing.py: CUDA events, cold L2, median) `sample` with every row greedy, plain
(temperature 0.8, no filter), top-k 50, top-p 0.9, and top-k 50 with top-p 0.9. Greedy
and plain rows are spread over many blocks (the batch-1 decode step's case: S = 1,
greedy or plain); the filtered ones run one block per row. Each reads the float32 logits
once per pass (1, 1, 4, 5 and 8 passes, from the kernel's docstring); the table shows the
time and the bandwidth of all those passes together, against the 4.25 TB/s copy ceiling.

Two kinds of rows: "flat", standard normal logits (every token carries mass: the most
work for top-p's histogram), and "peaked", normal logits of scale 2.5 with ten tokens
raised by 12, closer to a model's output. Bar: every case at S = 256, V = 128256 within
300 us.

"every_option" is a step with every sampling option on (kernels/penalties.py): the
penalty kernel over each row's token state (a 512-token prompt and 256 output tokens
per row, stop tokens masked), min-p 0.05, then `sample` with top-k 50 and top-p 0.9, the
count update and logprobs with the top 20 (kernels/logprobs.py, on the raw logits, of
which the runner makes a copy before the penalties). Its passes: the sampler's 8, the
penalties' 2 (the logits and the state words), min-p's 2, the copy's 2 (read and write),
the logprobs' 1. The penalties and min-p change the logits in place, so here the copy runs
the other way, from the raw logits (never changed) into the ones they change: the same
bytes moved, and every repeat starts from the same row instead of the last one's output
(min-p's -inf in most of it). Its ratio to today's sampler with
the same filters (top_k_top_p), and to plain, are printed and kept; bar, on the first: at most OPTIONS_BAR_RATIO at
S = 256, V = 128256. Each of its kernels is also timed alone at that shape (`--breakdown`:
only that). Results go to perf/results/bench_sampling.json.
"""

import argparse
import json
from pathlib import Path

import numpy as np
from numba import config, cuda

from perf.timing import median_ms, result_header
from tests.sampling_cases import pack_sampling_params
from tinyvllm.kernels.logprobs import compute_logprobs
from tinyvllm.kernels.penalties import apply_min_p, apply_penalties, count_sampled_tokens
from tinyvllm.kernels.sampling import sample, sample_workspace_shape
from tinyvllm.kernels.token_state import token_state_row
from tinyvllm.sampling_params import MAX_LOGPROBS

COPY_CEILING_TBPS = 4.25
BAR_US = 300.0
BAR_SHAPE = (256, 128256)
ROWS = (1, 64, 256)
VOCABS = (49152, 128256)
# name: (temperature, top_k, top_p, passes over the logits)
SAMPLERS = {
    "greedy": (0.0, -1, 1.0, 1),
    "plain": (0.8, -1, 1.0, 1),
    "top_k": (0.8, 50, 1.0, 4),
    "top_p": (0.8, -1, 0.9, 5),
    "top_k_top_p": (0.8, 50, 0.9, 8),
}
EVERY_OPTION = "every_option"
OPTIONS_BAR_RATIO = 2.0
"""every_option may cost at most this many times top_k_top_p at BAR_SHAPE."""
OPTIONS_PASSES = SAMPLERS["top_k_top_p"][3] + 2 + 2 + 2 + 1
HISTORY = {"prompt": 512, "output": 256}
"""Tokens of each row's sequence that the penalties read."""
OPTIONS = {"presence": 0.5, "frequency": 0.3, "repetition": 1.2, "min_p": 0.05}
RESULTS = Path(__file__).resolve().parent / "results" / "bench_sampling.json"

rng = np.random.default_rng(0)


def random_logits(rows: int, vocab: int, kind: str):
    if kind == "flat":
        logits = rng.standard_normal((rows, vocab))
    else:
        logits = 2.5 * rng.standard_normal((rows, vocab))
        for row in range(rows):
            logits[row, rng.choice(vocab, 10, replace=False)] += 12.0
    return cuda.to_device(logits.astype(np.float32))


def cases(rows: int, vocab: int, kind: str):
    """(op, passes, call) for one shape and kind of logits."""
    logits = random_logits(rows, vocab, kind)
    out = cuda.device_array(rows, np.int32)
    shape = sample_workspace_shape(rows, vocab)
    workspace = cuda.device_array(shape, np.float32), cuda.device_array(shape, np.int32)
    seeds, offsets = rng.integers(0, 2**63, rows, dtype=np.uint64), range(rows)
    for name, (temperature, top_k, top_p, passes) in SAMPLERS.items():
        params = pack_sampling_params([temperature] * rows, [top_k] * rows, [top_p] * rows, seeds, offsets)
        device_params = [cuda.to_device(array) for array in params]
        yield f"sample_{name}", passes, lambda params=device_params: sample(logits, *params, out, *workspace)
    yield EVERY_OPTION, OPTIONS_PASSES, every_option_step(logits, out, workspace, seeds)


def every_option_step(logits, out, workspace, seeds):
    """The call of one step with every option on, over `logits` (changed in place)."""
    rows, vocab = logits.shape
    temperature, top_k, top_p, _ = SAMPLERS["top_k_top_p"]
    sampler_params = pack_sampling_params([temperature] * rows, [top_k] * rows, [top_p] * rows, seeds, range(rows))
    sampler_params = [cuda.to_device(array) for array in sampler_params]
    state = np.stack(
        [
            token_state_row(
                vocab,
                rng.integers(0, vocab, HISTORY["prompt"]),
                rng.integers(0, vocab, HISTORY["output"]),
                rng.integers(0, vocab, 3),
            )
            for _ in range(rows)
        ]
    )
    state, slots = cuda.to_device(state), cuda.to_device(np.arange(rows, dtype=np.int32))
    row_params = [
        cuda.to_device(np.full(rows, OPTIONS[name], np.float32)) for name in ("presence", "frequency", "repetition")
    ]
    mask_stop_tokens = cuda.to_device(np.ones(rows, np.int32))
    min_p = cuda.to_device(np.full(rows, OPTIONS["min_p"], np.float32))
    raw_logits = cuda.device_array_like(logits)
    raw_logits.copy_to_device(logits)
    num_logprobs = cuda.to_device(np.full(rows, MAX_LOGPROBS, np.int32))
    logprobs_out = (
        cuda.device_array((rows, MAX_LOGPROBS), np.int32),
        cuda.device_array((rows, MAX_LOGPROBS), np.float32),
        cuda.device_array(rows, np.float32),
        cuda.device_array(rows, np.int32),
    )

    # the runner's copy, run from the raw logits to the ones the kernels after it change
    stages = {
        "copy": lambda: logits.copy_to_device(raw_logits),
        "penalties": lambda: apply_penalties(logits, state, slots, *row_params, mask_stop_tokens),
        "min_p": lambda: apply_min_p(logits, sampler_params[0], min_p),
        "sample": lambda: sample(logits, *sampler_params, out, *workspace),
        "count": lambda: count_sampled_tokens(state, slots, out),
        "logprobs": lambda: compute_logprobs(raw_logits, num_logprobs, out, *logprobs_out),
    }

    def call():
        for stage in stages.values():
            stage()

    call.stages = stages
    return call


def every_option_breakdown(kind: str, repeats: int) -> dict:
    """Each kernel of every_option's step timed alone at BAR_SHAPE, after one whole step
    (so that each sees the row it sees inside the step), in microseconds."""
    rows, vocab = BAR_SHAPE
    logits = random_logits(rows, vocab, kind)
    shape = sample_workspace_shape(rows, vocab)
    workspace = cuda.device_array(shape, np.float32), cuda.device_array(shape, np.int32)
    seeds = rng.integers(0, 2**63, rows, dtype=np.uint64)
    step = every_option_step(logits, cuda.device_array(rows, np.int32), workspace, seeds)
    step()
    return {name: median_ms(stage, repeats=repeats) * 1e3 for name, stage in step.stages.items()}


def options_ratios(results: list[dict]) -> list[dict]:
    """every_option's time over top_k_top_p's (the bar's) and over plain's, for each shape and kind of logits."""
    times = {(row["op"], row["logits"], row["rows"], row["vocab"]): row["median_us"] for row in results}
    return [
        {
            "logits": kind,
            "rows": rows,
            "vocab": vocab,
            "ratio_to_top_k_top_p": us / times["sample_top_k_top_p", kind, rows, vocab],
            "ratio_to_plain": us / times["sample_plain", kind, rows, vocab],
        }
        for (op, kind, rows, vocab), us in times.items()
        if op == EVERY_OPTION
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--breakdown", action="store_true", help="only every_option's kernels, each alone")
    args = parser.parse_args()
    if config.ENABLE_CUDASIM:
        raise SystemExit("bench_sampling times real kernels: it needs a CUDA GPU, not the simulator")
    breakdown = {kind: every_option_breakdown(kind, args.repeats) for kind in ("flat", "peaked")}
    for kind, stages in breakdown.items():
        cells = "  ".join(f"{name} {us:.1f}" for name, us in stages.items())
        print(f"{EVERY_OPTION} at S={BAR_SHAPE[0]}, V={BAR_SHAPE[1]}, {kind}, each kernel alone (us): {cells}")
    if args.breakdown:
        return

    results = []
    print(f"{'op':<20} {'logits':<7} {'S':>4} {'V':>7} {'passes':>6} {'us':>9} {'TB/s':>6} {'% ceiling':>9}")
    for kind in ("flat", "peaked"):
        for vocab in VOCABS:
            for rows in ROWS:
                for op, passes, call in cases(rows, vocab, kind):
                    milliseconds = median_ms(call, repeats=args.repeats)
                    moved = passes * rows * vocab * 4
                    tbps = moved / (milliseconds * 1e-3) / 1e12
                    percent = 100 * tbps / COPY_CEILING_TBPS
                    print(
                        f"{op:<20} {kind:<7} {rows:>4} {vocab:>7} {passes:>6} "
                        f"{milliseconds * 1e3:>9.1f} {tbps:>6.2f} {percent:>8.1f}%"
                    )
                    results.append(
                        {
                            "op": op,
                            "logits": kind,
                            "rows": rows,
                            "vocab": vocab,
                            "passes": passes,
                            "median_us": milliseconds * 1e3,
                            "effective_tbps": tbps,
                            "percent_of_copy_ceiling": percent,
                        }
                    )
    at_bar = [row for row in results if (row["rows"], row["vocab"]) == BAR_SHAPE]
    bar_met = all(row["median_us"] <= BAR_US for row in at_bar)
    slowest = max(at_bar, key=lambda row: row["median_us"])
    print(
        f"bar: every case at S={BAR_SHAPE[0]}, V={BAR_SHAPE[1]} within {BAR_US:.0f} us: "
        f"{'met' if bar_met else 'MISSED'} (slowest {slowest['op']} {slowest['logits']}, "
        f"{slowest['median_us']:.1f} us)"
    )
    ratios = options_ratios(results)
    for ratio in ratios:
        print(
            f"{EVERY_OPTION} / sample_top_k_top_p {ratio['logits']:<7} S={ratio['rows']:>4} V={ratio['vocab']:>7}: "
            f"{ratio['ratio_to_top_k_top_p']:.2f}x (to sample_plain {ratio['ratio_to_plain']:.2f}x)"
        )
    at_options_bar = [ratio for ratio in ratios if (ratio["rows"], ratio["vocab"]) == BAR_SHAPE]
    options_bar_met = all(ratio["ratio_to_top_k_top_p"] <= OPTIONS_BAR_RATIO for ratio in at_options_bar)
    print(
        f"bar: {EVERY_OPTION} at S={BAR_SHAPE[0]}, V={BAR_SHAPE[1]} within {OPTIONS_BAR_RATIO:.0f}x "
        f"sample_top_k_top_p: {'met' if options_bar_met else 'MISSED'}"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        **result_header(),
        "copy_ceiling_tbps": COPY_CEILING_TBPS,
        "bar_us": BAR_US,
        "bar_shape": list(BAR_SHAPE),
        "bar_met": bar_met,
        "options_bar_ratio": OPTIONS_BAR_RATIO,
        "options_bar_met": options_bar_met,
        "options": OPTIONS,
        "history": HISTORY,
        "results": results,
        "options_ratios": ratios,
        "every_option_breakdown_us": breakdown,
    }
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
