"""The examples of make_examples.py about one engine step: the backend calls of a decode step
(counted on the NumPy backend), the kernels it launches on an H200 (from the variant table),
and the arrays runner.build_step makes for a mixed batch. make_examples.py puts the checkout
on sys.path first.
"""

from pathlib import Path

import numpy as np

from tests.random_llama import LLAMA_3_2_1B_CONFIG, TINY_OVERRIDES, make_random_llama_dir
from tinyvllm.backends.kernel_list import decode_kernel_count
from tinyvllm.engine.model_runner import build_step
from tinyvllm.engine.scheduled_batch import ScheduledBatch
from tinyvllm.engine.sequence import Sequence
from tinyvllm.llm import LLM
from tinyvllm.model.config import ModelConfig
from tinyvllm.sampling_params import SamplingParams

OPERATORS = ("embedding", "linear", "linear_rope_write_kv", "decode_attention", "prefill_attention",
             "linear_silu_mul", "gather_rows", "sample", "upload_bytes")  # fmt: skip


DECODE_BATCHES = (1, 2, 8, 64, 256)


def decode_kernels(smollm2: dict) -> str:
    """Kernels one decode step launches on an H200 with cuBLAS (`tinyvllm kernels`), by batch."""
    configs = {
        "SmolLM2-135M": ModelConfig.from_dict(smollm2),
        "Llama 3.2 1B": ModelConfig.from_dict(LLAMA_3_2_1B_CONFIG),
    }
    lines = ["| batch | " + " | ".join(configs) + " |", "|---|" + "---|" * len(configs)]
    for batch in DECODE_BATCHES:
        counts = [decode_kernel_count(config, batch, max_num_seqs=256) for config in configs.values()]
        lines.append(f"| {batch} | " + " | ".join(str(count) for count in counts) + " |")
    # the prefix cache's shared system prompt, cascade attention turned on: its three kernels a layer
    counts = [
        decode_kernel_count(config, 256, context=2112, shared=2048, max_num_seqs=256, disable_cascade_attn=False)
        for config in configs.values()
    ]
    cells = " | ".join(str(count) for count in counts)
    lines.append(f"| 256, 2,048 of 2,112 tokens shared, cascade on | {cells} |")
    return "\n".join(lines) + "\n"


def decode_step_ops(scratch: Path) -> str:
    """Count the backend calls of one decode step for each model's layer count (tiny widths, same calls)."""
    counts = {}
    for name, layers in (("SmolLM2-135M (30 layers)", 30), ("Llama 3.2 1B (16 layers)", 16)):
        model_dir = make_random_llama_dir(scratch / f"layers-{layers}", tokenizer="bytes",
                                          config_overrides={**TINY_OVERRIDES, "num_hidden_layers": layers})  # fmt: skip
        llm = LLM(model_dir, backend="numpy", block_size=4, num_blocks=64)
        backend = llm.engine.runner.backend
        calls = dict.fromkeys(OPERATORS, 0)
        depth = [0]  # the NumPy decode_attention calls prefill_attention: count the model's calls only
        for operator in OPERATORS:
            method = getattr(backend, operator)

            def counted(*args, _operator=operator, _method=method, calls=calls, depth=depth, **kwargs):
                calls[_operator] += depth[0] == 0
                depth[0] += 1
                try:
                    return _method(*args, **kwargs)
                finally:
                    depth[0] -= 1

            setattr(backend, operator, counted)
        engine = llm.engine
        engine.add_request([1, 2, 3, 4, 5], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
        engine.step()  # the prefill
        calls.update(dict.fromkeys(OPERATORS, 0))
        batch = engine.scheduler.running[0]
        engine.step()  # one decode
        if batch.num_computed_tokens != 6:
            raise RuntimeError("expected a one-token decode step")
        counts[name] = calls
    lines = ["| backend call | " + " | ".join(counts) + " |", "|---|" + "---|" * len(counts)]
    for operator in OPERATORS:
        if any(c[operator] for c in counts.values()):
            lines.append(f"| `{operator}` | " + " | ".join(str(c[operator]) for c in counts.values()) + " |")
    totals = [sum(n for op, n in c.items() if op != "upload_bytes") for c in counts.values()]
    lines.append("| **operator calls** | " + " | ".join(f"**{t}**" for t in totals) + " |")
    return "\n".join(lines) + "\n"


EXAMPLE_BLOCK_SIZE, EXAMPLE_MAX_BLOCKS = 4, 5


def example_batch() -> ScheduledBatch:
    """Two decodes and a prefill chunk, with block_size 4 to keep it short: the batch of the
    step_metadata example and of the block-table figures."""
    a = Sequence("A", list(range(100, 109)), SamplingParams(temperature=0.0, seed=1))  # decodes position 8
    a.num_computed_tokens, a.block_table = 8, [7, 2, 5]
    b = Sequence("B", list(range(200, 206)), SamplingParams(temperature=0.7, top_p=0.9, seed=2))  # position 5
    b.num_computed_tokens, b.block_table = 5, [0, 3]
    c = Sequence("C", list(range(300, 311)), SamplingParams(temperature=0.0, seed=3))  # positions 6 .. 10
    c.num_computed_tokens, c.block_table = 6, [4, 1, 6]
    return ScheduledBatch(seqs=[a, b, c], num_scheduled_tokens=np.array([1, 1, 5], dtype=np.int32),
                          samples=np.array([True, True, True]), num_decodes=2)  # fmt: skip


def step_metadata() -> str:
    """build_step on the example batch."""
    block_size = EXAMPLE_BLOCK_SIZE
    step = build_step(example_batch(), block_size, EXAMPLE_MAX_BLOCKS)
    lines = [
        f"block_size {block_size}; A and B decode one token each, C computes prompt tokens 6..10 (the rest of it).",
        "A: 9 tokens, 8 in the cache, blocks [7, 2, 5]",
        "B: 6 tokens, 5 in the cache, blocks [0, 3]",
        "C: an 11-token prompt, 6 in the cache (an earlier chunk), blocks [4, 1, 6]",
        "",
    ]
    for name in ("token_ids", "positions", "slot_mapping", "context_lens", "prefill_cu_seqlens", "sample_rows",
                 "temperature", "top_k", "top_p", "seeds", "sample_positions"):  # fmt: skip
        lines.append(f"{name:<19}{np.array2string(getattr(step, name), separator=' ')}")
    lines.append(f"{'num_decode':<19}{step.num_decode}")
    table = np.array2string(step.block_tables, separator=" ").replace("\n", "\n" + " " * 19)
    lines.append(f"{'block_tables':<19}{table}")
    return "\n".join(lines) + "\n"
