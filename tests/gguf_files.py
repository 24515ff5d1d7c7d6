"""Tiny Llama GGUF files as llama.cpp's converter writes them, for the GGUF import tests.

`write_llama_gguf` writes one with `gguf.GGUFWriter`: metadata for a byte-level BPE vocabulary
(`TOKENS`, `MERGES`) and a chat template, random weights in HF orientation whose Q/K rows are
permuted by `llamacpp_permute` (llama.cpp's own permutation, as in convert_hf_to_gguf.py), each
stored as the type `types` gives its role.
"""

import numpy as np
from gguf import GGMLQuantizationType as GGMLType
from gguf import GGUFWriter
from tokenizers.pre_tokenizers import ByteLevel

from tests.test_gguf_quants import quantize_or_random
from tinyvllm.model.gguf.tokenizer import CONTROL

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BYTES = sorted(ByteLevel.alphabet())
MERGES = ["Ġ t", "h e", "Ġt he", "l l", "ll o", "1 2"]
TOKENS = SPECIALS + BYTES + ["Ġt", "he", "Ġthe", "ll", "llo", "12"]
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"

TINY = {"hidden": 64, "heads": 4, "kv_heads": 2, "layers": 2, "intermediate": 96}
# One type per role, so every supported format appears in one file.
MIXED_TYPES = {
    "token_embd": GGMLType.Q8_0,
    "attn_q": GGMLType.Q4_0,
    "attn_k": GGMLType.Q4_1,
    "attn_v": GGMLType.F16,
    "attn_output": GGMLType.Q8_0,
    "ffn_gate": GGMLType.Q4_1,
    "ffn_up": GGMLType.BF16,
    "ffn_down": GGMLType.Q4_0,
    "output": GGMLType.Q8_0,
}


def llamacpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF rotate-half rows -> adjacent RoPE pairs."""
    return (
        weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def llama_metadata(hidden, heads, kv_heads, layers, intermediate) -> dict:
    return {
        "llama.block_count": layers,
        "llama.context_length": 256,
        "llama.embedding_length": hidden,
        "llama.feed_forward_length": intermediate,
        "llama.attention.head_count": heads,
        "llama.attention.head_count_kv": kv_heads,
        "llama.rope.freq_base": 10000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.dimension_count": hidden // heads,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": TOKENS,
        "tokenizer.ggml.token_type": [CONTROL] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)),
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }


def _hf_weights(rng, hidden, heads, kv_heads, layers, intermediate, tied, vocab) -> dict[str, np.ndarray]:
    """Random float32 weights by GGUF name, in HF orientation ([out, in]) and HF Q/K row order."""
    head_dim = hidden // heads
    shapes = {"token_embd": (vocab, hidden), "output_norm": (hidden,)}
    if not tied:
        shapes["output"] = (vocab, hidden)
    for i in range(layers):
        shapes |= {
            f"blk.{i}.attn_norm": (hidden,),
            f"blk.{i}.attn_q": (heads * head_dim, hidden),
            f"blk.{i}.attn_k": (kv_heads * head_dim, hidden),
            f"blk.{i}.attn_v": (kv_heads * head_dim, hidden),
            f"blk.{i}.attn_output": (hidden, heads * head_dim),
            f"blk.{i}.ffn_norm": (hidden,),
            f"blk.{i}.ffn_gate": (intermediate, hidden),
            f"blk.{i}.ffn_up": (intermediate, hidden),
            f"blk.{i}.ffn_down": (hidden, intermediate),
        }
    return {
        name: (1 + 0.1 * rng.standard_normal(shape) if len(shape) == 1 else 0.1 * rng.standard_normal(shape)).astype(
            np.float32
        )
        for name, shape in shapes.items()
    }


def write_llama_gguf(path, *, types=MIXED_TYPES, tied=False, metadata=None, drop=(), seed=0, sizes=TINY):
    """A tiny Llama GGUF as llama.cpp's converter writes one; returns {GGUF name: (HF float32, type, stored)}."""
    rng = np.random.default_rng(seed)
    meta = llama_metadata(**sizes) | (metadata or {})
    writer = GGUFWriter(str(path), "llama")
    for key, value in meta.items():
        if key in drop:
            continue
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, value)
    written = {}
    for name, weight in _hf_weights(rng, **sizes, tied=tied, vocab=len(meta["tokenizer.ggml.tokens"])).items():
        role = name.split(".")[-1]
        gguf_layout = weight
        if role == "attn_q":
            gguf_layout = llamacpp_permute(weight, sizes["heads"])
        elif role == "attn_k":
            gguf_layout = llamacpp_permute(weight, sizes["kv_heads"])
        tensor_type = GGMLType.F32 if weight.ndim == 1 else types.get(role, GGMLType.F32)
        stored = quantize_or_random(rng, gguf_layout, tensor_type)
        writer.add_tensor(f"{name}.weight", stored, raw_dtype=tensor_type)
        written[name] = (weight, tensor_type, stored)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written
