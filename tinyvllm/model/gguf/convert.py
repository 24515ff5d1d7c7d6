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

Only the `llama` architecture without RoPE scaling is converted; anything else is refused
with a `GGUFError` naming the file and what it lacks.
"""

import json
import re
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from tqdm import tqdm

from tinyvllm.model.config import ModelConfig
from tinyvllm.model.gguf.format import (
    SUPPORTED_TYPES,
    GGUFError,
    dequantize_to_bf16,
    read_metadata,
    require,
)
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
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, progress: bool = True) -> Path:
    """Convert a llama-architecture GGUF into an HF model directory at `out_dir` (created)."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = GGUFReader(gguf_path)
    metadata = read_metadata(reader)
    tensor_names = {tensor.name: hf_tensor_name(tensor.name, gguf_path) for tensor in reader.tensors}
    config = llama_config(metadata, tied="output.weight" not in tensor_names, source=gguf_path)
    _check_tensors(reader, tensor_names, config, gguf_path)
    tokenizer = build_tokenizer(metadata, source=gguf_path)

    tensors = {}
    for tensor in tqdm(reader.tensors, desc=f"converting {gguf_path.name}", unit="tensor", disable=not progress):
        weight = dequantize_to_bf16(tensor.data, tensor.tensor_type)
        if tensor.name.endswith(".attn_q.weight"):
            weight = undo_rope_permutation(weight, config["num_attention_heads"])
        elif tensor.name.endswith(".attn_k.weight"):
            weight = undo_rope_permutation(weight, config["num_key_value_heads"])
        tensors[tensor_names[tensor.name]] = weight

    out_dir.mkdir(parents=True, exist_ok=True)
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", _generation_config(config))
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config(metadata, config["max_position_embeddings"]))
    tokenizer.save(str(out_dir / "tokenizer.json"))
    save_safetensors(out_dir / "model.safetensors", tensors)
    return out_dir


def hf_tensor_name(gguf_name: str, source: Path | str = "GGUF") -> str:
    """`blk.3.ffn_up.weight` -> `model.layers.3.mlp.up_proj.weight`."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name == "rope_freqs.weight":
        raise GGUFError(f"{source}: RoPE frequency factors (rope_freqs, Llama 3.1+ RoPE scaling) are not supported")
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


def llama_config(metadata: dict, tied: bool, source: Path | str = "GGUF") -> dict:
    """The HF `config.json` of a LlamaForCausalLM described by `llama.*` and `tokenizer.ggml.*` keys."""
    architecture = require(metadata, "general.architecture", source)
    if architecture != ARCHITECTURE:
        raise GGUFError(f"{source}: architecture {architecture!r} is not supported (only {ARCHITECTURE!r})")
    scaling = metadata.get("llama.rope.scaling.type", "none")
    if scaling != "none":
        raise GGUFError(f"{source}: RoPE scaling {scaling!r} (llama.rope.scaling.type) is not supported")

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
        "rope_theta": _shortest(metadata.get("llama.rope.freq_base", DEFAULT_ROPE_THETA)),
        "rope_scaling": None,
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


def _check_tensors(reader: GGUFReader, tensor_names: dict[str, str], config: dict, source: Path) -> None:
    """Fail before any dequantizing: every tensor present, of the right shape and a supported type."""
    expected = weight_shapes(ModelConfig.from_dict(config, source=f"{source} (its config)"))
    missing = sorted(set(expected) - set(tensor_names.values()))
    if missing:
        raise GGUFError(f"{source}: missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    for tensor in reader.tensors:
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
