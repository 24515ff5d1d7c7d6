"""A chat request's messages and chat-template fields, rendered into prompt ids.

`chat_messages` checks `messages` ([{role, content}], text content, OpenAI's text parts joined
by newlines); `chat_template_options` reads vLLM's template fields; `encode_messages` renders and
encodes them, a template's refusal being a 400 that names `messages`. /v1/chat/completions and
the chat form of /tokenize share all three, so both give the same ids for the same body.
"""

from typing import Any

from jinja2 import TemplateError

from tinyvllm.model.tokenizer import Tokenizer, TokenizerError
from tinyvllm.serving.errors import OpenAIError, flag, given, type_name

CHAT_TEMPLATE_OPTIONS = ("add_generation_prompt", "continue_final_message")


def chat_template_options(body: dict) -> dict:
    """vLLM's chat-template fields of a body, as `Tokenizer.apply_chat_template` keywords:
    add_generation_prompt (default true), continue_final_message (default false, and only with
    add_generation_prompt false, as vLLM asks) and chat_template_kwargs (the template's own
    variables, e.g. {"enable_thinking": false}). A template sent with the request is not taken (vLLM
    trusts one only when told to): the server's own is `serve --chat-template`."""
    options = {"add_generation_prompt": flag(body, "add_generation_prompt", True),
               "continue_final_message": flag(body, "continue_final_message", False)}  # fmt: skip
    if options["add_generation_prompt"] and options["continue_final_message"]:
        raise OpenAIError(400, "continue_final_message needs add_generation_prompt: false (vLLM's rule)",
                          param="continue_final_message")  # fmt: skip
    variables = given(body, "chat_template_kwargs", {})
    if not isinstance(variables, dict) or not all(isinstance(key, str) for key in variables):
        raise OpenAIError(400, f"chat_template_kwargs must be an object, got {type_name(variables)}",
                          param="chat_template_kwargs")  # fmt: skip
    reserved = sorted(set(variables) & {"messages", "chat_template", *CHAT_TEMPLATE_OPTIONS})
    if reserved:
        raise OpenAIError(400, f"chat_template_kwargs: {reserved} are fields of their own",
                          param="chat_template_kwargs")  # fmt: skip
    return {**variables, **options}


def encode_messages(
    tokenizer: Tokenizer, messages: list[dict], options: dict, add_special_tokens: bool = False
) -> list[int]:
    """The prompt ids of checked messages (`chat_messages`) through the model's chat template with
    `options` (`chat_template_options`); a 400 naming `messages` when the template refuses them
    (its raise_exception), cannot continue the last one, or there is none."""
    try:
        text = tokenizer.apply_chat_template(messages, **options)
    except (TemplateError, TokenizerError) as error:
        raise OpenAIError(400, f"messages: {error}", param="messages") from None
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def chat_messages(body: dict) -> list[dict]:
    """[{role, content}] with text content; content parts {"type": "text", "text"} are joined by newlines."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        message = f"messages must be a non-empty list of {{role, content}} objects, got {type_name(messages)}"
        raise OpenAIError(400, message, param="messages")
    checked = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise OpenAIError(400, f"{where} must be an object with a string role", param="messages")
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(_text_part(part, f"{where}.content[{number}]") for number, part in enumerate(content))
        elif not isinstance(content, (str, type(None))):
            raise OpenAIError(400, f"{where}.content must be a string or a list of text parts", param="messages")
        checked.append({"role": message["role"], "content": content or ""})
    return checked


def _text_part(part: Any, where: str) -> str:
    if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
        raise OpenAIError(400, f"{where}: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported",
                          param="messages")  # fmt: skip
    return part["text"]
