"""The prefix-caching page's figure: the hash chain over two block tables that share a prefix.

The real PrefixCachingAllocator does the work (block_size 4 for a readable picture): request
A computes 12 tokens and registers its 3 full blocks; request B, whose first 8 tokens are
A's, attaches the cached prefix it finds (2 blocks, owners up) and gets a block of its own
for the rest. Each box is one logical block with its token ids and the key chained over
its parent's; arrows go to the arena's physical blocks, labelled with their owner counts.
`make_figures.py` calls `hash_chain_figure`.
"""

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
from timelines import COLORS, save  # it also makes matplotlib headless (Agg)

from tinyvllm.engine.prefix_cache import PrefixCachingAllocator, attach_prefix, register_computed_blocks
from tinyvllm.engine.sequence import Sequence
from tinyvllm.sampling_params import SamplingParams

BLOCK_SIZE = 4
PROMPTS = {"A": [7, 3, 9, 1, 4, 4, 2, 8, 5, 6, 0, 3], "B": [7, 3, 9, 1, 4, 4, 2, 8, 1, 1, 5, 2]}
ARENA_BLOCKS = 6


def chained_tables() -> tuple[PrefixCachingAllocator, dict[str, Sequence]]:
    """A's blocks computed and registered, then B admitted onto A's cached prefix."""
    cache = PrefixCachingAllocator(ARENA_BLOCKS)
    seqs = {name: Sequence(name, prompt, SamplingParams(max_tokens=1)) for name, prompt in PROMPTS.items()}
    a, b = seqs["A"], seqs["B"]
    a.block_table = cache.allocate(len(a.token_ids) // BLOCK_SIZE).tolist()
    a.num_computed_tokens = len(a.token_ids)
    register_computed_blocks(cache, a, BLOCK_SIZE)
    cached = attach_prefix(cache, b, BLOCK_SIZE)
    b.block_table += cache.allocate((len(b.token_ids) - cached) // BLOCK_SIZE).tolist()
    return cache, seqs


def short(key: int) -> str:
    return f"{key & 0xFFFF:04x}"


def hash_chain_figure(figures: Path) -> str:
    cache, seqs = chained_tables()
    figure, axes = plt.subplots(figsize=(9.5, 4.4))
    width, height, gap = 2.3, 0.9, 0.5
    arena_y = 1.75  # between A's row above and B's below
    for block in range(ARENA_BLOCKS):
        owners = int(cache.ref_counts[block])
        x = block * (width * 0.62 + 0.25)
        color = COLORS["prefill"] if cache.cached_block(block) else COLORS["waiting"]
        axes.add_patch(FancyBboxPatch((x, arena_y), width * 0.62, 0.6, boxstyle="round,pad=0.02", color=color))
        text_color = "white" if cache.cached_block(block) else "black"
        label = f"block {block}\n{owners} owner{'s' * (owners != 1)}"
        axes.text(x + width * 0.31, arena_y + 0.3, label, ha="center", va="center", fontsize=8, color=text_color)
    for row, (name, seq) in enumerate(seqs.items()):
        y = 3.0 - row * 3.0
        arrow_from, arrow_to = (y, arena_y + 0.6) if row == 0 else (y + height, arena_y)
        axes.text(-0.4, y + height / 2, name, ha="right", va="center", fontsize=12, weight="bold")
        parent = "root"
        for index, block in enumerate(seq.block_table):
            x = index * (width + gap)
            tokens = seq.token_ids[index * BLOCK_SIZE : (index + 1) * BLOCK_SIZE]
            entry = cache.cached_block(block)
            shared = entry is not None and cache.ref_counts[block] > 1
            color = COLORS["decode"] if shared else COLORS["waiting"]
            axes.add_patch(FancyBboxPatch((x, y), width, height, boxstyle="round,pad=0.03", color=color))
            key = f"key {short(entry.key)} = hash({parent}, ids)" if entry else "computed next: no key yet"
            axes.text(x + width / 2, y + 0.62, " ".join(map(str, tokens)), ha="center", fontsize=10, family="monospace")
            axes.text(x + width / 2, y + 0.2, key, ha="center", fontsize=7)
            if index:
                middle = y + height / 2
                link = FancyArrowPatch((x - gap, middle), (x, middle), arrowstyle="->", mutation_scale=12)
                axes.add_patch(link)
            target_x = block * (width * 0.62 + 0.25) + width * 0.31
            arrow = FancyArrowPatch((x + width / 2, arrow_from), (target_x, arrow_to), arrowstyle="->", color="#888888",
                                    mutation_scale=12)  # fmt: skip
            axes.add_patch(arrow)
            parent = short(entry.key) if entry else parent
    axes.text(-0.4, arena_y + 0.3, "arena", ha="right", va="center", fontsize=10)
    axes.set_xlim(-1.2, max(3 * (width + gap), ARENA_BLOCKS * (width * 0.62 + 0.25)))
    axes.set_ylim(-0.2, 4.1)
    axes.axis("off")
    axes.set_title("Each full block's key chains its parent's: B finds A's first two blocks and shares them")
    figure.tight_layout()
    return save(figure, figures / "prefix_cache_chain.png")
