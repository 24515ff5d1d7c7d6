"""GGUF import on synthetic files written with gguf.GGUFWriter (tests/gguf_files.py).

Oracles: `gguf.quants` (llama.cpp's own Python quantizers and dequantizers), llama.cpp's
Q/K row permutation (`llamacpp_permute`, as in convert_hf_to_gguf.py), transformers'
GGUF loader, and the Llama 3.2 tokenizer.json for the `llama-bpe` pre-tokenizer.
"""

import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GGMLType
from gguf import quants as gguf_quants
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer

from tests.gguf_files import MIXED_TYPES, TINY, TOKENS, llama_metadata, llamacpp_permute, write_llama_gguf
from tests.test_gguf_quants import random_blocks
from tinyvllm.kernels.reference import to_bf16
from tinyvllm.model import hub
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.gguf import format as gguf_format
from tinyvllm.model.gguf.convert import (
    GGUFError,
    convert_gguf,
    hf_tensor_name,
    undo_rope_permutation,
)
from tinyvllm.model.gguf.format import dequantize, dequantize_to_bf16
from tinyvllm.model.gguf.tokenizer import CONTROL, build_tokenizer
from tinyvllm.model.weights import load_weights, read_safetensors

BLOCK_TYPES = [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1]
BLOCK_BYTES = {GGMLType.Q8_0: 34, GGMLType.Q4_0: 18, GGMLType.Q4_1: 20}


# Dequantization -------------------------------------------------------------------------


@given(
    tensor_type=st.sampled_from(BLOCK_TYPES),
    rows=st.integers(1, 5),
    blocks=st.integers(1, 4),
    log_scale=st.floats(-8, 8),
    seed=st.integers(0, 2**32 - 1),
)
def test_dequantize_matches_gguf_quants(tensor_type, rows, blocks, log_scale, seed):
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal((rows, 32 * blocks)) * 2.0**log_scale).astype(np.float32)
    stored = gguf_quants.quantize(values, tensor_type)
    np.testing.assert_array_equal(dequantize(stored, tensor_type), gguf_quants.dequantize(stored, tensor_type))


@given(
    tensor_type=st.sampled_from(BLOCK_TYPES),
    rows=st.integers(1, 4),
    blocks=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_dequantize_arbitrary_bytes_matches_gguf_quants(tensor_type, rows, blocks, seed):
    """Every bit pattern, not only what the quantizer writes: all nibbles, signs, odd scales, inf/nan."""
    stored = np.random.default_rng(seed).integers(0, 256, (rows, BLOCK_BYTES[tensor_type] * blocks), dtype=np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):
        np.testing.assert_array_equal(dequantize(stored, tensor_type), gguf_quants.dequantize(stored, tensor_type))


@pytest.mark.parametrize("tensor_type", [GGMLType.F32, GGMLType.F16, GGMLType.BF16])
def test_dequantize_float_types(tensor_type):
    values = np.random.default_rng(1).standard_normal((3, 40)).astype(np.float32)
    stored = gguf_quants.quantize(values, tensor_type)
    if tensor_type == GGMLType.BF16:  # the oracle widens bf16 bits itself
        expected = (stored.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        expected = gguf_quants.dequantize(stored, tensor_type)
    np.testing.assert_array_equal(dequantize(stored, tensor_type), expected)


@pytest.mark.parametrize("tensor_type", BLOCK_TYPES + [GGMLType.F16])
def test_dequantize_to_bf16_in_chunks_equals_whole(tensor_type, monkeypatch):
    values = np.random.default_rng(2).standard_normal((37, 64)).astype(np.float32)
    stored = gguf_quants.quantize(values, tensor_type)
    monkeypatch.setattr(gguf_format, "_CHUNK_ELEMENTS", 64 * 5)  # 5 rows a step: 8 steps, the last short
    np.testing.assert_array_equal(
        dequantize_to_bf16(stored, tensor_type), to_bf16(gguf_quants.dequantize(stored, tensor_type))
    )


def test_unsupported_block_type_is_refused_by_dequantize():
    stored = random_blocks(np.random.default_rng(0), (1, 32), GGMLType.IQ4_NL)
    with pytest.raises(GGUFError, match="IQ4_NL"):
        dequantize(stored, GGMLType.IQ4_NL)


# Q/K permutation ------------------------------------------------------------------------


@given(num_heads=st.integers(1, 6), half=st.integers(1, 8), columns=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_undo_rope_permutation_inverts_llamacpp(num_heads, half, columns, seed):
    weight = np.random.default_rng(seed).standard_normal((num_heads * 2 * half, columns))
    np.testing.assert_array_equal(undo_rope_permutation(llamacpp_permute(weight, num_heads), num_heads), weight)


# Whole conversion -----------------------------------------------------------------------


def _hf_name(gguf_name: str) -> str:
    return hf_tensor_name(f"{gguf_name}.weight")


@pytest.mark.parametrize("tied", [False, True])
def test_convert_restores_weights(tmp_path, tied):
    """Each tensor equals llama.cpp's dequantization, its Q/K rows back in HF order; F32 ones are the originals."""
    written = write_llama_gguf(tmp_path / "tiny.gguf", tied=tied)
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "hf", progress=False)
    tensors = read_safetensors(out / "model.safetensors")
    assert set(tensors) == {_hf_name(name) for name in written}
    config = json.loads((out / "config.json").read_text())
    for name, (original, tensor_type, stored) in written.items():
        ours = tensors[_hf_name(name)]
        assert ours.dtype == np.uint16 and ours.shape == original.shape
        expected = (
            to_bf16(gguf_quants.dequantize(stored, tensor_type))
            if tensor_type != GGMLType.BF16
            else stored.view(np.uint16)
        )
        if name.endswith("attn_q"):
            ours = llamacpp_permute(ours, config["num_attention_heads"])
        elif name.endswith("attn_k"):
            ours = llamacpp_permute(ours, config["num_key_value_heads"])
        np.testing.assert_array_equal(ours, expected, err_msg=name)
    assert config["tie_word_embeddings"] is tied


def test_convert_f32_round_trip_is_exact(tmp_path):
    """All-F32 file: the output is the HF weights themselves (rounded to bf16), Q/K permutation undone."""
    written = write_llama_gguf(tmp_path / "f32.gguf", types={})
    out = convert_gguf(tmp_path / "f32.gguf", tmp_path / "hf", progress=False)
    tensors = read_safetensors(out / "model.safetensors")
    for name, (original, _, _) in written.items():
        np.testing.assert_array_equal(tensors[_hf_name(name)], to_bf16(original), err_msg=name)


def test_converted_directory_loads_in_our_loaders_and_transformers(tmp_path):
    torch = pytest.importorskip("torch", reason="transformers, the oracle, needs torch (the ref extra)")
    pytest.importorskip("transformers", reason="transformers is the oracle (the ref extra)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    write_llama_gguf(tmp_path / "tiny.gguf")
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "hf", progress=False)
    config = ModelConfig.from_dir(out)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 16)
    assert (config.bos_token_id, config.eos_token_id, config.rms_norm_eps) == (1, (2,), 1e-5)
    ours = load_weights(out, config)

    # transformers reading the GGUF itself is an independent dequantizer, permutation and name map.
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32)
    for name, tensor in reference.state_dict().items():
        expected = to_bf16(tensor.numpy())
        np.testing.assert_array_equal(ours[name], expected, err_msg=name)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert model.config.num_key_value_heads == 2

    tokenizer = AutoTokenizer.from_pretrained(out)
    reference_tokenizer = AutoTokenizer.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    messages = [{"role": "user", "content": "hello there, the tell"}]
    ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
    assert ids == reference_tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
    assert ids[0] == TOKENS.index("<|im_start|>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhello there, the tell\n"


def test_unsupported_tensor_type_names_tensor_and_type(tmp_path):
    write_llama_gguf(tmp_path / "iq4.gguf", types=MIXED_TYPES | {"ffn_up": GGMLType.IQ4_NL})
    with pytest.raises(GGUFError, match=r"blk\.0\.ffn_up\.weight.*IQ4_NL"):
        convert_gguf(tmp_path / "iq4.gguf", tmp_path / "hf", progress=False)
    assert list(tmp_path.iterdir()) == [tmp_path / "iq4.gguf"]


def test_unknown_pre_tokenizer_is_refused(tmp_path):
    write_llama_gguf(tmp_path / "pre.gguf", metadata={"tokenizer.ggml.pre": "qwen2"})
    with pytest.raises(GGUFError, match="'qwen2'.*smollm"):
        convert_gguf(tmp_path / "pre.gguf", tmp_path / "hf", progress=False)


@pytest.mark.parametrize(
    "key", ["llama.attention.head_count", "llama.block_count", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.merges"]
)
def test_missing_metadata_is_named(tmp_path, key):
    write_llama_gguf(tmp_path / "missing.gguf", drop=(key,))
    with pytest.raises(GGUFError, match=key.replace(".", r"\.")):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "hf", progress=False)


def test_missing_tensor_is_named(tmp_path):
    write_llama_gguf(tmp_path / "short.gguf", metadata={"llama.block_count": 3})
    with pytest.raises(GGUFError, match=r"model\.layers\.2\."):
        convert_gguf(tmp_path / "short.gguf", tmp_path / "hf", progress=False)


# Tokenizers -----------------------------------------------------------------------------


def _vocab_metadata(pre: str) -> dict:
    return {key: value for key, value in llama_metadata(**TINY).items() if key.startswith("tokenizer.")} | {
        "tokenizer.ggml.pre": pre
    }


def test_smollm_splits_every_digit_gpt2_does_not():
    """llama.cpp's smollm pre-tokenizer isolates each \\p{N} before GPT-2's regex; the merge "1 2" never applies."""
    text = "x 12 hello the"
    smollm = build_tokenizer(_vocab_metadata("smollm")).encode(text).tokens
    gpt2 = build_tokenizer(_vocab_metadata("gpt-2")).encode(text).tokens
    assert smollm == ["x", "Ġ", "1", "2", "Ġ", "he", "llo", "Ġthe"]
    assert gpt2 == ["x", "Ġ", "12", "Ġ", "he", "llo", "Ġthe"]


@pytest.fixture(scope="module")
def llama3_tokenizer_json():
    return hub.fetch_llama3_2_tokenizer(hub.cache_dir())


LLAMA3_TEXTS = [
    "Hello, world! It's 2024-11-29 and π ≈ 3.14159.",
    "  leading spaces\n\n\ttabs and\r\nwindows newlines   ",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat's up?<|eot_id|>",
    "Ünïcödé: 東京都, Привет мир, مرحبا, 🤖🚀 emoji, don't WE'LL they've",
    "def f(x):\n    return x**2 + 1234567  # comment",
]


def test_llama_bpe_matches_the_llama_3_tokenizer(llama3_tokenizer_json):
    """Rebuild the Llama 3.2 tokenizer from its parts as a GGUF stores them: same ids as the original."""
    original = json.loads(llama3_tokenizer_json.read_text(encoding="utf-8"))
    vocab = original["model"]["vocab"] | {token["content"]: token["id"] for token in original["added_tokens"]}
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    assert len(tokens) == max(vocab.values()) + 1
    added = {token["id"] for token in original["added_tokens"]}
    metadata = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [CONTROL if index in added else 1 for index in range(len(tokens))],
        "tokenizer.ggml.merges": original["model"]["merges"],
        "tokenizer.ggml.bos_token_id": 128000,
        "tokenizer.ggml.add_bos_token": True,
    }
    ours = build_tokenizer(metadata)
    reference = Tokenizer.from_file(str(llama3_tokenizer_json))
    for text in LLAMA3_TEXTS:
        expected = reference.encode(text)
        assert ours.encode(text).ids == expected.ids, text
        assert ours.decode(expected.ids, skip_special_tokens=False) == reference.decode(
            expected.ids, skip_special_tokens=False
        )
