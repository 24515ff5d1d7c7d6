"""A Llama-3.2-shaped GGUF (tiny dims, K-quant weights, rope_freqs, the Llama 3 tokenizer's
pre-tokenizer, special tokens and chat template) as llama.cpp's converter writes one.

Oracles: transformers' own GGUF loader (its dequantizer, Q/K un-permutation and tokenizer),
given the llama3 rope_scaling by hand since it ignores rope_freqs; and the rope_freqs as
convert_hf_to_gguf.py computes them (`_converter_rope_freqs`, torch float32 like the converter).
"""

import json
import math

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GGMLType
from gguf import GGUFWriter
from tokenizers.pre_tokenizers import ByteLevel

from tests.gguf_files import llamacpp_permute
from tests.helpers import next_token_logits
from tests.test_gguf_quants import quantize_or_random
from tests.test_reference_forward import _assert_logits_close, _hf_logits
from tinyvllm import LLM
from tinyvllm.kernels.reference import to_bf16
from tinyvllm.model.gguf.convert import GGUFError, convert_gguf
from tinyvllm.model.gguf.tokenizer import CONTROL
from tinyvllm.model.weights import read_safetensors

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "l l", "ll o", "Ċ Ċ", "u s", "e r", "us er", "1 2", "12 3"]
TOKENS = (
    sorted(ByteLevel.alphabet()) + ["Ġt", "he", "Ġthe", "ll", "llo", "ĊĊ", "us", "er", "user", "12", "123"] + SPECIALS
)
BOS, EOT = TOKENS.index("<|begin_of_text|>"), TOKENS.index("<|eot_id|>")
CHAT_TEMPLATE = (  # Llama 3's template, without the system-date preamble of 3.1+
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# K-quant rows are 256 values: hidden and intermediate sizes are multiples of 256.
HIDDEN, HEADS, KV_HEADS, LAYERS, INTERMEDIATE, THETA = 256, 4, 2, 2, 256, 500000.0
HEAD_DIM = HIDDEN // HEADS
LLAMA3_SCALING = {
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
TYPES = {  # a Q4_K_M-like mix, with every other new type somewhere
    "token_embd": GGMLType.Q6_K,
    "attn_q": GGMLType.Q4_K,
    "attn_k": GGMLType.Q5_K,
    "attn_v": GGMLType.Q6_K,
    "attn_output": GGMLType.Q3_K,
    "ffn_gate": GGMLType.Q2_K,
    "ffn_up": GGMLType.Q5_1,
    "ffn_down": GGMLType.Q5_0,
}


def _converter_rope_freqs(scaling: dict, head_dim: int = HEAD_DIM, theta: float = THETA) -> np.ndarray:
    """LlamaModel.generate_extra_tensors of llama.cpp's convert_hf_to_gguf.py, line for line."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    rope_factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            rope_factors.append(1)
        elif wavelen > low_freq_wavelen:
            rope_factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            rope_factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(rope_factors, dtype=torch.float32).numpy()


def write_llama3_gguf(path, rope_freqs: np.ndarray | None, metadata: dict | None = None, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), "llama")
    for key, value in {
        "llama.block_count": LAYERS,
        "llama.context_length": 131072,
        "llama.embedding_length": HIDDEN,
        "llama.feed_forward_length": INTERMEDIATE,
        "llama.attention.head_count": HEADS,
        "llama.attention.head_count_kv": KV_HEADS,
        "llama.rope.dimension_count": HEAD_DIM,
        "tokenizer.ggml.bos_token_id": BOS,
        "tokenizer.ggml.eos_token_id": EOT,
        "tokenizer.ggml.eot_token_id": EOT,
    }.items():
        writer.add_uint32(key, value)
    writer.add_float32("llama.rope.freq_base", THETA)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_string("tokenizer.ggml.pre", "llama-bpe")
    writer.add_array("tokenizer.ggml.tokens", TOKENS)
    writer.add_array("tokenizer.ggml.token_type", [CONTROL if t in SPECIALS else 1 for t in TOKENS])
    writer.add_array("tokenizer.ggml.merges", MERGES)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_string("tokenizer.chat_template", CHAT_TEMPLATE)
    for key, value in (metadata or {}).items():
        writer.add_uint32(key, value) if isinstance(value, int) else writer.add_float32(key, value)

    shapes = {"token_embd": (len(TOKENS), HIDDEN), "output_norm": (HIDDEN,)}  # tied, as Llama 3.2 1B/3B
    for i in range(LAYERS):
        shapes |= {
            f"blk.{i}.attn_norm": (HIDDEN,),
            f"blk.{i}.ffn_norm": (HIDDEN,),
            f"blk.{i}.attn_q": (HIDDEN, HIDDEN),
            f"blk.{i}.attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
            f"blk.{i}.attn_v": (KV_HEADS * HEAD_DIM, HIDDEN),
            f"blk.{i}.attn_output": (HIDDEN, HIDDEN),
            f"blk.{i}.ffn_gate": (INTERMEDIATE, HIDDEN),
            f"blk.{i}.ffn_up": (INTERMEDIATE, HIDDEN),
            f"blk.{i}.ffn_down": (HIDDEN, INTERMEDIATE),
        }
    for name, shape in shapes.items():
        role = name.split(".")[-1]
        if len(shape) == 1:
            writer.add_tensor(f"{name}.weight", (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
            continue
        heads = {"attn_q": HEADS, "attn_k": KV_HEADS}.get(role)
        values = (0.05 * rng.standard_normal(shape)).astype(np.float32)
        values = llamacpp_permute(values, heads) if heads else values  # irrelevant for random blocks, kept for Q5
        writer.add_tensor(f"{name}.weight", quantize_or_random(rng, values, TYPES[role]), raw_dtype=TYPES[role])
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    """(directory holding the GGUF, its name, our converted directory)."""
    root = tmp_path_factory.mktemp("llama3")
    write_llama3_gguf(root / "llama3.gguf", _converter_rope_freqs(LLAMA3_SCALING))
    return root, "llama3.gguf", convert_gguf(root / "llama3.gguf", root / "hf", progress=False)


def _transformers_reference(root, name, rope_scaling: dict | None):
    """transformers' model from the GGUF, weights rounded to bf16 (as ours are), with `rope_scaling` set by hand."""
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(root, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    config.rope_parameters = {"rope_type": "default", "rope_theta": THETA} | (
        {"rope_type": "llama3", **rope_scaling} if rope_scaling else {}
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.load_state_dict({key: value.to(torch.bfloat16).float() for key, value in loaded.state_dict().items()})
    return model


def test_config_has_the_llama3_scaling(llama3):
    _, _, out = llama3
    config = json.loads((out / "config.json").read_text())
    assert config["rope_scaling"] == {"rope_type": "llama3", **LLAMA3_SCALING}
    assert config["rope_theta"] == THETA and config["tie_word_embeddings"] is True
    assert config["eos_token_id"] == EOT and config["bos_token_id"] == BOS
    assert not any("rope" in name for name in read_safetensors(out / "model.safetensors"))  # a config value, no weight


def test_logits_match_transformers_gguf_loader(llama3):
    root, name, out = llama3
    reference = _transformers_reference(root, name, LLAMA3_SCALING)
    unscaled = _transformers_reference(root, name, None)
    llm = LLM(out, backend="numpy", activation_dtype="float32", max_model_len=256)
    messages = [{"role": "user", "content": "hello the user 123"}]
    prompt_ids = llm.tokenizer.encode_chat(messages)
    ours = next_token_logits(llm, prompt_ids)
    _assert_logits_close(ours, _hf_logits(reference, prompt_ids))
    # The scaling must matter here, or this test could not tell a missing rope_scaling apart.
    assert (
        np.abs(ours - _hf_logits(unscaled, prompt_ids)).max()
        > 10 * np.abs(ours - _hf_logits(reference, prompt_ids)).max()
    )


def test_weights_match_transformers_gguf_loader(llama3):
    """Every K-quant and Q5 tensor, Q/K rows un-permuted, equals transformers' reading of the GGUF (to bf16)."""
    root, name, out = llama3
    ours = read_safetensors(out / "model.safetensors")
    reference = _transformers_reference(root, name, LLAMA3_SCALING).state_dict()
    assert set(ours) == set(reference) - {"lm_head.weight"}  # tied
    for key, ours_bits in ours.items():
        np.testing.assert_array_equal(ours_bits, to_bf16(reference[key].numpy()), err_msg=key)


def test_chat_tokenizes_like_transformers_gguf_tokenizer(llama3):
    from transformers import AutoTokenizer

    root, name, out = llama3
    ours, reference = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(root, gguf_file=name)
    messages = [{"role": "user", "content": "hello the user 123\n\n12"}]
    expected = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False) == expected
    assert expected[:2] == [BOS, TOKENS.index("<|start_header_id|>")] and TOKENS.index("123") in expected
    assert ours("hello")["input_ids"][0] == BOS


def test_original_context_length_key_is_honoured(tmp_path):
    scaling = LLAMA3_SCALING | {"factor": 8.0, "original_max_position_embeddings": 2048}
    write_llama3_gguf(
        tmp_path / "c.gguf", _converter_rope_freqs(scaling), {"llama.rope.scaling.original_context_length": 2048}
    )
    out = convert_gguf(tmp_path / "c.gguf", tmp_path / "hf", progress=False)
    assert json.loads((out / "config.json").read_text())["rope_scaling"] == {"rope_type": "llama3", **scaling}


@pytest.mark.parametrize(
    "scaling, metadata",
    [
        (LLAMA3_SCALING | {"original_max_position_embeddings": 4096}, {}),  # freqs of another context, none stated
        (LLAMA3_SCALING | {"high_freq_factor": 2.0}, {}),
        (LLAMA3_SCALING, {"llama.rope.scaling.factor": 16.0}),  # the file's factor key disagrees with its freqs
    ],
)
def test_disagreeing_rope_freqs_are_refused(tmp_path, scaling, metadata):
    write_llama3_gguf(tmp_path / "bad.gguf", _converter_rope_freqs(scaling), metadata)
    with pytest.raises(GGUFError, match=r"bad\.gguf: rope_freqs\.weight disagrees with llama3 RoPE scaling"):
        convert_gguf(tmp_path / "bad.gguf", tmp_path / "hf", progress=False)
    assert not (tmp_path / "hf").exists()
