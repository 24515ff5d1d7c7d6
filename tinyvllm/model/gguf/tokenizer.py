"""A GGUF's vocabulary -> `tokenizer.json` and `tokenizer_config.json`.

A GGUF carries no tokenizer.json, only its parts: `tokenizer.ggml.tokens` (the vocabulary,
id = position), `tokenizer.ggml.merges` ("a b" strings, best first), `tokenizer.ggml.token_type`
(3 = control, e.g. `<|im_end|>`; 4 = user-defined) and `tokenizer.ggml.pre`, the name llama.cpp
gives the way text is split into words before BPE runs. We rebuild the HF tokenizer for
GPT-2-style byte-level BPE vocabularies (`tokenizer.ggml.model == "gpt2"`):

    pre ("tokenizer.ggml.pre")   split into words                           BPE
    gpt-2                        GPT-2's regex (ByteLevel)                  merges
    smollm                       each digit alone, then GPT-2's regex       merges
    llama-bpe                    Llama 3's regex (\\p{N}{1,3} numbers ...)  whole-word vocab hits, then merges

Other pre-tokenizers are refused rather than guessed: a wrong split gives plausible but
different token ids. SentencePiece vocabularies (`"llama"`: Llama 2, Mistral, TinyLlama) are
rebuilt by `tinyvllm.model.gguf.sentencepiece`. Control tokens become special added tokens (matched
whole, skipped when decoding with skip_special_tokens); user-defined ones plain added tokens.
"""

from pathlib import Path

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    processors,
)

from tinyvllm.model.gguf.format import GGUFError, require
from tinyvllm.model.gguf.sentencepiece import build_sentencepiece_tokenizer

CONTROL = 3
USER_DEFINED = 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2():
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _smollm():
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _llama3():
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


# tokenizer.ggml.pre -> (pre-tokenizer, BPE ignore_merges: a word found whole in the vocab is one token)
PRE_TOKENIZERS = {
    "gpt-2": (_gpt2, False),
    "smollm": (_smollm, False),
    "llama-bpe": (_llama3, True),
}


def build_tokenizer(metadata: dict, source: Path | str = "GGUF") -> Tokenizer:
    """The HF fast tokenizer a GGUF's `tokenizer.ggml.*` metadata describes."""
    model = require(metadata, "tokenizer.ggml.model", source)
    if model == "llama":
        tokenizer = build_sentencepiece_tokenizer(metadata, source)
        tokenizer.post_processor = _post_processor(metadata, metadata["tokenizer.ggml.tokens"])
        return tokenizer
    if model != "gpt2":
        raise GGUFError(
            f"{source}: tokenizer.ggml.model {model!r} is not supported "
            "(only 'gpt2', byte-level BPE, and 'llama', SentencePiece)"
        )
    pre = require(metadata, "tokenizer.ggml.pre", source)
    if pre not in PRE_TOKENIZERS:
        supported = ", ".join(PRE_TOKENIZERS)
        raise GGUFError(
            f"{source}: pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported (supported: {supported})"
        )
    make_pre_tokenizer, ignore_merges = PRE_TOKENIZERS[pre]

    tokens = require(metadata, "tokenizer.ggml.tokens", source)
    merges = [tuple(merge.split(" ")) for merge in require(metadata, "tokenizer.ggml.merges", source)]
    if any(len(merge) != 2 for merge in merges):
        raise GGUFError(f"{source}: tokenizer.ggml.merges holds an entry that is not two tokens")
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFError(f"{source}: tokenizer.ggml.tokens holds duplicates")
    # Checked here: tokenizers reports a merge of unknown tokens only as a bare Exception.
    unknown = next((merge for merge in merges if any(part not in vocab for part in (*merge, "".join(merge)))), None)
    if unknown is not None:
        raise GGUFError(f"{source}: tokenizer.ggml.merges holds {' '.join(unknown)!r}, which the vocabulary lacks")
    tokenizer = Tokenizer(models.BPE(vocab, merges, ignore_merges=ignore_merges))
    tokenizer.pre_tokenizer = make_pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()

    typed = list(zip(tokens, metadata.get("tokenizer.ggml.token_type", [])))
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token, kind in typed if kind == CONTROL]
    )
    tokenizer.add_tokens(
        [AddedToken(token, special=False, normalized=False) for token, kind in typed if kind == USER_DEFINED]
    )
    tokenizer.post_processor = _post_processor(metadata, tokens)
    return tokenizer


def adds_token(metadata: dict, key: str) -> bool:
    """Whether encoding adds BOS (key "bos") or EOS ("eos"): the file's flag, else llama.cpp's default,
    which adds BOS to a SentencePiece vocabulary and nothing else."""
    default = key == "bos" and metadata.get("tokenizer.ggml.model") == "llama"
    return bool(metadata.get(f"tokenizer.ggml.add_{key}_token", default))


def _post_processor(metadata: dict, tokens: list[str]) -> processors.TemplateProcessing | None:
    """BOS/EOS added around encoded text when the file says so (Llama 3: BOS; SmolLM2: neither)."""
    added = {}
    for key in ("bos", "eos"):
        token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if adds_token(metadata, key) and token_id is not None:
            added[key] = tokens[token_id], token_id
    if not added:
        return None

    def template(sequence: str, type_id: int) -> list[str]:
        before = [f"{added['bos'][0]}:{type_id}"] if "bos" in added else []
        after = [f"{added['eos'][0]}:{type_id}"] if "eos" in added else []
        return before + [f"${sequence}:{type_id}"] + after

    return processors.TemplateProcessing(
        single=template("A", 0), pair=template("A", 0) + template("B", 1), special_tokens=list(added.values())
    )


def tokenizer_config(metadata: dict, model_max_length: int) -> dict:
    """`tokenizer_config.json`: special tokens by name, the chat template, BOS/EOS flags."""
    tokens = metadata["tokenizer.ggml.tokens"]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
    for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding")):
        token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            config[name] = tokens[token_id]
    config["add_bos_token"] = adds_token(metadata, "bos")
    config["add_eos_token"] = adds_token(metadata, "eos")
    if "tokenizer.chat_template" in metadata:
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return config
