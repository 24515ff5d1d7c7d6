"""The engine benchmarks' figures and tables for make_figures.py: batch-1 decode, offline
throughput, serving latency and the decode graph's kernel timeline; and, tables only, where a
decode step's time goes (the profile, the ablation) and what ptxas reports for its kernels."""

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from result_tables import measured_by, number, table
from timelines import save  # it also makes matplotlib headless (Agg)


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


CHAIN_SHOWN = 16  # the first kernels of a graph: the feed, the embedding and two layers


def chain_figure(data: dict, figures: Path) -> str:
    """The first kernels of one graph replay on the GPU's clock: each bar from its start to
    its end, the dark part its exposed time (what it adds after the kernel before it ends)."""
    run = data["runs"][0]
    chain = run["chain"][:CHAIN_SHOWN]
    figure, axis = plt.subplots(figsize=(8.5, 4.2))
    for row, kernel in enumerate(chain):
        start, end = kernel["start_us"], kernel["start_us"] + kernel["duration_us"]
        axis.barh(row, kernel["duration_us"], left=start, color="#7fb3e0", height=0.7)
        axis.barh(row, kernel["exposed_us"], left=end - kernel["exposed_us"], color="#1f4e79", height=0.7)
        axis.text(end + 0.4, row, f"{kernel['exposed_us']:.1f} µs", va="center", fontsize=6)
    axis.set_yticks(range(len(chain)), [kernel["kernel"].split(" ")[0] for kernel in chain], fontsize=6)
    axis.invert_yaxis()
    axis.set_xlabel("µs from the graph's first kernel")
    axis.set_title(f"The start of a batch-1 decode graph, {data['model']}, context {run['context']} "
                   f"(dark: exposed time): {measured_by(data)}", fontsize=8)  # fmt: skip
    figure.tight_layout()
    return save(figure, figures / "graph_chain.png")


def timeline(data: dict, figures: Path) -> tuple[list[str], str]:
    """Each kernel's exposed time in the batch-1 decode graph, per context; the figure of
    the graph's first kernels."""
    parts = []
    for run in data["runs"]:
        rows = [[f"`{row['kernel']}`", row["launches"], number(row["exposed_us"]),
                 number(row["exposed_us_per_launch"]), f"{row['exposed_us'] / run['span_us']:.0%}"]
                for row in run["kernels"]]  # fmt: skip
        parts.append(f"**{data['model']}, batch 1, context {run['context']}**: graph span "
                     f"{number(run['span_us'])} µs, {len(run['chain'])} kernels.\n\n"
                     + table(["kernel (specialisation, grid x block)", "launches", "exposed µs", "µs/launch",
                              "share"], rows))  # fmt: skip
    return [chain_figure(data, figures)], "\n\n".join(parts)


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
