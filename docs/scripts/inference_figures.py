"""The inference and GPU chapters' concept figures, from the engine's own code on the CPU.

The packed step and the block tables over the arena are `build_step` on the example batch of
step_examples.py (the batch docs/generated/step_metadata.txt shows); the workspace is what
`Workspace` allocates for Llama 3.2 1B, asked of a backend that only records the shapes; the
pinned staging area is `StepBuffers` on the NumPy backend; the GEMM tile is the index
arithmetic of kernels/gemm.py's constants; the split-K merge is `reference.merge_partition_states`
on seeded scores, checked against one softmax over the whole context.
`make_figures.py` calls `inference_figures`.
"""

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from model_figures import SEQUENCE_COLORS
from step_examples import EXAMPLE_BLOCK_SIZE, EXAMPLE_MAX_BLOCKS, example_batch
from timelines import COLORS, save  # it also makes matplotlib headless (Agg)

from tests.random_llama import LLAMA_3_2_1B_CONFIG
from tinyvllm.backends.numpy_backend import NumpyBackend
from tinyvllm.config import ResolvedEngineConfig
from tinyvllm.engine.model_runner import build_step
from tinyvllm.engine.step_inputs import StepBuffers
from tinyvllm.kernels import gemm, gemm_tiles, reference
from tinyvllm.kernels.device.mma import MMA_M, MMA_N, WARP
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.llama import Workspace

ARENA_BLOCKS = 8


def packed_step_figure(figures: Path) -> str:
    batch = example_batch()
    step = build_step(batch, EXAMPLE_BLOCK_SIZE, EXAMPLE_MAX_BLOCKS)
    owners = np.repeat(np.arange(len(batch.seqs)), batch.num_scheduled_tokens)
    figure, axis = plt.subplots(figsize=(8, 2.3))
    for row, owner in enumerate(owners):
        kind = "decode" if row < step.num_decode else "prefill"
        alpha = 1.0 if kind == "decode" else 0.55
        axis.add_patch(plt.Rectangle((row, 0), 0.92, 1, color=SEQUENCE_COLORS[owner], alpha=alpha))
        axis.text(row + 0.46, 0.72, f"{batch.seqs[owner].request_id}, {kind}", ha="center", fontsize=7, color="white")
        axis.text(row + 0.46, 0.42, f"position {step.positions[row]}", ha="center", fontsize=7, color="white")
        axis.text(row + 0.46, 0.12, f"slot {step.slot_mapping[row]}", ha="center", fontsize=7, color="white")
    for sampled in step.sample_rows:
        axis.annotate("sampled", (sampled + 0.46, 1.0), (sampled + 0.46, 1.35), ha="center", fontsize=7,
                      arrowprops={"arrowstyle": "->"})  # fmt: skip
    axis.set_xlim(-0.1, len(owners))
    axis.set_ylim(0, 1.6)
    axis.axis("off")
    axis.set_title("One step's packed rows (build_step): A and B decode, C prefills a chunk of five", fontsize=9)
    figure.tight_layout()
    return save(figure, figures / "packed_step.png")


def block_table_figure(figures: Path) -> str:
    batch = example_batch()
    step = build_step(batch, EXAMPLE_BLOCK_SIZE, EXAMPLE_MAX_BLOCKS)
    size = EXAMPLE_BLOCK_SIZE
    new_slots = set(step.slot_mapping.tolist())
    figure, axis = plt.subplots(figsize=(9, 3.4))
    arena_y, width = 0.0, 1.6
    for block in range(ARENA_BLOCKS):
        x = block * (width + 0.2)
        axis.text(x + width / 2, arena_y - 0.35, f"block {block}", ha="center", fontsize=7)
        for row in range(size):
            axis.add_patch(plt.Rectangle((x + row * width / size, arena_y), width / size - 0.03, 0.8,
                                         color=COLORS["waiting"]))  # fmt: skip
    for index, (seq, context) in enumerate(zip(batch.seqs, step.context_lens)):
        y = 2.4 - index * 0.0
        table_x = index * 5.0
        axis.text(table_x, y + 0.9, f"{seq.request_id}: table {list(seq.block_table)}, {context} tokens",
                  fontsize=8, color=SEQUENCE_COLORS[index])  # fmt: skip
        for logical, block in enumerate(seq.block_table):
            cell_x = table_x + logical * 1.1
            axis.add_patch(plt.Rectangle((cell_x, y), 1.0, 0.6, color=SEQUENCE_COLORS[index]))
            axis.text(cell_x + 0.5, y + 0.3, str(block), ha="center", va="center", color="white", fontsize=9)
            arena_x = block * (width + 0.2)
            axis.annotate("", (arena_x + width / 2, arena_y + 0.8), (cell_x + 0.5, y),
                          arrowprops={"arrowstyle": "->", "color": SEQUENCE_COLORS[index], "lw": 0.8})  # fmt: skip
            for row in range(min(size, context - logical * size)):
                slot = block * size + row
                alpha = 1.0 if slot in new_slots else 0.45
                filled = plt.Rectangle((arena_x + row * width / size, arena_y), width / size - 0.03, 0.8,
                                       color=SEQUENCE_COLORS[index], alpha=alpha)  # fmt: skip
                axis.add_patch(filled)
    axis.text(-0.2, arena_y + 0.4, "arena", ha="right", va="center", fontsize=9)
    axis.set_xlim(-1.2, ARENA_BLOCKS * (width + 0.2))
    axis.set_ylim(-0.6, 3.5)
    axis.axis("off")
    axis.set_title(f"Block tables over one arena (block_size {size}): pale slots were cached, solid ones are "
                   "this step's new K/V", fontsize=9)  # fmt: skip
    figure.tight_layout()
    return save(figure, figures / "block_table_arena.png")


class ShapeRecorder:
    """Just enough of a backend for Workspace: it records each buffer instead of allocating it."""

    activation_dtype = np.uint16

    def __init__(self) -> None:
        self.buffers: list[tuple[tuple[int, ...], np.dtype]] = []

    def empty(self, shape: tuple[int, ...], dtype) -> int:
        self.buffers.append((shape, np.dtype(dtype)))
        return len(self.buffers) - 1

    def decode_scratch(self, max_seqs: int, config: ModelConfig, cascade: bool = False) -> None:
        return None

    def sample_scratch(self, max_rows: int, vocab: int) -> None:
        return None


def workspace_figure(figures: Path) -> str:
    config = ModelConfig.from_dict(LLAMA_3_2_1B_CONFIG)
    recorder, max_tokens, max_sampled = ShapeRecorder(), 8192, 256
    workspace = Workspace(recorder, config, max_tokens, max_sampled)
    names = {index: name for name, index in vars(workspace).items() if isinstance(index, int)}
    sizes = {names[i]: (int(np.prod(shape)) * dtype.itemsize, shape)
             for i, (shape, dtype) in enumerate(recorder.buffers)}  # fmt: skip
    figure, axis = plt.subplots(figsize=(8, 3.2))
    labels = list(sizes)
    megabytes = [sizes[name][0] / 1e6 for name in labels]
    axis.barh(labels, megabytes, color=COLORS["decode"])
    for index, name in enumerate(labels):
        rows = sizes[name][1][0]
        per_row = sizes[name][0] / rows / 1e6
        used = per_row * min(64, rows)
        axis.barh(index, used, color=COLORS["prefill"])
        label = f" {megabytes[index]:.1f} MB  {list(sizes[name][1])}"
        axis.text(megabytes[index], index, label, va="center", fontsize=7)
    axis.invert_yaxis()
    axis.set_xlim(0, max(megabytes) * 1.45)
    axis.set_xlabel("MB (dark: the rows a decode step of 64 sequences uses)")
    axis.set_title(f"Workspace for Llama 3.2 1B, {max_tokens} tokens a step: {sum(megabytes):.0f} MB, "
                   f"reused by all {config.num_hidden_layers} layers and every step", fontsize=9)  # fmt: skip
    figure.tight_layout()
    return save(figure, figures / "workspace_reuse.png")


def staging_figure(figures: Path) -> str:
    limits = ResolvedEngineConfig(mode="continuous", num_blocks=64, block_size=16, max_num_seqs=16,
                                  max_num_batched_tokens=64, max_model_len=256)  # fmt: skip
    buffers = StepBuffers(NumpyBackend(), limits)
    base = buffers.staging[0].ctypes.data
    fields = [(name, view.ctypes.data - base, view.nbytes) for name, view in buffers.host_fields[0]]
    figure, (layout, turns) = plt.subplots(2, 1, figsize=(9, 3.9), gridspec_kw={"height_ratios": [1.3, 1]})
    for index, (name, offset, nbytes) in enumerate(fields):
        layout.broken_barh([(offset, nbytes)], (0, 1), facecolors=SEQUENCE_COLORS[index % 8], edgecolor="white")
        layout.text(offset + nbytes / 2, 1.1 + 0.4 * (index % 3), name, ha="center", fontsize=6)
    layout.set_xlim(0, buffers.staging[0].nbytes)
    layout.set_ylim(0, 2.3)
    layout.set_yticks([])
    layout.set_xlabel(f"byte of the pinned staging area ({buffers.staging[0].nbytes:,} B for "
                      f"max_num_batched_tokens {limits.max_num_batched_tokens}, max_num_seqs {limits.max_num_seqs})",
                      fontsize=8)  # fmt: skip
    layout.set_title("StepBuffers: every field at a fixed offset, the same layout on the device; one copy a step",
                     fontsize=9)  # fmt: skip
    for step in range(5):
        turn = (step + 1) % 2  # stage() flips the turn before it fills the area
        turns.broken_barh([(step, 0.9)], (turn * 1.0 + 0.1, 0.8), facecolors=COLORS["prefill"])
        turns.text(step + 0.45, turn + 0.5, f"host fills step {step}", ha="center", va="center", fontsize=7,
                   color="white")  # fmt: skip
        turns.broken_barh([(step + 0.9, 0.9)], (turn * 1.0 + 0.1, 0.8), facecolors=COLORS["decode"])
        turns.text(step + 1.35, turn + 0.5, f"copy of step {step}", ha="center", va="center", fontsize=7)
    turns.set_yticks([0.5, 1.5], ["staging 0", "staging 1"], fontsize=8)
    turns.set_xlim(0, 6)
    turns.set_xticks([])
    turns.set_xlabel("time: the area the host fills is never the one a queued copy still reads", fontsize=8)
    figure.tight_layout()
    return save(figure, figures / "pinned_staging.png")


def gemm_tiling_figure(figures: Path) -> str:
    figure, (grid, tile) = plt.subplots(1, 2, figsize=(9, 4.2), gridspec_kw={"width_ratios": [1, 1.2]})
    m, n = 512, 768
    for i in range(m // gemm.BLOCK_M):
        for j in range(n // gemm.BLOCK_N):
            color = COLORS["prefill"] if (i, j) == (1, 2) else COLORS["waiting"]
            grid.add_patch(plt.Rectangle((j * gemm.BLOCK_N, i * gemm.BLOCK_M), gemm.BLOCK_N - 6, gemm.BLOCK_M - 6,
                                         color=color))  # fmt: skip
    grid.set_xlim(0, n)
    grid.set_ylim(m, 0)
    grid.set_aspect("equal")
    grid.set_title(f"Y [{m} x {n}]: one block of {gemm.THREADS} threads\nper {gemm.BLOCK_M} x {gemm.BLOCK_N} tile, "
                   f"K walked {gemm.BLOCK_K} at a time", fontsize=9)  # fmt: skip
    warps = gemm.THREADS // WARP
    owned = np.zeros((gemm.BLOCK_M, gemm.BLOCK_N))
    shape = gemm_tiles.GEMM_SHAPE  # the library's tile configuration
    for warp in range(warps):  # the kernel's warp_m, warp_n
        warp_m, warp_n = (warp // shape.warps_n) * gemm_tiles.WARP_M, (warp % shape.warps_n) * shape.warp_n
        owned[warp_m : warp_m + gemm_tiles.WARP_M, warp_n : warp_n + shape.warp_n] = warp
    lane_zero = warps  # its colour: lane 0 of warp 0 (g = t = 0), the epilogue's store indices
    for mi in range(gemm.TILES_M):
        for ni in range(shape.tiles_n):
            for row in (MMA_M * mi, MMA_M * mi + 8):
                owned[row, MMA_N * ni : MMA_N * ni + 2] = lane_zero
    colormap = plt.matplotlib.colors.ListedColormap([*SEQUENCE_COLORS[:warps], "black"])
    tile.imshow(owned, cmap=colormap, vmin=-0.5, vmax=warps + 0.5, interpolation="nearest")
    tile.set_xlabel("column of the tile")
    tile.set_ylabel("row of the tile")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in (*SEQUENCE_COLORS[:warps], "black")]
    tile.legend(handles, [*(f"warp {w}" for w in range(warps)), "warp 0, lane 0"], fontsize=6, loc="upper left",
               bbox_to_anchor=(1.01, 1))  # fmt: skip
    tile.set_title(f"The tile: each warp owns {gemm_tiles.WARP_M} x {shape.warp_n} outputs, {gemm.TILES_M} x "
                   f"{shape.tiles_n} mma tiles of {MMA_M} x {MMA_N};\na lane holds 4 of each tile (lane 0 in black)",
                   fontsize=9)  # fmt: skip
    figure.tight_layout()
    return save(figure, figures / "gemm_tiling.png")


def split_merge_figure(figures: Path) -> str:
    rng = np.random.default_rng(0)
    length, parts, dim = 64, 4, 8
    scores = rng.standard_normal(length) * 2.0  # base-2 scores, as the kernels keep them
    values = rng.standard_normal((length, dim))
    bounds = np.linspace(0, length, parts + 1).astype(int)
    maxima, sums, outputs = [], [], []
    for begin, end in zip(bounds[:-1], bounds[1:]):
        part = scores[begin:end]
        maxima.append(part.max())
        sums.append(np.exp2(part - part.max()).sum())
        outputs.append(np.exp2(part - part.max()) @ values[begin:end])
    merged = reference.merge_partition_states(np.array(maxima), np.array(sums), np.array(outputs))
    whole = np.exp2(scores - scores.max()) @ values / np.exp2(scores - scores.max()).sum()
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), gridspec_kw={"width_ratios": [1.6, 1]})
    for index, (begin, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        left.bar(np.arange(begin, end), scores[begin:end], color=SEQUENCE_COLORS[index], width=0.8)
        left.hlines(maxima[index], begin - 0.4, end - 0.6, color="black", lw=1.2)
        left.text((begin + end) / 2, maxima[index] + 0.3, f"m = {maxima[index]:.2f}\nl = {sums[index]:.2f}",
                  ha="center", fontsize=7)  # fmt: skip
    left.set_ylim(scores.min() - 0.5, max(maxima) + 1.6)
    left.set_xlabel("key (token of the context)")
    left.set_ylabel("score (base 2)")
    left.set_title(f"Split-K: {parts} partitions, one block each, keep (max m, sum l, acc)", fontsize=9)
    weights = np.exp2(np.array(maxima) - max(maxima)) * np.array(sums)
    right.bar(range(parts), weights / weights.sum(), color=SEQUENCE_COLORS[:parts])
    right.set_xticks(range(parts), [f"part {p}" for p in range(parts)], fontsize=8)
    right.set_ylabel("share of the softmax's mass")
    error = float(np.abs(merged - whole).max())
    right.set_title(f"The merge weighs part p by 2^(m_p - M) l_p;\nmerged vs one softmax: max difference {error:.0e}",
                    fontsize=9)  # fmt: skip
    figure.tight_layout()
    return save(figure, figures / "split_k_merge.png")


def inference_figures(figures: Path) -> list[str]:
    drawers = (packed_step_figure, block_table_figure, workspace_figure, staging_figure, gemm_tiling_figure,
               split_merge_figure)  # fmt: skip
    return [draw(figures) for draw in drawers]
