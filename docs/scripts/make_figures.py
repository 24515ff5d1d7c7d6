"""The docs' figures and result tables: from perf/results/*.json, and a simulated schedule.

    python docs/scripts/make_figures.py [--results perf/results] [--figures docs/figures]
                                        [--tables docs/generated/perf]

For each benchmark whose JSON is in --results it draws the figure(s) into --figures and writes
docs/generated/perf/<bench>.md: who measured it (device, date, git revision), the command,
the figures and a table of the numbers; the performance page includes those files. A
benchmark without a JSON is skipped with a message, and its table file says that the numbers
are pending. The batching and preemption timelines need no GPU (`timelines.py`: the real
Scheduler over a fake model). Matplotlib runs headless (Agg).
"""

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling timelines.py
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from timelines import ROOT, save, simulated_figures  # noqa: E402  (first: it makes matplotlib headless)

COPY_CEILING_TBPS = 4.25  # the H200's device-to-device copy, DESIGN.md
VARIANT_COLORS = {"cublas": "#555555", "tiled": "#e67e22", "gemv": "#2980b9", "paged": "#2980b9",
                  "split": "#e67e22", "auto": "#27ae60", "flash": "#2980b9", "naive": "#999999"}  # fmt: skip


# -- benchmark results ------------------------------------------------------------------------


def measured_by(data: dict) -> str:
    return f"{data['device']}, {data['date'][:10]}, git {data['git_rev']}"


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def number(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:,.0f}"


def gemm(data: dict, figures: Path) -> tuple[list[str], str]:
    rows = data["results"]
    layers = list(dict.fromkeys(r["layer"] for r in rows if r["layer"] != "square"))
    figure, axes = plt.subplots(1, len(layers), figsize=(3.0 * len(layers), 3.2), sharey=True)
    for axis, layer in zip(np.atleast_1d(axes), layers):
        for variant in ("tiled", "gemv"):
            points = sorted((r["m"], r["vs_cublas"]) for r in rows if r["layer"] == layer and r["variant"] == variant)
            if points:
                m, ratio = zip(*points)
                axis.plot(m, ratio, marker="o", label=variant, color=VARIANT_COLORS[variant])
        axis.axhline(1.0, color=VARIANT_COLORS["cublas"], linestyle=":", linewidth=1)
        n, k = next((r["n"], r["k"]) for r in rows if r["layer"] == layer)
        axis.set_title(f"{layer}\nK {k} -> N {n}", fontsize=8)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("M (rows of x)")
    np.atleast_1d(axes)[0].set_ylabel("speed relative to cuBLAS")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    figure.suptitle(f"Numba GEMM/GEMV vs cuBLAS (1.0): {measured_by(data)}", fontsize=9)
    figure.tight_layout()
    names = [save(figure, figures / "gemm_vs_cublas.png")]

    decode = [r for r in rows if r["m"] == 1]
    figure, axis = plt.subplots(figsize=(7, 3.2))
    variants = [v for v in ("cublas", "tiled", "gemv") if any(r["variant"] == v for r in decode)]
    x = np.arange(len(layers))
    for offset, variant in enumerate(variants):
        values = [
            next((r["tbps"] for r in decode if r["layer"] == layer and r["variant"] == variant), 0) for layer in layers
        ]
        axis.bar(
            x + (offset - (len(variants) - 1) / 2) * 0.25, values, 0.25, label=variant, color=VARIANT_COLORS[variant]
        )
    axis.axhline(COPY_CEILING_TBPS, color="black", linestyle=":", linewidth=1, label="copy ceiling")
    axis.set_xticks(x, layers, fontsize=8)
    axis.set_ylabel("TB/s (weights + x read)")
    axis.legend(fontsize=7, ncol=4)
    axis.set_title(f"Decode (M = 1) linear layers: {measured_by(data)}", fontsize=9)
    figure.tight_layout()
    names.append(save(figure, figures / "gemm_decode_bandwidth.png"))

    body = table(
        ["layer", "M", "N", "K", "variant", "µs", "TFLOP/s", "TB/s", "vs cuBLAS"],
        [[r["layer"], r["m"], r["n"], r["k"], r["variant"], number(r["median_us"]), number(r["tflops"]),
          number(r["tbps"]), number(r["vs_cublas"])] for r in rows],
    )  # fmt: skip
    streamed = data.get("streamed_m1", [])
    if streamed:
        body += (
            "\n\nM = 1 with the weights streamed: one CUDA graph of launches over distinct copies of the weight.\n\n"
        )
        body += table(
            ["layer", "N", "K", "gemv TB/s", "cuBLAS TB/s"],
            [[r["layer"], r["n"], r["k"], number(r["gemv_tbps"]), number(r["cublas_tbps"])] for r in streamed],
        )
    return names, bars_line(data.get("bars_met", {})) + body


def profile(data: dict, figures: Path) -> tuple[list[str], str]:
    """Tables only: where a decode step's time goes, per batch size."""
    parts = []
    for run in data["runs"]:
        kernels = sum(op["total_us"] for op in run["operators"])
        parts.append(
            f"**{data['model']}, batch {run['batch']}, context {run['context']}**: graph replay "
            f"{number(run['graph_us'])} µs on the GPU, engine step {number(run['step_wall_us'])} µs wall, "
            f"host overhead {number(run['host_overhead_us'])} µs.\n\n"
            + table(
                ["operator (eager, events)", "calls", "µs", "µs/call", "share"],
                [
                    [
                        op["operator"],
                        op["calls"],
                        number(op["total_us"]),
                        number(op["us_per_call"]),
                        f"{op['total_us'] / kernels:.0%}",
                    ]
                    for op in run["operators"]
                ],
            )  # fmt: skip
        )
    return [], "\n\n".join(parts)


def ablation(data: dict, figures: Path) -> tuple[list[str], str]:
    """Table only: the decode graph with each operator left out."""
    setup = f"{data['model']}, batch 1, context {data['context']}."
    rows = [[row["variant"], number(row["graph_us"]), number(row["cost_us"])] for row in data["rows"]]
    return [], setup + "\n\n" + table(["variant", "graph µs", "cost µs"], rows)


def timeline(data: dict, figures: Path) -> tuple[list[str], str]:
    """Tables only: each kernel's exposed time in the batch-1 decode graph, per context."""
    parts = []
    for run in data["runs"]:
        rows = [[f"`{row['kernel']}`", row["launches"], number(row["exposed_us"]),
                 number(row["exposed_us_per_launch"]), f"{row['exposed_us'] / run['span_us']:.0%}"]
                for row in run["kernels"]]  # fmt: skip
        parts.append(f"**{data['model']}, batch 1, context {run['context']}**: graph span "
                     f"{number(run['span_us'])} µs, {len(run['chain'])} kernels.\n\n"
                     + table(["kernel (specialisation, grid x block)", "launches", "exposed µs", "µs/launch",
                              "share"], rows))  # fmt: skip
    return [], "\n\n".join(parts)


def registers(data: dict, figures: Path) -> tuple[list[str], str]:
    """Table only: what ptxas reports for each launch of a decode step."""
    setup = (f"{data['model']}, batch {data['batch']}, context {data['context']}; "
             f"ptxas: {data['toolchain']}.")  # fmt: skip
    rows = [[row["operator"], f"`{row['kernel']}`", "x".join(str(g) for g in np.atleast_1d(row["grid"])),
             str(row["block"]), row["registers"], f"{row['spill_store_bytes']} / {row['spill_load_bytes']}",
             row["stack_bytes"], row["shared_bytes"], row["blocks_per_sm"]] for row in data["launches"]]  # fmt: skip
    header = ["operator", "kernel", "grid", "block", "registers", "spill st / ld (B)", "stack (B)", "smem (B)",
              "blocks / SM"]  # fmt: skip
    return [], setup + "\n\n" + table(header, rows)


def bars_line(bars: dict) -> str:
    if not bars:
        return ""
    cells = ", ".join(f"{name}: **{'met' if met else 'missed'}**" for name, met in bars.items())
    return f"Bars: {cells}.\n\n"


def elementwise(data: dict, figures: Path) -> tuple[list[str], str]:
    rows = data["results"]
    ops = list(dict.fromkeys(r["op"] for r in rows))
    tokens = sorted({r["tokens"] for r in rows})
    figure, axis = plt.subplots(figsize=(8, 3.4))
    x = np.arange(len(ops))
    width = 0.8 / len(tokens)
    for offset, count in enumerate(tokens):
        values = [next((r["effective_tbps"] for r in rows if r["op"] == op and r["tokens"] == count), 0) for op in ops]
        axis.bar(x + (offset - (len(tokens) - 1) / 2) * width, values, width, label=f"{count} tokens")
    axis.axhline(data["measured_copy_tbps"], color="black", linestyle=":", linewidth=1,
                 label=f"device copy {data['measured_copy_tbps']:.2f} TB/s")  # fmt: skip
    axis.set_xticks(x, ops, fontsize=8)
    axis.set_ylabel("effective TB/s")
    axis.legend(fontsize=7)
    axis.set_title(f"Elementwise kernels: {measured_by(data)}", fontsize=9)
    figure.tight_layout()
    names = [save(figure, figures / "elementwise_bandwidth.png")]
    body = table(
        ["op", "tokens", "shape", "µs", "TB/s", "% of copy ceiling"],
        [[r["op"], r["tokens"], r["shape"], number(r["median_us"]), number(r["effective_tbps"]),
          f"{r['percent_of_copy_ceiling']:.0f}%"] for r in rows],
    )  # fmt: skip
    copy = f"Measured device-to-device copy: {data['measured_copy_tbps']:.2f} TB/s.\n\n"
    return names, copy + bars_line(data.get("bars_met", {})) + body


def attention(data: dict, figures: Path) -> tuple[list[str], str]:
    decode, prefill = data["decode"], data["prefill"]
    batches = sorted({r["batch"] for r in decode})
    figure, axes = plt.subplots(1, len(batches), figsize=(3.3 * len(batches), 3.2), sharey=True)
    for axis, batch in zip(np.atleast_1d(axes), batches):
        rows = sorted((r for r in decode if r["batch"] == batch), key=lambda r: r["context"])
        contexts = [r["context"] for r in rows]
        for variant in ("paged", "split", "auto"):
            axis.plot(contexts, [r[f"{variant}_tbps"] for r in rows], marker="o", label=variant,
                      color=VARIANT_COLORS[variant])  # fmt: skip
        axis.axhline(data["copy_tbps"], color="black", linestyle=":", linewidth=1)
        axis.set_xscale("log", base=2)
        axis.set_title(f"batch {batch}", fontsize=8)
        axis.set_xlabel("context (tokens)")
    np.atleast_1d(axes)[0].set_ylabel("K+V read, TB/s")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    figure.suptitle(f"Decode attention (dotted: device copy): {measured_by(data)}", fontsize=9)
    figure.tight_layout()
    names = [save(figure, figures / "attention_decode.png")]

    figure, axis = plt.subplots(figsize=(6, 3.2))
    shapes = [r["shape"] for r in prefill]
    x = np.arange(len(shapes))
    axis.bar(x - 0.2, [r["flash_tflops"] for r in prefill], 0.4, label="flash", color=VARIANT_COLORS["flash"])
    axis.bar(x + 0.2, [r.get("naive_tflops", 0) for r in prefill], 0.4, label="naive", color=VARIANT_COLORS["naive"])
    axis.set_xticks(x, [f"{s} tokens" for s in shapes], fontsize=8)
    axis.set_ylabel("TFLOP/s (causal half)")
    axis.legend(fontsize=7)
    axis.set_title(f"Prefill attention: {measured_by(data)}", fontsize=9)
    figure.tight_layout()
    names.append(save(figure, figures / "attention_prefill.png"))

    decode_table = table(
        ["batch", "context", "paged ms", "paged TB/s", "split parts", "split ms", "split TB/s", "auto TB/s"],
        [[r["batch"], r["context"], number(r["paged_ms"]), number(r["paged_tbps"]), r["split_partitions"],
          number(r["split_ms"]), number(r["split_tbps"]), number(r["auto_tbps"])] for r in decode],
    )  # fmt: skip
    prefill_table = table(
        ["sequences x new + cached", "flash ms", "flash TFLOP/s", "naive ms", "flash speedup"],
        [[r["shape"], number(r["flash_ms"]), number(r["flash_tflops"]), number(r.get("naive_ms")),
          number(r.get("speedup"))] for r in prefill],
    )  # fmt: skip
    bars = ", ".join(f"{name} = **{value:.2f}**" for name, value in data["bars"].items())
    header = f"Device copy: {data['copy_tbps']:.2f} TB/s. Bars (need >= 10, >= 3.0, >= 3): {bars}.\n\n"
    return names, header + decode_table + "\n\n" + prefill_table


def sampling(data: dict, figures: Path) -> tuple[list[str], str]:
    rows = data["results"]
    vocabs = sorted({r["vocab"] for r in rows})
    ops = list(dict.fromkeys(r["op"] for r in rows))
    counts = sorted({r["rows"] for r in rows})
    figure, axes = plt.subplots(1, len(vocabs), figsize=(5 * len(vocabs), 3.4), sharey=True)
    for axis, vocab in zip(np.atleast_1d(axes), vocabs):
        x = np.arange(len(ops))
        width = 0.8 / len(counts)
        for offset, count in enumerate(counts):
            values = [next((r["median_us"] for r in rows if (r["op"], r["vocab"], r["rows"], r["logits"])
                            == (op, vocab, count, "flat")), 0) for op in ops]  # fmt: skip
            axis.bar(x + (offset - (len(counts) - 1) / 2) * width, values, width, label=f"S = {count}")
        axis.axhline(data["bar_us"], color="black", linestyle=":", linewidth=1)
        axis.set_xticks(x, [op.removeprefix("sample_") for op in ops], fontsize=7, rotation=30)
        axis.set_title(f"V = {vocab}, flat logits", fontsize=8)
    np.atleast_1d(axes)[0].set_ylabel("µs per call")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    figure.suptitle(f"Sampling (dotted: the {data['bar_us']:.0f} µs bar): {measured_by(data)}", fontsize=9)
    figure.tight_layout()
    names = [save(figure, figures / "sampling.png")]
    shown = [r for r in rows if r["rows"] == max(counts)]
    body = table(
        ["op", "logits", "S", "V", "passes", "µs", "TB/s"],
        [[r["op"], r["logits"], r["rows"], r["vocab"], r["passes"], number(r["median_us"]), number(r["effective_tbps"])]
         for r in shown],
    )  # fmt: skip
    verdict = (
        f"Bar (every case at S = {data['bar_shape'][0]}, V = {data['bar_shape'][1]} within {data['bar_us']:.0f} µs): "
    )
    return names, verdict + f"**{'met' if data['bar_met'] else 'missed'}**.\n\n" + body


def decode(data: dict, figures: Path) -> tuple[list[str], str]:
    rows = data["results"]
    figure, axis = plt.subplots(figsize=(6, 3.2))
    x = np.arange(len(rows))
    series = [("tinyvllm", "decode_tok_per_s", "#2980b9"), ("HF static cache", "hf_static_tok_per_s", "#999999"),
              ("roofline", "roofline_tok_per_s", "#dddddd")]  # fmt: skip
    for offset, (label, key, color) in enumerate(series):
        axis.bar(x + (offset - 1) * 0.27, [r.get(key, 0) for r in rows], 0.27, label=label, color=color)
    axis.set_xticks(x, [r["model"] for r in rows])
    axis.set_ylabel("decode tokens/s (batch 1)")
    axis.legend(fontsize=7)
    axis.set_title(f"Batch-1 decode: {measured_by(data)}", fontsize=9)
    figure.tight_layout()
    names = [save(figure, figures / "decode.png")]
    body = table(
        ["model", "tok/s", "ms/token", "TTFT ms", "roofline tok/s", "% roofline", "HF static tok/s", "x HF"],
        [[r["model"], number(r["decode_tok_per_s"], 4), number(r["decode_ms_per_token"]),
          number(r["time_to_first_token_ms"]), number(r["roofline_tok_per_s"], 4), f"{r['percent_of_roofline']:.0f}%",
          number(r.get("hf_static_tok_per_s"), 4), number(r.get("speedup_vs_hf"))] for r in rows],
    )  # fmt: skip
    return names, body


def throughput(data: dict, figures: Path) -> tuple[list[str], str]:
    runs = [("continuous", data["continuous"]["output_tok_per_s"]), ("static", data["static"]["output_tok_per_s"])]
    if "hf_generate_subset" in data:
        runs.append(("HF generate (64 requests)", data["hf_generate_subset"]["useful_output_tok_per_s"]))
    figure, axis = plt.subplots(figsize=(6, 3.0))
    axis.barh(
        [name for name, _ in runs], [value for _, value in runs], color=["#2980b9", "#e67e22", "#999999"][: len(runs)]
    )
    axis.invert_yaxis()
    axis.set_xlabel("output tokens/s")
    axis.set_title(f"Offline throughput, {data['model']}: {measured_by(data)}", fontsize=9)
    figure.tight_layout()
    names = [save(figure, figures / "throughput.png")]
    rows = [
        [mode, data[mode]["output_tokens"], number(data[mode]["seconds"]), number(data[mode]["output_tok_per_s"], 5)]
        for mode in ("continuous", "static")
    ]
    if "hf_generate_subset" in data:
        h = data["hf_generate_subset"]
        rows.append(["HF generate (64 requests)", h["useful_output_tokens"], number(h["seconds"]),
                     number(h["useful_output_tok_per_s"], 5)])  # fmt: skip
    p = data["prefill"]
    rows.append([f"prefill {p['prompts']} x {p['prompt_len']}", f"{p['prompts'] * p['prompt_len']} (prompt)",
                 number(p["seconds"]), number(p["prefill_tok_per_s"], 5)])  # fmt: skip
    return names, table(["run", "tokens", "seconds", "tokens/s"], rows)


def serve(data: dict, figures: Path) -> tuple[list[str], str]:
    result, config = data["result"], data["config"]
    metrics = ("ttft_ms", "tpot_ms", "itl_ms")
    figure, axis = plt.subplots(figsize=(6, 3.0))
    x = np.arange(len(metrics))
    for offset, stat in enumerate(("p50", "p99")):
        axis.bar(x + (offset - 0.5) * 0.4, [result[m][stat] or 0 for m in metrics], 0.4, label=stat)
    axis.set_xticks(x, ["time to first token", "time per output token", "inter-token latency"], fontsize=8)
    axis.set_yscale("log")
    axis.set_ylabel("ms")
    axis.legend(fontsize=7)
    axis.set_title(f"Serving, {config['concurrency']} concurrent clients: {measured_by(data)}", fontsize=9)
    figure.tight_layout()
    names = [save(figure, figures / "serve_latency.png")]
    summary = table(
        ["requests", "duration s", "requests/s", "output tok/s", "total tok/s"],
        [[result["num_requests"], number(result["duration_s"]), number(result["requests_per_s"]),
          number(result["output_tokens_per_s"], 5), number(result["total_tokens_per_s"], 5)]],
    )  # fmt: skip
    latencies = table(
        ["ms", "mean", "p50", "p99"],
        [[name] + [number(result[name][stat]) for stat in ("mean", "p50", "p99")]
         for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms")],
    )  # fmt: skip
    setup = (f"Model {config['model']}, {config['num_prompts']} prompts of {config['input_len']} words, "
             f"{config['output_len']} output tokens, server metrics after the run: "
             f"`{json.dumps(config['server_metrics'])}`.")  # fmt: skip
    return names, setup + "\n\n" + summary + "\n\n" + latencies


@dataclass(frozen=True)
class Benchmark:
    name: str
    command: str
    draw: Callable[[dict, Path], tuple[list[str], str]]


BENCHMARKS = (
    Benchmark("bench_gemm", "python -m perf.bench_gemm", gemm),
    Benchmark("bench_elementwise", "python -m perf.bench_elementwise", elementwise),
    Benchmark("bench_attention", "python -m perf.bench_attention", attention),
    Benchmark("bench_sampling", "python -m perf.bench_sampling", sampling),
    Benchmark("bench_decode", "python -m perf.bench_decode", decode),
    Benchmark("bench_throughput", "python -m perf.bench_throughput", throughput),
    Benchmark("bench_serve", "python -m perf.bench_serve", serve),
    Benchmark("profile_step", "python -m perf.profile_step", profile),
    Benchmark("ablate_step", "python -m perf.ablate_step", ablation),
    Benchmark("timeline_step", "python -m perf.timeline_step", timeline),
    Benchmark("kernel_registers", "python -m perf.kernel_registers", registers),
)


def pending(bench: Benchmark) -> str:
    return (
        '!!! warning "Numbers pending the H200 run"\n'
        f"    `perf/results/{bench.name}.json` is not there yet. On the GPU: `{bench.command}`;\n"
        "    then `python docs/scripts/make_figures.py` fills this section with the figures and the table.\n"
    )


def results_page(bench: Benchmark, data: dict, names: list[str], body: str) -> str:
    images = "\n\n".join(f"![{bench.name}: {name}](figures/{name})" for name in names)
    note = f" {data['note']}" if "note" in data else ""
    return (
        f"Measured on **{data['device']}**, {data['date']}, git `{data['git_rev']}`, by\n"
        f"`{data['command']}`.{note}\n\n{images}\n\n{body}\n"
    )


def run(results: Path, figures: Path, tables: Path) -> None:
    """The timelines, then each benchmark's figures and table (or its pending note)."""
    tables.mkdir(parents=True, exist_ok=True)
    simulated_figures(figures)
    for bench in BENCHMARKS:
        path = results / f"{bench.name}.json"
        if not path.exists():
            print(f"skipping {bench.name}: {path} not found (run `{bench.command}` on the GPU)")
            page = pending(bench)
        else:
            data = json.loads(path.read_text())
            names, body = bench.draw(data, figures)
            page = results_page(bench, data, names, body)
        (tables / f"{bench.name}.md").write_text(page)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "perf" / "results")
    parser.add_argument("--figures", type=Path, default=ROOT / "docs" / "figures")
    parser.add_argument("--tables", type=Path, default=ROOT / "docs" / "generated" / "perf")
    args = parser.parse_args()
    run(args.results, args.figures, args.tables)


if __name__ == "__main__":
    main()
