"""The model chapters' concept figures, computed on the CPU by the engine's own NumPy code.

Each figure is drawn from what tinyvllm computes, never from numbers typed in: the embedding
gather is `reference.embedding`, the attention weights (which query head reads which KV head,
and which keys the causal mask lets a query see) come out of `reference.causal_attention`
given one-hot values, SwiGLU is `reference.silu_mul`, the distributions are
`reference.sampling_probs`, the bf16 rounding error is `to_bf16`, the safetensors layout is
`read_header` of a file the writer made, and the token pieces are the committed
docs/generated/tokens.txt (the real tokenizers' output). Inputs are seeded, so every run draws
the same pictures. `make_figures.py` calls `model_figures`.
"""

import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from timelines import COLORS, ROOT, save  # it also makes matplotlib headless (Agg)

from tests.random_llama import LLAMA_3_2_1B_CONFIG
from tinyvllm.kernels import reference
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.weights import read_header, save_safetensors

SEQUENCE_COLORS = ("#1f4e79", "#e67e22", "#27ae60", "#8e44ad", "#c0392b", "#16a085", "#7f8c8d", "#d4ac0d")


def attention_weights(num_heads: int, num_kv_heads: int, new: int, length: int) -> np.ndarray:
    """The softmax weights [Hq, new, length] of `causal_attention`: with V one-hot per
    (key, KV head), each output element is the weight its query gives one key of one head."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((new, num_heads, 4))
    k = rng.standard_normal((length, num_kv_heads, 4))
    one_hot = np.eye(length * num_kv_heads).reshape(length, num_kv_heads, length * num_kv_heads)
    out = reference.causal_attention(q, k, one_hot)  # [new, Hq, length * Hkv]
    return out.reshape(new, num_heads, length, num_kv_heads).transpose(1, 0, 2, 3)


def embedding_figure(figures: Path) -> str:
    rng = np.random.default_rng(0)
    table = reference.to_bf16(rng.standard_normal((8, 6)))
    token_ids = np.array([3, 0, 5, 3])
    rows = reference.from_bf16(reference.embedding(token_ids, table))
    figure, (left, right) = plt.subplots(1, 2, figsize=(7.5, 3.2), gridspec_kw={"width_ratios": [1.3, 1]})
    left.imshow(reference.from_bf16(table), cmap="RdBu", vmin=-2.5, vmax=2.5)
    for index, token in enumerate(token_ids):
        left.add_patch(plt.Rectangle((-0.5, token - 0.5), 6, 1, fill=False, color=SEQUENCE_COLORS[index], lw=2.5))
    left.set_yticks(range(8), [f"id {i}" for i in range(8)], fontsize=8)
    left.set_xticks(range(6), [f"{j}" for j in range(6)], fontsize=7)
    left.set_title("E: vocabulary 8 x hidden 6 (bf16)", fontsize=9)
    right.imshow(rows, cmap="RdBu", vmin=-2.5, vmax=2.5)
    right.set_yticks(range(len(token_ids)), [f"token {t}: id {i}" for t, i in enumerate(token_ids)], fontsize=8)
    right.set_xticks(range(6), [f"{j}" for j in range(6)], fontsize=7)
    right.set_title("x = E[token_ids]: one row per token", fontsize=9)
    figure.suptitle("The embedding is a row lookup (reference.embedding): id 3 twice gives the same row twice",
                    fontsize=9)  # fmt: skip
    figure.tight_layout()
    return save(figure, figures / "embedding_lookup.png")


def gqa_figure(figures: Path) -> str:
    smollm2 = ModelConfig.from_dict(json.loads((ROOT / "docs/generated/smollm2_config.json").read_text()))
    models = {"SmolLM2-135M": smollm2, "Llama 3.2 1B": ModelConfig.from_dict(LLAMA_3_2_1B_CONFIG)}
    figure, axes = plt.subplots(len(models), 1, figsize=(9, 3.6))
    for axis, (name, config) in zip(axes, models.items()):
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        weights = attention_weights(heads, kv_heads, new=1, length=2)
        reads = weights.sum(axis=(1, 2)).argmax(axis=-1)  # the one KV head each query head gives weight to
        for h in range(heads):
            axis.add_patch(plt.Rectangle((h, 1.2), 0.85, 0.6, color=SEQUENCE_COLORS[reads[h] % 8]))
            axis.text(h + 0.42, 1.5, f"q{h}", ha="center", va="center", fontsize=6, color="white")
        width = heads / kv_heads
        for j in range(kv_heads):
            axis.add_patch(plt.Rectangle((j * width + 0.1, 0), width - 0.35, 0.6, color=SEQUENCE_COLORS[j % 8]))
            axis.text(j * width + width / 2 - 0.1, 0.3, f"KV head {j}", ha="center", va="center", fontsize=7,
                      color="white")  # fmt: skip
        for h in range(heads):
            axis.plot([h + 0.42, reads[h] * width + width / 2 - 0.1], [1.2, 0.6], color="#999999", lw=0.6)
        axis.set_xlim(-0.2, heads + 0.2)
        axis.set_ylim(-0.1, 1.9)
        axis.axis("off")
        axis.set_title(f"{name}: {heads} query heads share {kv_heads} KV heads, "
                       f"{heads // kv_heads} each (query head h reads KV head h // {heads // kv_heads})",
                       fontsize=9, loc="left")  # fmt: skip
    figure.tight_layout()
    return save(figure, figures / "gqa_heads.png")


def causal_mask_figure(figures: Path) -> str:
    cases = [("prefill: 8 new tokens, nothing cached", 8, 8), ("a chunk: 3 new tokens after 5 cached", 3, 8)]
    figure, axes = plt.subplots(1, 2, figsize=(8, 3.4), layout="constrained")
    for axis, (title, new, length) in zip(axes, cases):
        weights = attention_weights(1, 1, new, length)[0, :, :, 0]
        shown = np.where(weights > 0, weights, np.nan)
        image = axis.imshow(shown, cmap="Blues", vmin=0, vmax=1)
        for i in range(new):
            for j in range(length):
                label = f"{weights[i, j]:.2f}" if weights[i, j] > 0 else "-inf"
                axis.text(j, i, label, ha="center", va="center", fontsize=6,
                          color="white" if weights[i, j] > 0.5 else "black")  # fmt: skip
        axis.set_yticks(range(new), [f"{length - new + i}" for i in range(new)], fontsize=7)
        axis.set_xticks(range(length), range(length), fontsize=7)
        axis.set_ylabel("query at position", fontsize=8)
        axis.set_xlabel("key at position", fontsize=8)
        axis.set_title(title, fontsize=9)
    figure.colorbar(image, ax=axes, shrink=0.8, label="softmax weight (-inf: the score masked)")
    figure.suptitle("The causal mask (reference.causal_attention): a query sees its own position and earlier",
                    fontsize=9)  # fmt: skip
    return save(figure, figures / "causal_mask.png")


def swiglu_figure(figures: Path) -> str:
    g = np.linspace(-6, 6, 241)
    silu = reference.silu_mul(np.stack([g, np.ones_like(g)], axis=-1).reshape(1, -1))[0]
    figure, (left, right) = plt.subplots(1, 2, figsize=(8.5, 3.3))
    left.plot(g, silu, color=COLORS["prefill"], label="silu(g) = g / (1 + e^-g)")
    left.plot(g, np.maximum(g, 0), color="#999999", linestyle=":", label="relu(g), for comparison")
    left.axhline(0, color="black", lw=0.5)
    left.set_xlabel("g")
    left.legend(fontsize=7)
    left.set_title(f"SiLU: smooth, dips to {silu.min():.3f} near g = {g[silu.argmin()]:.2f}", fontsize=9)
    grid = np.linspace(-4, 4, 81)
    gate, up = np.meshgrid(grid, grid)
    pairs = np.stack([gate.ravel(), up.ravel()], axis=-1).reshape(1, -1)
    product = reference.silu_mul(pairs).reshape(gate.shape)
    image = right.imshow(product, origin="lower", extent=(-4, 4, -4, 4), cmap="RdBu_r", vmin=-8, vmax=8)
    right.set_xlabel("gate g = (h Wg^T)_j")
    right.set_ylabel("up u = (h Wu^T)_j")
    right.set_title("SwiGLU's output silu(g) * u: the gate scales u", fontsize=9)
    figure.colorbar(image, ax=right, shrink=0.8)
    figure.tight_layout()
    return save(figure, figures / "swiglu.png")


def temperature_figure(figures: Path) -> str:
    logits = np.array([3.0, 2.5, 1.8, 1.0, 0.5, 0.0, -0.5, -1.5])
    temperatures = (0.0, 0.5, 1.0, 2.0)
    figure, axes = plt.subplots(1, len(temperatures), figsize=(9.5, 2.8), sharey=True)
    for axis, temperature in zip(axes, temperatures):
        probs = reference.sampling_probs(logits, temperature, -1, 1.0)
        axis.bar(range(len(logits)), probs, color=COLORS["prefill"])
        axis.set_xticks(range(len(logits)), [f"{v:g}" for v in logits], fontsize=6)
        axis.set_xlabel("logit", fontsize=8)
        name = "T = 0: argmax (greedy)" if temperature == 0 else f"T = {temperature:g}"
        axis.set_title(f"{name}\nlargest p = {probs.max():.2f}", fontsize=9)
    axes[0].set_ylabel("probability")
    figure.suptitle("softmax(logits / T) for eight logits (reference.sampling_probs): low T sharpens, high T flattens",
                    fontsize=9)  # fmt: skip
    figure.tight_layout()
    return save(figure, figures / "softmax_temperature.png")


def bf16_error_figure(figures: Path) -> str:
    values = np.linspace(1.0, 8.0, 4001, dtype=np.float32)
    rounded = reference.from_bf16(reference.to_bf16(values))
    error = (rounded - values) / values
    figure, axis = plt.subplots(figsize=(7.5, 2.8))
    axis.plot(values, error, color=COLORS["prefill"], lw=0.8)
    for bound in (2.0**-8, -(2.0**-8)):
        axis.axhline(bound, color="#c0392b", linestyle=":", lw=1)
    axis.text(8.0, 2.0**-8, " 2^-8", va="center", fontsize=8, color="#c0392b")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("float32 value")
    axis.set_ylabel("relative error")
    axis.set_title("Rounding to bf16 (to_bf16): the error is largest just above each power of two", fontsize=9)
    figure.tight_layout()
    return save(figure, figures / "bf16_rounding_error.png")


def safetensors_figure(figures: Path) -> str:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "model.safetensors"
        tensors = {"embed": np.zeros((8, 16), np.uint16), "layer.0.weight": np.zeros((8, 16), np.uint16),
                   "norm": np.zeros(64, np.uint16)}  # fmt: skip
        save_safetensors(path, tensors)
        header_len = int.from_bytes(path.read_bytes()[:8], "little")
        entries = read_header(path)
    figure, axis = plt.subplots(figsize=(9, 1.9))
    spans = [("N", 0, 8, "#7f8c8d"), ("JSON header", 8, 8 + header_len, "#d4ac0d")]
    for index, (name, entry) in enumerate(entries.items()):
        spans.append((name, entry.start, entry.end, SEQUENCE_COLORS[index]))
    for name, begin, end, color in spans:
        axis.broken_barh([(begin, end - begin)], (0, 1), facecolors=color, edgecolor="white")
        narrow = end - begin < 0.05 * spans[-1][2]  # labelled above the bar
        axis.text((begin + end) / 2, 1.25 if narrow else 0.5, f"{name}\n{end - begin} B", ha="center",
                  va="center", fontsize=7, color="black" if narrow else "white")  # fmt: skip
    axis.set_yticks([])
    axis.set_ylim(0, 1.6)
    axis.set_xlabel("byte of the file")
    axis.set_xlim(0, spans[-1][2])
    axis.set_title("A safetensors file written by save_safetensors: length, header, then each tensor's bytes",
                   fontsize=9)  # fmt: skip
    figure.tight_layout()
    return save(figure, figures / "safetensors_layout.png")


def token_pieces(lines: list[str]) -> list[tuple[str, list[str]]]:
    """(tokenizer, pieces) from docs/generated/tokens.txt: a header line, ids, then ' | '-joined pieces."""
    found = []
    for index, line in enumerate(lines):
        if line and not line.startswith((" ", "text:")):
            found.append((line.split(" (")[0], lines[index + 2].strip().split(" | ")))
    return found


def tokens_figure(figures: Path) -> str:
    tokenizers = token_pieces((ROOT / "docs/generated/tokens.txt").read_text().splitlines())
    figure, axes = plt.subplots(len(tokenizers), 1, figsize=(9.5, 2.4))
    width_of = [sum(max(len(piece), 1) * 0.55 + 0.3 for piece in pieces) for _, pieces in tokenizers]
    for axis, (name, pieces) in zip(axes, tokenizers):
        x = 0.0
        for index, piece in enumerate(pieces):
            width = max(len(piece), 1) * 0.55 + 0.3
            axis.add_patch(plt.Rectangle((x, 0), width - 0.1, 1, color=SEQUENCE_COLORS[index % 4], alpha=0.85))
            axis.text(x + (width - 0.1) / 2, 0.5, piece, ha="center", va="center", fontsize=6.5, color="white",
                      family="monospace")  # fmt: skip
            x += width
        axis.set_xlim(0, max(width_of))
        axis.set_ylim(0, 1)
        axis.axis("off")
        axis.set_title(f"{name}: {len(pieces)} tokens", fontsize=9, loc="left")
    figure.suptitle("One sentence, two tokenizers (docs/generated/tokens.txt; Ġ is a space)", fontsize=9)
    figure.tight_layout()
    return save(figure, figures / "token_pieces.png")


def model_figures(figures: Path) -> list[str]:
    drawers = (embedding_figure, gqa_figure, causal_mask_figure, swiglu_figure, temperature_figure,
               bf16_error_figure, safetensors_figure, tokens_figure)  # fmt: skip
    return [draw(figures) for draw in drawers]
