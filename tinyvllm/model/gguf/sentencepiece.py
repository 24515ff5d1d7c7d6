"""A SentencePiece vocabulary from a GGUF (`tokenizer.ggml.model == "llama"`) as a `tokenizers` BPE.

Llama 2, TinyLlama and Mistral ship SentencePiece BPE models. Their GGUF keeps the pieces
(`tokenizer.ggml.tokens`, "▁" standing for a space), a score per piece (`tokenizer.ggml.scores`,
higher merges first) and a type per piece (1 normal, 2 unknown, 3 control such as `<s>`,
6 byte: `<0x00>` ... `<0xFF>`), but no merge list. SentencePiece BPE merges the adjacent pair
whose concatenation is the best-scoring piece, so the merges are rebuilt from the scores:
every normal piece split into two pieces that are themselves in the vocabulary is a merge,
ranked by the whole piece's score. Text no piece covers falls back to its UTF-8 bytes as byte
tokens. A space is prepended to the text (`tokenizer.ggml.add_space_prefix`, default true) and
every space becomes "▁", as SentencePiece's normalizer does; decoding reverses both.
"""

from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from tinyvllm.model.gguf.format import GGUFError, require

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
SPACE = "\u2581"


def sentencepiece_merges(tokens: list[str], scores: list[float], token_types: list[int]) -> list[tuple[str, str]]:
    """Merges implied by SentencePiece BPE scores: splits of each normal piece, best-scoring piece first."""
    vocab = {token: index for index, token in enumerate(tokens)}
    candidates = []
    for token, score, kind in zip(tokens, scores, token_types):
        if kind != NORMAL:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                candidates.append((-score, vocab[left], vocab[right], left, right))
    candidates.sort()
    return [(left, right) for _, _, _, left, right in candidates]


def build_sentencepiece_tokenizer(metadata: dict, source: Path | str = "GGUF") -> Tokenizer:
    """The BPE tokenizer with byte fallback that a GGUF's SentencePiece vocabulary describes."""
    tokens = require(metadata, "tokenizer.ggml.tokens", source)
    scores = require(metadata, "tokenizer.ggml.scores", source)
    token_types = metadata.get("tokenizer.ggml.token_type", [NORMAL] * len(tokens))
    if not (len(tokens) == len(scores) == len(token_types)):
        raise GGUFError(
            f"{source}: tokenizer.ggml.tokens, .scores and .token_type have different lengths "
            f"({len(tokens)}, {len(scores)}, {len(token_types)})"
        )
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFError(f"{source}: tokenizer.ggml.tokens holds duplicates")
    unknown_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unknown = tokens[unknown_id] if isinstance(unknown_id, int) and 0 <= unknown_id < len(tokens) else None
    merges = sentencepiece_merges(tokens, scores, token_types)
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token=unknown, fuse_unk=True, byte_fallback=True))
    add_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPACE, prepend_scheme="first" if add_prefix else "never", split=False
    )
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tokenizer.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if add_prefix else []))
    typed = list(zip(tokens, token_types))
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, kind in typed if kind == CONTROL]
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t, kind in typed if kind == USER_DEFINED])
    return tokenizer
