"""GGUF -> a Hugging Face model directory.

llama.cpp ships models as GGUF: one file of metadata (typed key/value pairs) and tensors,
most of them quantized. tinyvllm runs HF-format directories of BF16 weights, so a GGUF is
converted once into `config.json`, `generation_config.json`, `tokenizer.json`,
`tokenizer_config.json` and `model.safetensors`:

- Tensors are dequantized to float32 and rounded to BF16 (the block formats are in
  `tinyvllm.model.gguf.format`).
- GGUF lists a tensor's dimensions fastest first (ne0 = in_features), the reverse of NumPy's
  order, so GGUF's [ne0, ne1] is HF's [out, in] = [ne1, ne0]; GGUFReader already hands the
  data over in NumPy order.
- llama.cpp's converter reorders the rows of every Q and K head: HF's rotate-half RoPE pairs
  dimension i with i + d/2, llama.cpp pairs 2i with 2i + 1, so row i + j * d/2 of a head is
  stored at 2i + j. `undo_rope_permutation` puts the rows back (heads of K: the KV heads).
- Names map `blk.N.attn_q.weight` -> `model.layers.N.self_attn.q_proj.weight` and so on; no
  `output.weight` means the LM head is the embedding table (tied).
- The tokenizer is rebuilt from `tokenizer.ggml.*` (see `tinyvllm.model.gguf.tokenizer`).
- Llama 3.1+/3.2's `rope_freqs.weight` is no weight: it becomes config.json's llama3
  `rope_scaling` (see `tinyvllm.model.gguf.rope`).

Only the `llama` architecture is converted. Anything else, and any malformed file (checked by
`tinyvllm.model.gguf.check` before it is read), is refused with one `GGUFError` naming the file and
what is wrong. Everything that can fail on the input happens before the first write, and the
files are written into a scratch directory renamed into place, so a failed conversion leaves
no partial output.
"""

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
from tqdm import tqdm

from tinyvllm.model.config import ConfigError, ModelConfig
from tinyvllm.model.gguf.check import open_gguf
from tinyvllm.model.gguf.format import (
    SUPPORTED_TYPES,
    GGUFError,
    dequantize,
    dequantize_to_bf16,
    read_metadata,
    require,
)
from tinyvllm.model.gguf.rope import ROPE_FREQS, rope_scaling
from tinyvllm.model.gguf.tokenizer import build_tokenizer, tokenizer_config
from tinyvllm.model.weights import save_safetensors, weight_shapes

ARCHITECTURE = "llama"
DEFAULT_ROPE_THETA = 10000.0
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Counts and sizes: a zero, a negative or a non-integer here means a corrupt file.
_POSITIVE_INTEGERS = {
    f"llama.{key}"
    for key in (
        "block_count",
        "context_length",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.key_length",
        "rope.dimension_count",
        "vocab_size",
    )
}
_POSITIVE_NUMBERS = {"llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon", "llama.rope.scaling.factor"}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, progress: bool = True) -> Path:
    """Convert a llama-architecture GGUF into an HF model directory at `out_dir` (created, or filled if it exists)."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = open_gguf(gguf_path)
    metadata = read_metadata(reader)
    _check_tokenizer_metadata(metadata, gguf_path)
    weights = [tensor for tensor in reader.tensors if tensor.name != ROPE_FREQS]
    rope_freqs = next((tensor for tensor in reader.tensors if tensor.name == ROPE_FREQS), None)
    tensor_names = {tensor.name: hf_tensor_name(tensor.name, gguf_path) for tensor in weights}
    frequency_divisors = None if rope_freqs is None else dequantize(rope_freqs.data, rope_freqs.tensor_type)
    config = llama_config(metadata, "output.weight" not in tensor_names, gguf_path, frequency_divisors)
    _check_tensors(weights, tensor_names, config, gguf_path)
    tokenizer = build_tokenizer(metadata, source=gguf_path)
    tokenizer_settings = tokenizer_config(metadata, config["max_position_embeddings"])

    tensors = {}
    for tensor in tqdm(weights, desc=f"converting {gguf_path.name}", unit="tensor", disable=not progress):
        weight = dequantize_to_bf16(tensor.data, tensor.tensor_type)
        if tensor.name.endswith(".attn_q.weight"):
            weight = undo_rope_permutation(weight, config["num_attention_heads"])
        elif tensor.name.endswith(".attn_k.weight"):
            weight = undo_rope_permutation(weight, config["num_key_value_heads"])
        tensors[tensor_names[tensor.name]] = weight

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.partial-"))
    try:
        _write_json(scratch / "config.json", config)
        _write_json(scratch / "generation_config.json", _generation_config(config))
        _write_json(scratch / "tokenizer_config.json", tokenizer_settings)
        tokenizer.save(str(scratch / "tokenizer.json"))
        save_safetensors(scratch / "model.safetensors", tensors)
        _move_into_place(scratch, out_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out_dir


def _move_into_place(scratch: Path, out_dir: Path) -> None:
    """The finished files into `out_dir`: the scratch directory renamed, or its files moved into an existing one."""
    if not out_dir.exists():
        scratch.chmod(0o755)  # mkdtemp made it private
        os.rename(scratch, out_dir)
        return
    for path in scratch.iterdir():
        os.replace(path, out_dir / path.name)


def hf_tensor_name(gguf_name: str, source: Path | str = "GGUF") -> str:
    """`blk.3.ffn_up.weight` -> `model.layers.3.mlp.up_proj.weight`."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match[2] not in _LAYER_NAMES:
        raise GGUFError(f"{source}: tensor {gguf_name!r} has no place in a Llama model")
    return f"model.layers.{match[1]}.{_LAYER_NAMES[match[2]]}.weight"


# --8<-- [start:undo-rope-permutation]
def undo_rope_permutation(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's `w.reshape(n_head, 2, d // 2, ...).swapaxes(1, 2)` on Q/K rows."""
    half = weight.shape[0] // num_heads // 2
    per_head = weight.reshape(num_heads, half, 2, *weight.shape[1:])
    return np.ascontiguousarray(per_head.swapaxes(1, 2).reshape(weight.shape))


# --8<-- [end:undo-rope-permutation]


def llama_config(metadata: dict, tied: bool, source: Path | str = "GGUF", rope_freqs: np.ndarray | None = None) -> dict:
    """The HF `config.json` of a LlamaForCausalLM described by `llama.*` and `tokenizer.ggml.*` keys
    (and the file's `rope_freqs.weight` values, when it has them)."""
    architecture = require(metadata, "general.architecture", source)
    if architecture != ARCHITECTURE:
        raise GGUFError(f"{source}: architecture {architecture!r} is not supported (only {ARCHITECTURE!r})")
    for key, value in metadata.items():
        if key in _POSITIVE_INTEGERS and (type(value) is not int or value <= 0):
            raise GGUFError(f"{source}: {key} is {value!r}, which cannot be true (a positive integer)")
        if key in _POSITIVE_NUMBERS and not (isinstance(value, (int, float)) and np.isfinite(value) and value > 0):
            raise GGUFError(f"{source}: {key} is {value!r}, which cannot be true (a positive number)")

    def llama(key):
        return require(metadata, f"llama.{key}", source)

    hidden_size = llama("embedding_length")
    num_heads = llama("attention.head_count")
    head_dim = metadata.get("llama.attention.key_length", hidden_size // num_heads)
    rotary_dim = metadata.get("llama.rope.dimension_count", head_dim)
    if rotary_dim != head_dim:
        raise GGUFError(
            f"{source}: partial RoPE (llama.rope.dimension_count {rotary_dim}, head_dim {head_dim}) is not supported"
        )
    if hidden_size % num_heads:
        raise GGUFError(f"{source}: llama.embedding_length {hidden_size} is not a multiple of {num_heads} heads")
    theta = _shortest(metadata.get("llama.rope.freq_base", DEFAULT_ROPE_THETA))
    tokens = require(metadata, "tokenizer.ggml.tokens", source)
    eos_ids = _stop_token_ids(metadata, source)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden_size,
        "intermediate_size": llama("feed_forward_length"),
        "num_hidden_layers": llama("block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": metadata.get("llama.attention.head_count_kv", num_heads),
        "head_dim": head_dim,
        "vocab_size": metadata.get("llama.vocab_size", len(tokens)),
        "max_position_embeddings": llama("context_length"),
        "rms_norm_eps": _shortest(llama("attention.layer_norm_rms_epsilon")),
        "rope_theta": theta,
        "rope_scaling": rope_scaling(metadata, rope_freqs, head_dim, theta, source),
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids,
        "torch_dtype": "bfloat16",
    }


def _shortest(value: float) -> float:
    """A float32 from the file as the shortest decimal that reads back to it (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(value)))


def _stop_token_ids(metadata: dict, source) -> list[int]:
    """eos, then end-of-turn and end-of-message when the file names them (Llama 3 does)."""
    eos = require(metadata, "tokenizer.ggml.eos_token_id", source)
    extra = [metadata.get(f"tokenizer.ggml.{key}_token_id") for key in ("eot", "eom")]
    return list(dict.fromkeys([eos] + [token_id for token_id in extra if token_id is not None]))


def _generation_config(config: dict) -> dict:
    return {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}


def _check_tokenizer_metadata(metadata: dict, source: Path) -> None:
    """The vocabulary is a list of strings and every special token id names one of them."""
    tokens = require(metadata, "tokenizer.ggml.tokens", source)
    if not isinstance(tokens, list) or not all(isinstance(token, str) for token in tokens):
        raise GGUFError(f"{source}: tokenizer.ggml.tokens is not a list of strings")
    for key, value in metadata.items():
        is_token_id = key.startswith("tokenizer.ggml.") and key.endswith("_token_id")
        if is_token_id and (type(value) is not int or not 0 <= value < len(tokens)):
            raise GGUFError(f"{source}: {key} is {value!r}, not a token id (the vocabulary has {len(tokens)})")


def _check_tensors(tensors: list, tensor_names: dict[str, str], config: dict, source: Path) -> None:
    """Fail before any dequantizing: every tensor present, of the right shape and a supported type."""
    try:
        expected = weight_shapes(ModelConfig.from_dict(config, source=f"{source} (its config)"))
    except ConfigError as error:
        raise GGUFError(str(error)) from None
    missing = sorted(set(expected) - set(tensor_names.values()))
    if missing:
        raise GGUFError(f"{source}: missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    for tensor in tensors:
        name = tensor_names[tensor.name]
        shape = tuple(int(n) for n in reversed(tensor.shape))
        if name not in expected:
            layers = config["num_hidden_layers"]
            raise GGUFError(f"{source}: tensor {tensor.name!r} ({name}) is beyond the model's {layers} layers")
        if shape != expected[name]:
            raise GGUFError(
                f"{source}: tensor {tensor.name!r} has shape {list(shape)}, expected {list(expected[name])}"
            )
        if tensor.tensor_type not in SUPPORTED_TYPES:
            supported = ", ".join(t.name for t in SUPPORTED_TYPES)
            raise GGUFError(
                f"{source}: tensor {tensor.name!r} is stored as {tensor.tensor_type.name}, "
                f"which tinyvllm cannot dequantize (supported: {supported})"
            )


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
