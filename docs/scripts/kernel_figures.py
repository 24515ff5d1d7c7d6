"""The kernel benchmarks' figures and tables for make_figures.py: GEMM/GEMV against cuBLAS,
the elementwise kernels, decode and prefill attention, and sampling."""

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from result_tables import measured_by, number, table
from timelines import save  # it also makes matplotlib headless (Agg)

COPY_CEILING_TBPS = 4.25  # the H200's device-to-device copy, DESIGN.md
CUBLAS_TFLOPS = 787  # cuBLAS bf16 at 8192^3 on the H200 (docs/performance.md, the ceilings)
VARIANT_COLORS = {"cublas": "#555555", "tiled": "#e67e22", "gemv": "#2980b9", "paged": "#2980b9",
                  "split": "#e67e22", "auto": "#27ae60", "flash": "#2980b9", "naive": "#999999"}  # fmt: skip


def gemm(data: dict, figures: Path) -> tuple[list[str], str]:
    rows = data["results"]
    layers = list(dict.fromkeys(r["layer"] for r in rows if r["layer"] != "square"))
    columns = 3
    grid_rows = -(-len(layers) // columns)
    figure, axes = plt.subplots(grid_rows, columns, figsize=(8.5, 2.9 * grid_rows), sharey=True, squeeze=False)
    for axis, layer in zip(axes.flat, layers):
        for variant in ("tiled", "gemv"):
            points = sorted((r["m"], r["vs_cublas"]) for r in rows if r["layer"] == layer and r["variant"] == variant)
            if points:
                m, ratio = zip(*points)
                axis.plot(m, ratio, marker="o", label=variant, color=VARIANT_COLORS[variant])
        axis.axhline(1.0, color=VARIANT_COLORS["cublas"], linestyle=":", linewidth=1)
        n, k = next((r["n"], r["k"]) for r in rows if r["layer"] == layer)
        axis.set_title(f"{layer}: K {k} -> N {n}", fontsize=9)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("M (rows of x)", fontsize=8)
        axis.grid(alpha=0.3)
    for axis in axes.flat[len(layers) :]:
        axis.axis("off")
    for axis in axes[:, 0]:
        axis.set_ylabel("speed vs cuBLAS (1.0)")
    axes[0, 0].legend(fontsize=8)
    figure.suptitle(f"Numba GEMM/GEMV against cuBLAS (dotted, 1.0): {measured_by(data)}", fontsize=10)
    figure.tight_layout()
    names = [save(figure, figures / "gemm_vs_cublas.png"), roofline(data, figures)]

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


def roofline(data: dict, figures: Path) -> str:
    """Each product's achieved TFLOP/s against its FLOP per byte, under the H200's two roofs."""
    figure, axis = plt.subplots(figsize=(7, 4))
    intensity = np.logspace(-0.5, 3.6, 200)
    roof = f"roof: {COPY_CEILING_TBPS} TB/s x intensity, cuBLAS bf16 peak {CUBLAS_TFLOPS} TFLOP/s"
    ceiling = np.minimum(COPY_CEILING_TBPS * intensity, CUBLAS_TFLOPS)
    axis.plot(intensity, ceiling, color="black", linewidth=1, label=roof)
    for variant in ("cublas", "tiled", "gemv"):
        points = [(r["tflops"] / r["tbps"], r["tflops"]) for r in data["results"] if r["variant"] == variant]
        if points:
            x, y = zip(*points)
            axis.scatter(x, y, s=14, label=variant, color=VARIANT_COLORS[variant], zorder=3)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    axis.set_ylabel("TFLOP/s achieved")
    axis.legend(fontsize=7, loc="upper left")
    axis.grid(alpha=0.3, which="both")
    axis.set_title(f"The roofline of every product in bench_gemm: {measured_by(data)}", fontsize=9)
    figure.tight_layout()
    return save(figure, figures / "roofline.png")


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
    figure, axes = plt.subplots(1, len(batches), figsize=(8, 3.4), sharey=True)
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
    figure, axes = plt.subplots(len(vocabs), 1, figsize=(7.5, 2.9 * len(vocabs)), sharey=True)
    for axis, vocab in zip(np.atleast_1d(axes), vocabs):
        x = np.arange(len(ops))
        width = 0.8 / len(counts)
        for offset, count in enumerate(counts):
            values = [next((r["median_us"] for r in rows if (r["op"], r["vocab"], r["rows"], r["logits"])
                            == (op, vocab, count, "flat")), 0) for op in ops]  # fmt: skip
            axis.bar(x + (offset - (len(counts) - 1) / 2) * width, values, width, label=f"S = {count}")
        axis.axhline(data["bar_us"], color="black", linestyle=":", linewidth=1)
        axis.set_xticks(x, [op.removeprefix("sample_") for op in ops], fontsize=8, rotation=20)
        axis.set_title(f"V = {vocab}, flat logits", fontsize=9)
        axis.set_ylabel("µs per call")
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
    verdict += f"**{'met' if data['bar_met'] else 'missed'}**.\n\n"
    if "options_bar_met" in data:
        at_bar = [r for r in data["options_ratios"] if [r["rows"], r["vocab"]] == data["bar_shape"]]
        ratios = ", ".join(f"{r['ratio_to_top_k_top_p']:.2f}x ({r['logits']})" for r in at_bar)
        verdict += (
            f"Bar (every_option within {data['options_bar_ratio']:.0f}x sample_top_k_top_p there): {ratios}, "
            f"**{'met' if data['options_bar_met'] else 'missed'}**.\n\n"
        )
    for kind, stages in data.get("every_option_breakdown_us", {}).items():
        cells = ", ".join(f"{name} {us:.0f}" for name, us in stages.items())
        verdict += f"every_option's kernels each alone, {kind} logits (µs): {cells}.\n\n"
    return names, verdict + body
