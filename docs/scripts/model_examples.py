"""The examples of make_examples.py about the weights and the models: a safetensors file's
bytes, bf16 rounding, SmolLM2 and Llama 3.2 1B side by side, and the RoPE frequency bands of
Llama 3.2's "llama3" scaling. make_examples.py puts the checkout on sys.path first.
"""

import json
import math
from pathlib import Path

import numpy as np

from tests.random_llama import LLAMA_3_2_1B_CONFIG
from tinyvllm.benchmark import roofline_tok_per_s
from tinyvllm.engine.model_runner import kv_block_bytes
from tinyvllm.kernels.reference import from_bf16, to_bf16
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.rope import rope_inv_freq
from tinyvllm.model.weights import read_header

BLOCK_SIZE = 16
BANDWIDTH = 4.25e12  # the H200's measured device copy, DESIGN.md


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
