"""SentencePiece (`tokenizer.ggml.model == "llama"`) vocabularies, as TinyLlama's and Llama 2's GGUFs hold them.

Oracle: transformers' own GGUF tokenizer (LlamaTokenizer from the file's pieces and scores)."""

import pytest

from tests.gguf_files import write_llama_gguf
from tinyvllm.model.gguf.convert import convert_gguf
from tinyvllm.model.gguf.sentencepiece import (
    BYTE,
    CONTROL,
    NORMAL,
    UNKNOWN,
    sentencepiece_merges,
)
from tinyvllm.model.tokenizer import Tokenizer

# Pieces best first, as SentencePiece scores them; "▁" is a space.
PIECES = [
    "▁t",
    "he",
    "▁the",
    "ll",
    "▁h",
    "llo",
    "▁he",
    "▁hello",
    "or",
    "▁w",
    "ld",
    "▁wor",
    "▁world",
    "▁a",
    "in",
    "▁in",
    "12",
    "▁",
    "h",
    "e",
    "l",
    "o",
    "t",
    "w",
    "r",
    "d",
    "a",
    "i",
    "n",
    "1",
    "2",
    "ü",
    ",",
]
TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{byte:02X}>" for byte in range(256)] + PIECES
TYPES = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256 + [NORMAL] * len(PIECES)
SCORES = [0.0] * 259 + [-float(rank) for rank in range(len(PIECES))]
SPM_METADATA = {
    "tokenizer.ggml.model": "llama",
    "tokenizer.ggml.tokens": TOKENS,
    "tokenizer.ggml.token_type": TYPES,
    "tokenizer.ggml.scores": SCORES,
    "tokenizer.ggml.unknown_token_id": 0,
    "tokenizer.ggml.bos_token_id": 1,
    "tokenizer.ggml.eos_token_id": 2,
}
TEXTS = [
    "hello world",
    "the hello, in a world",
    "  two leading spaces and trailing ",
    "bytes: ü fits, é and 🤖 fall back to <0x..> tokens",
    "<s>hello</s> world",
    "line one\nline two\t12 1212",
]


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    root = tmp_path_factory.mktemp("spm")
    write_llama_gguf(
        root / "spm.gguf",
        metadata=SPM_METADATA,
        drop=("tokenizer.ggml.merges", "tokenizer.ggml.pre", "tokenizer.ggml.add_bos_token"),
    )
    return root, convert_gguf(root / "spm.gguf", root / "hf", progress=False)


def test_merges_follow_the_scores():
    merges = sentencepiece_merges(TOKENS, SCORES, TYPES)
    assert merges[:4] == [("▁", "t"), ("h", "e"), ("▁t", "he"), ("l", "l")]  # "▁the": only "▁t" + "he" are pieces
    assert all(left + right in TOKENS for left, right in merges)
    assert not any(left.startswith("<0x") for left, _ in merges)


def test_encodes_like_transformers_gguf_tokenizer(spm):
    from transformers import AutoTokenizer

    root, out = spm
    reference = AutoTokenizer.from_pretrained(root, gguf_file="spm.gguf")
    ours = AutoTokenizer.from_pretrained(out)
    engine = Tokenizer.from_dir(out)
    for text in TEXTS:
        expected = reference(text)["input_ids"]
        assert ours(text)["input_ids"] == expected, text
        assert expected[0] == 1  # BOS: llama.cpp's default for a SentencePiece file without add_bos_token
        assert engine.decode(expected, skip_special_tokens=True) == reference.decode(expected, skip_special_tokens=True)
    assert "<0xF0>" in ours.convert_ids_to_tokens(ours("🤖")["input_ids"])  # byte fallback, not <unk>
    assert ours.convert_ids_to_tokens(ours("hello world")["input_ids"]) == ["<s>", "▁hello", "▁world"]
