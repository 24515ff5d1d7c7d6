"""Text <-> token ids, and chat messages -> prompt text, as Hugging Face does them.

A model directory carries `tokenizer.json` (the whole tokenizer pipeline, run by the
`tokenizers` library) and `tokenizer_config.json` (the named special tokens and usually
the chat template; a `chat_template.jinja` file, when present, takes the template's
place). What `add_special_tokens=True` adds (Llama 3: the BOS) is tokenizer.json's
post-processor's decision; like transformers 5, tokenizer_config.json's `add_bos_token`
and `add_eos_token` are ignored when tokenizer.json is there.

The chat template is a Jinja program rendered the way transformers renders it
(`apply_chat_template`): a sandboxed environment with trim_blocks and lstrip_blocks and
the loop controls, a `tojson` filter that keeps non-ASCII text as is, and the globals
`raise_exception` and `strftime_now`; the template sees `messages` (message keys whose
value is None dropped), `add_generation_prompt`, `tools` and `documents` (None unless
given), every named special token (`bos_token`, `eos_token`, ...) and any extra keyword.
Templates usually write the BOS token themselves, so rendered chats are encoded with
`add_special_tokens=False`, exactly as transformers' `apply_chat_template(tokenize=True)`
does: the BOS is never doubled and never added where the template left it out.

Decoding joins the tokens' text without transformers' `clean_up_tokenization_spaces`
(transformers 5 skips it for BPE tokenizers too), so decode(encode(text)) == text.
"""

import functools
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CONTINUE_MARKER = "CONTINUE_FINAL_MESSAGE_TAG "
"""Appended to the message continue_final_message continues, to find where its content ends (transformers' marker)."""


class TokenizerError(ValueError):
    """A tokenizer directory or chat that cannot be used; the message names the file or the problem."""


class Tokenizer:
    """A model's tokenizer: `encode`, `decode`, and chats through `apply_chat_template` / `encode_chat`."""

    def __init__(self, backend: tokenizers.Tokenizer, config: dict | None = None, chat_template: str | None = None):
        """`backend` runs the pipeline; `config` is tokenizer_config.json's content; `chat_template` Jinja text."""
        self.backend = backend
        config = config or {}
        self.special_tokens = {
            name: _token_content(config[name]) for name in SPECIAL_TOKEN_NAMES if config.get(name) is not None
        }
        self.chat_template = chat_template if chat_template is not None else _config_chat_template(config)
        added = backend.get_added_tokens_decoder()
        self.added_tokens = {i: token.content for i, token in added.items()}
        self.special_token_ids = frozenset(i for i, token in added.items() if token.special)

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        """Load `tokenizer.json`, `tokenizer_config.json` (optional) and `chat_template.jinja` (optional)."""
        path = Path(path)
        if not (path / TOKENIZER_FILE).is_file():
            raise TokenizerError(f"{path}: no {TOKENIZER_FILE}")
        backend = tokenizers.Tokenizer.from_file(str(path / TOKENIZER_FILE))
        config = {}
        if (path / TOKENIZER_CONFIG_FILE).is_file():
            try:
                config = json.loads((path / TOKENIZER_CONFIG_FILE).read_text(encoding="utf-8"))
            except json.JSONDecodeError as error:
                raise TokenizerError(f"{path / TOKENIZER_CONFIG_FILE}: not valid JSON ({error})") from None
        template_file = path / CHAT_TEMPLATE_FILE
        chat_template = template_file.read_text(encoding="utf-8") if template_file.is_file() else None
        return cls(backend, config, chat_template)

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    @property
    def bos_token_id(self) -> int | None:
        return None if self.bos_token is None else self.backend.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return None if self.eos_token is None else self.backend.token_to_id(self.eos_token)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of an id (its raw form, e.g. "Ġworld" in byte-level BPE), None past the vocabulary."""
        return self.backend.id_to_token(token_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` applies the post-processor (e.g. prepends BOS)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # --8<-- [start:chat]
    def apply_chat_template(
        self,
        messages: Sequence[dict],
        add_generation_prompt: bool = True,
        *,
        continue_final_message: bool = False,
        chat_template: str | None = None,
        **template_kwargs,
    ) -> str:
        """The chat rendered by the model's template (or `chat_template`, Jinja text, in its place), as
        transformers renders it (see the module docstring).

        `continue_final_message` ends the text inside the last message, so that a model continues
        it (a prefilled answer) instead of starting a new one: as transformers does, the last
        message's content is rendered with a marker after it and the text cut at the marker (and,
        when the template strips what follows a message, at the content's end). `template_kwargs`
        reach the template as variables (e.g. `tools`, `date_string`). A template's
        `raise_exception(message)` raises `jinja2.TemplateError`.
        """
        chat_template = chat_template if chat_template is not None else self.chat_template
        if chat_template is None:
            raise TokenizerError("this tokenizer has no chat template (tokenizer_config.json or chat_template.jinja)")
        variables = {"tools": None, "documents": None, **self.special_tokens, **template_kwargs}
        messages = [{key: value for key, value in message.items() if value is not None} for message in messages]
        if continue_final_message:
            if not messages or not isinstance(messages[-1].get("content"), str):
                raise TokenizerError("continue_final_message needs a last message with text content")
            messages[-1] = {**messages[-1], "content": messages[-1]["content"] + CONTINUE_MARKER}
        template = _compile(chat_template)
        text = template.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
        if not continue_final_message:
            return text
        end = text.rfind(CONTINUE_MARKER.strip())
        if end < 0:
            raise TokenizerError("continue_final_message: the chat template does not write the last message's content")
        # the marker's space survives unless the template stripped the content: then strip the cut too
        return text[:end] if text.startswith(CONTINUE_MARKER, end) else text[:end].rstrip()

    def encode_chat(
        self,
        messages: Sequence[dict],
        add_generation_prompt: bool = True,
        *,
        continue_final_message: bool = False,
        **template_kwargs,
    ) -> list[int]:
        """Prompt ids for a chat: the rendered template encoded without adding special tokens."""
        text = self.apply_chat_template(
            messages, add_generation_prompt, continue_final_message=continue_final_message, **template_kwargs
        )
        return self.encode(text, add_special_tokens=False)

    # --8<-- [end:chat]


def load_chat_template(value: str | Path) -> str:
    """A chat template given as vLLM's --chat-template takes it: a file's path, or the Jinja text
    itself; TokenizerError when it is neither."""
    text = str(value)
    if "{{" in text or "{%" in text:  # Jinja, not a path (a long text is no valid file name either)
        return text
    if not Path(value).is_file():
        raise TokenizerError(f"chat template {text!r}: no such file, and not a Jinja template either")
    return Path(value).read_text(encoding="utf-8")


def _token_content(value) -> str:
    """A special token as tokenizer_config.json writes it: a string or a serialized AddedToken."""
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    if isinstance(value, str):
        return value
    raise TokenizerError(f"{TOKENIZER_CONFIG_FILE}: special token {value!r} is neither a string nor an AddedToken")


def _config_chat_template(config: dict) -> str | None:
    """tokenizer_config.json's template: a string, or a list of named templates of which we take "default"."""
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise TokenizerError(f"{TOKENIZER_CONFIG_FILE}: chat_template must be a string or a list of named templates")
    return template


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


# --8<-- [start:jinja]
@functools.cache
def _compile(chat_template: str) -> jinja2.Template:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment.from_string(chat_template)


# --8<-- [end:jinja]
