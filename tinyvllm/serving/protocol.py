"""The OpenAI API's request fields, checked by hand (the answers' shapes: `responses.py`).

A request body (a JSON object) becomes a `GenerationRequest`: the prompt (text or token
ids; a chat's messages go through the model's chat template, `messages.py`), the SamplingParams
and the streaming options. Every problem raises `OpenAIError` (`errors.py`), which the server
sends back in OpenAI's shape `{"error": {"message", "type", "param", "code"}}`, the message
naming the field.

Supported: model, prompt / messages, max_tokens (and max_completion_tokens for chat),
temperature, top_p, stop, seed, stream, stream_options.include_usage, n (n choices, indices
0 .. n-1, from one request whose prompt is computed once), presence_penalty,
frequency_penalty, and vLLM's extensions top_k, ignore_eos, stop_token_ids,
repetition_penalty, min_p, min_tokens, skip_special_tokens, include_stop_str_in_output,
truncate_prompt_tokens (the context checks count the kept tokens), and for chat
the template's add_generation_prompt, continue_final_message and chat_template_kwargs;
logprobs, OpenAI's way for each endpoint (chat: `logprobs: true` and `top_logprobs: N`;
completions: `logprobs: N`; N in [0, 20], the raw model distribution as vLLM's default).
Fields left out (or null) take the model's generation_config.json defaults for temperature,
top_p and top_k, like vLLM. max_tokens defaults to 16 for completions (OpenAI's default) and to the rest of the context
for chat, both capped by the server's limit; a max_tokens given that, with the prompt, exceeds
the context is refused with both numbers, as vLLM does. A list of prompts is a batch, one response
for all. Completions take `echo` (`echo.py`). Fields tinyvllm cannot honour
(logit_bias, tools, chat's echo, ...) are refused unless they hold their default value; unknown fields
are ignored.
"""

import re
from dataclasses import dataclass
from typing import Any

from tinyvllm.model.tokenizer import Tokenizer
from tinyvllm.sampling_params import MAX_LOGPROBS, SamplingParams, check_truncate_prompt_tokens, truncated_prompt
from tinyvllm.serving.errors import OpenAIError, flag, given, type_name
from tinyvllm.serving.messages import chat_messages, chat_template_options, encode_messages

COMPLETION_DEFAULT_MAX_TOKENS = 16
UNSUPPORTED = {  # field: the values that mean "not used" (completions honour echo: `echo.py`)
    "echo": (False,),
    "best_of": (1,),
    "suffix": ("",),
    "logit_bias": ({},),
    "tools": ([],),
    "response_format": ({"type": "text"},),
}
PASSED_THROUGH = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens",
                  "skip_special_tokens", "include_stop_str_in_output", "truncate_prompt_tokens")  # fmt: skip
"""SamplingParams fields a request passes through as they are (left out or null: SamplingParams' default)."""
FIELDS = {
    *PASSED_THROUGH,
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
    "stop", "stop_token_ids", "seed", "stream", "stream_options", "n", "ignore_eos", "logprobs", "top_logprobs",
    "prompt_logprobs", *UNSUPPORTED,
}  # fmt: skip


def bad_request(error: ValueError, prompt_field: str = "prompt") -> OpenAIError:
    """A 400 from a ValueError of SamplingParams or the engine; its message starts with the field it names."""
    message = str(error)
    name = re.match(r"\w*", message).group()
    param = prompt_field if name == "prompt" else name if name in FIELDS else None
    return OpenAIError(400, message, param=param)


@dataclass
class GenerationRequest:
    prompt: list[int]  # token ids: a text prompt is tokenized once, here
    params: SamplingParams
    stream: bool
    include_usage: bool
    prompt_field: str  # "prompt" or "messages": where the engine's prompt errors point
    prompt_logprobs_field: bool = False  # asked for by name (echo asks for them without it): in the response
    echo: str | None = None  # completions' echo: the prompt's text, put in front of each choice's
    echo_only: bool = False  # echo with max_tokens 0: each choice is the prompt alone


def check_model(body: dict, served_model_name: str) -> None:
    """404 unless `model` is absent or names the served model."""
    model = body.get("model")
    if model is not None and model != served_model_name:
        raise OpenAIError(404, f"The model `{model}` does not exist; this server serves `{served_model_name}`.",
                          param="model", code="model_not_found")  # fmt: skip


def parse_completion(
    body: dict, defaults: SamplingParams, max_tokens_limit: int, tokenizer: Tokenizer, max_model_len: int
) -> GenerationRequest:
    """A /v1/completions body of one prompt (`completion_prompts` splits a batch) -> GenerationRequest,
    a text prompt tokenized (once: the context check counts its tokens, and the engine takes them as
    they are)."""
    echo = flag(body, "echo", False)
    if echo and body.get("stream") is True:
        raise OpenAIError(400, "echo is not supported with stream: true", param="echo")
    echo_only = echo and body.get("max_tokens") == 0  # a score of the prompt: nothing generated shown
    default = min(COMPLETION_DEFAULT_MAX_TOKENS, max_tokens_limit)
    max_tokens = 1 if echo_only else _max_tokens(body, "max_tokens", default, max_tokens_limit)
    prompt = text = body["prompt"]  # one prompt (`completion_prompts`)
    if isinstance(prompt, str):
        if not prompt:
            raise OpenAIError(400, "prompt: must not be empty", param="prompt")
        prompt = tokenizer.encode(prompt)
    whole = len(prompt)
    prompt = _truncated(body, prompt, max_model_len)
    _check_context(body, "max_tokens", len(prompt), max_tokens, max_model_len)
    logprobs = body.get("logprobs")
    if logprobs is not None:
        _check_logprobs_count("logprobs", logprobs)
    # with echo, logprobs cover the prompt too (vLLM's rule)
    prompt_logprobs = given(body, "prompt_logprobs", logprobs if echo else None)
    generation = _generation(body, prompt, defaults, max_tokens, "prompt", logprobs, prompt_logprobs, ("echo",))
    if echo:  # the prompt as given; token ids as their text
        generation.echo = text if isinstance(text, str) and len(prompt) == whole else tokenizer.decode(prompt)
        generation.echo_only = echo_only
    return generation


def parse_chat(
    body: dict, defaults: SamplingParams, max_tokens_limit: int, tokenizer: Tokenizer, max_model_len: int
) -> GenerationRequest:
    """A /v1/chat/completions body -> GenerationRequest, the messages rendered and tokenized."""
    prompt = encode_messages(tokenizer, chat_messages(body), chat_template_options(body))
    prompt = _truncated(body, prompt, max_model_len)
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    default = min(max(max_model_len - len(prompt), 1), max_tokens_limit)
    max_tokens = _max_tokens(body, name, default, max_tokens_limit)
    _check_context(body, name, len(prompt), max_tokens, max_model_len)
    logprobs = _chat_logprobs(body)
    return _generation(body, prompt, defaults, max_tokens, "messages", logprobs, body.get("prompt_logprobs"))


def _chat_logprobs(body: dict) -> int | None:
    """Chat's `logprobs: true` with `top_logprobs: N` (0 when left out) as SamplingParams.logprobs."""
    wanted = given(body, "logprobs", False)
    if not isinstance(wanted, bool):
        raise OpenAIError(400, f"logprobs must be a boolean for chat completions, got {wanted!r}", param="logprobs")
    top = body.get("top_logprobs")
    if top is None:
        return 0 if wanted else None
    _check_logprobs_count("top_logprobs", top)
    if not wanted:
        raise OpenAIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    return top


def _check_logprobs_count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS:
        raise OpenAIError(400, f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {value!r}", param=name)


def _check_context(body: dict, name: str, prompt_len: int, max_tokens: int, max_model_len: int) -> None:
    """A 400 with both numbers when the prompt and the max_tokens asked for exceed the context,
    as vLLM answers; a default max_tokens is not refused (the request ends at the context)."""
    if body.get(name) is not None and prompt_len + max_tokens > max_model_len:
        message = (
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} in the completion). "
            "Please reduce the length of the prompt or completion."
        )
        raise OpenAIError(400, message, param=name)


def _generation(
    body: dict,
    prompt: list[int],
    defaults: SamplingParams,
    max_tokens: int,
    prompt_field: str,
    logprobs: int | None,
    prompt_logprobs: int | None,
    honoured: tuple[str, ...] = (),
) -> GenerationRequest:
    """The request's SamplingParams; `honoured` are the UNSUPPORTED fields the endpoint takes."""
    for name, unused in UNSUPPORTED.items():
        if name not in honoured and not _is_default(body.get(name), unused):
            raise OpenAIError(400, f"{name} is not supported by tinyvllm (leave it out)", param=name)
    stream = given(body, "stream", False)
    if not isinstance(stream, bool):
        raise OpenAIError(400, f"stream must be a boolean, got {stream!r}", param="stream")
    if prompt_logprobs is not None:  # vLLM's extra field
        _check_logprobs_count("prompt_logprobs", prompt_logprobs)
        if stream:  # as vLLM answers
            raise OpenAIError(400, "prompt_logprobs are not available with stream: true", param="prompt_logprobs")
    try:
        params = SamplingParams(
            n=given(body, "n", 1),
            temperature=given(body, "temperature", defaults.temperature),
            top_p=given(body, "top_p", defaults.top_p),
            top_k=given(body, "top_k", defaults.top_k),
            max_tokens=max_tokens,
            stop=body.get("stop"),
            stop_token_ids=body.get("stop_token_ids"),
            ignore_eos=given(body, "ignore_eos", False),
            seed=body.get("seed"),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            **{name: body[name] for name in PASSED_THROUGH if body.get(name) is not None},
        )
    except ValueError as error:
        raise bad_request(error) from None
    asked = body.get("prompt_logprobs") is not None
    return GenerationRequest(prompt, params, stream, _include_usage(body, stream), prompt_field, asked)


def _truncated(body: dict, prompt: list[int], max_model_len: int) -> list[int]:
    """The prompt's ids that vLLM's truncate_prompt_tokens keeps (the engine keeps the same)."""
    try:
        keep = check_truncate_prompt_tokens(body.get("truncate_prompt_tokens"))
    except ValueError as error:
        raise bad_request(error) from None
    return truncated_prompt(prompt, keep, max_model_len)


def _is_default(value: Any, unused: tuple) -> bool:
    return value is None or any(type(value) is type(default) and value == default for default in unused)


def _max_tokens(body: dict, name: str, default: int, limit: int) -> int:
    value = given(body, name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OpenAIError(400, f"{name} must be a positive integer, got {value!r}", param=name)
    if value > limit:
        raise OpenAIError(400, f"{name} must be at most {limit} (this server's limit), got {value}", param=name)
    return value


def _include_usage(body: dict, stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise OpenAIError(400, "stream_options is only allowed with stream: true", param="stream_options")
    include_usage = options.get("include_usage", False) if isinstance(options, dict) else None
    if not isinstance(include_usage, bool):
        raise OpenAIError(400, f"stream_options must be an object like {{\"include_usage\": true}}, got {options!r}",
                          param="stream_options")  # fmt: skip
    return include_usage


def completion_prompts(body: dict) -> list[str | list[int]]:
    """`prompt` as a list of prompts: a string or a list of token ids is one; a list of them is
    a batch (vLLM's and OpenAI's), answered in one response."""
    prompt = body.get("prompt")
    if _is_one_prompt(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(_is_one_prompt(p) for p in prompt):
        return prompt
    raise OpenAIError(400, f"prompt must be a string, a list of token ids or a list of either, got {type_name(prompt)}",
                      param="prompt")  # fmt: skip


def _is_one_prompt(prompt: Any) -> bool:
    return isinstance(prompt, str) or (isinstance(prompt, list) and all(_is_token_id(t) for t in prompt))


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
