"""Logprobs in OpenAI's two response shapes, from a completion's vLLM-shaped entries
(`CompletionOutput.logprobs`: one {token id: Logprob} dict per generated token, its top
tokens first, then the sampled one when it is not among them).

Both take `start`, the first token to include, so that a stream chunk carries the
logprobs of the tokens since the chunk before, as its text delta carries their text.
`prompt_logprobs` is vLLM's extra field, the same in both APIs.
"""

from dataclasses import asdict

from tinyvllm.engine.sequence import CompletionOutput, Logprob, RequestOutput


def _sampled(completion: CompletionOutput, start: int) -> list[tuple[Logprob, dict[int, Logprob]]]:
    """(the sampled token's Logprob, its whole entry) of each generated token from `start` on."""
    return [(entry[token], entry) for token, entry in zip(completion.token_ids[start:], completion.logprobs[start:])]


LegacyRow = tuple[str, float | None, dict[str, float] | None]
"""One token in /v1/completions' legacy lists: its text, its logprob and {text: logprob} of its
entry (both None for a prompt's first token, which has no logprob)."""


def legacy_row(entry: dict[int, Logprob], token: int) -> LegacyRow:
    """The row of `token`, whose entry (vLLM's {token id: Logprob}) is `entry`."""
    sampled = entry[token]
    return (
        sampled.decoded_token,
        sampled.logprob,
        {logprob.decoded_token: logprob.logprob for logprob in entry.values()},
    )


def completion_rows(completion: CompletionOutput) -> list[LegacyRow]:
    return [legacy_row(entry, token) for token, entry in zip(completion.token_ids, completion.logprobs)]


def legacy_logprobs(rows: list[LegacyRow], start: int = 0) -> dict:
    """The legacy lists of rows[start:]: texts, logprobs, top dicts, and where each text starts
    in the text all the rows' tokens make laid end to end."""
    offset = sum(len(text) for text, _, _ in rows[:start])
    text_offset = []
    for text, _, _ in rows[start:]:
        text_offset.append(offset)
        offset += len(text)
    return {
        "tokens": [text for text, _, _ in rows[start:]],
        "token_logprobs": [logprob for _, logprob, _ in rows[start:]],
        "top_logprobs": [top for _, _, top in rows[start:]],
        "text_offset": text_offset,
    }


def completion_logprobs(completion: CompletionOutput, start: int, top: int) -> dict | None:
    """/v1/completions' legacy lists for the generated tokens from `start` on; None without
    logprobs. `top` is the chat shape's; here each dict holds the token's whole entry, as vLLM's does."""
    if completion.logprobs is None:
        return None
    return legacy_logprobs(completion_rows(completion), start)


def _chat_token(logprob: Logprob) -> dict:
    return {"token": logprob.decoded_token, "logprob": logprob.logprob, "bytes": list(logprob.decoded_token.encode())}


def chat_logprobs(completion: CompletionOutput, start: int, top: int) -> dict | None:
    """/v1/chat/completions' {"content": [...]} for the tokens from `start` on: each token,
    its logprob and UTF-8 bytes, and its `top` most likely alternatives; None without logprobs."""
    if completion.logprobs is None:
        return None
    content = [
        {**_chat_token(sampled), "top_logprobs": [_chat_token(logprob) for logprob in list(entry.values())[:top]]}
        for sampled, entry in _sampled(completion, start)
    ]
    return {"content": content}


def prompt_logprobs(output: RequestOutput) -> list[dict | None] | None:
    """vLLM's `prompt_logprobs`: per prompt token, None for the first, then {token id: {logprob,
    rank, decoded_token}} of the token and the most likely ones; None when not asked for."""
    if output.prompt_logprobs is None:
        return None
    return [
        None if entry is None else {str(token): asdict(logprob) for token, logprob in entry.items()}
        for entry in output.prompt_logprobs
    ]
