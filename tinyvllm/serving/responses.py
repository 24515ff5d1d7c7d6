"""The shapes of the server's answers: usage, and each API's choices, chunks and logprobs."""

import time

from tinyvllm.engine.sequence import RequestOutput
from tinyvllm.serving.logprobs import chat_logprobs, completion_logprobs


def usage(*outputs: RequestOutput) -> dict:
    """OpenAI's usage of a response's outputs (one per prompt): each prompt once, the completion
    tokens of every choice."""
    prompt_tokens = sum(len(output.prompt_token_ids) for output in outputs)
    completion_tokens = sum(len(completion.token_ids) for output in outputs for completion in output.outputs)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip


class CompletionsAPI:
    """/v1/completions: choices carry `text`, and `logprobs` OpenAI's legacy lists."""

    id_prefix = "cmpl"
    object = "text_completion"
    chunk_object = "text_completion"

    @staticmethod
    def choice(index: int, text: str, finish_reason: str | None, logprobs: dict | None = None) -> dict:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    chunk_choice = choice

    logprobs = staticmethod(completion_logprobs)

    @staticmethod
    def add_prompt_logprobs(response: dict, entries: list | None) -> None:
        for choice in response["choices"]:
            choice["prompt_logprobs"] = entries

    @staticmethod
    def first_chunk_choice(index: int) -> dict | None:
        return None


class ChatAPI:
    """/v1/chat/completions: choices carry a `message`, stream chunks a `delta`, and
    `logprobs` {"content": [a token, its logprob, bytes and top_logprobs, per token]}."""

    id_prefix = "chatcmpl"
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    @staticmethod
    def choice(index: int, text: str, finish_reason: str | None, logprobs: dict | None = None) -> dict:
        message = {"role": "assistant", "content": text}
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}

    @staticmethod
    def chunk_choice(index: int, text: str, finish_reason: str | None, logprobs: dict | None = None) -> dict:
        delta = {"content": text} if text or finish_reason is None else {}
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    logprobs = staticmethod(chat_logprobs)

    @staticmethod
    def add_prompt_logprobs(response: dict, entries: list | None) -> None:
        response["prompt_logprobs"] = entries

    @staticmethod
    def first_chunk_choice(index: int) -> dict | None:
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}


API = type[CompletionsAPI] | type[ChatAPI]


def response_head(api: API, request_id: str, model: str, chunk: bool) -> dict:
    return {"id": request_id, "object": api.chunk_object if chunk else api.object, "created": int(time.time()),
            "model": model}  # fmt: skip
