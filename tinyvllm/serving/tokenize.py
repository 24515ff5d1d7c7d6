"""vLLM's tokenizer endpoints, beside the OpenAI API: the served model's own token ids and text.

    POST /tokenize    completion form {"prompt": text, "add_special_tokens": true}
                      chat form {"messages": [...], "add_generation_prompt": true,
                                 "add_special_tokens": false, "continue_final_message": false,
                                 "chat_template_kwargs": {...}}
                      -> {"count", "max_model_len", "tokens", "token_strs"}
    POST /detokenize  {"tokens": [ids]} -> {"prompt": text}

Names, defaults and shapes are vLLM's, so a client that counts or truncates tokens against a
vLLM server works here unchanged: the chat form renders the messages through the model's
chat template as /v1/chat/completions does (and its ids are exactly the prompt that endpoint
would run), and `"return_token_strs": true` fills token_strs with each id's vocabulary entry
(null otherwise). /detokenize refuses ids outside the vocabulary, naming them. Both take the
optional `model` field as the generation endpoints do (404 for another model's name).
"""

from tinyvllm.model.tokenizer import Tokenizer
from tinyvllm.serving.errors import OpenAIError, flag, type_name
from tinyvllm.serving.messages import chat_messages, chat_template_options, encode_messages


def tokenize(body: dict, tokenizer: Tokenizer, max_model_len: int) -> dict:
    """A /tokenize body -> its response: the prompt's (or the rendered chat's) token ids."""
    if "messages" in body:
        options = chat_template_options(body)
        tokens = encode_messages(tokenizer, chat_messages(body), options, flag(body, "add_special_tokens", False))
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise OpenAIError(400, f"prompt must be a string (or send messages), got {type_name(prompt)}",
                              param="prompt")  # fmt: skip
        tokens = tokenizer.encode(prompt, add_special_tokens=flag(body, "add_special_tokens", True))
    token_strs = [tokenizer.id_to_token(t) for t in tokens] if flag(body, "return_token_strs", False) else None
    return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens, "token_strs": token_strs}


def detokenize(body: dict, tokenizer: Tokenizer) -> dict:
    """A /detokenize body -> {"prompt": the ids' text}, special tokens kept (as vLLM decodes them)."""
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise OpenAIError(400, f"tokens must be a list of token ids, got {type_name(tokens)}", param="tokens")
    bad = [t for t in tokens if not 0 <= t < tokenizer.vocab_size]
    if bad:
        raise OpenAIError(400, f"tokens: ids {bad[:5]} are outside the vocabulary of {tokenizer.vocab_size}",
                          param="tokens")  # fmt: skip
    return {"prompt": tokenizer.decode(tokens)}
