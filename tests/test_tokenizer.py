"""Tokenizer, chat templates and streaming detokenization, against transformers as the oracle.

Two tiny tokenizers are trained here with the `tokenizers` library: a byte-level BPE (GPT-2 /
Llama 3 style, a multi-byte character can span several tokens) and a sentencepiece-style
BPE with byte fallback (Llama 2 style, "▁" for spaces and a decoder that strips the first
leading space). Chat rendering is compared with transformers' `apply_chat_template` on the
very same files.
"""

import json
from datetime import datetime

import jinja2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from tinyvllm.engine.detokenizer import (
    IncrementalDetokenizer,
    find_stop_string,
    partial_stop_length,
)
from tinyvllm.model.tokenizer import Tokenizer, TokenizerError, load_chat_template

CORPUS = [
    "Hello world, this is a tiny corpus for a tiny tokenizer.",
    "The quick brown fox jumps over the lazy dog. 1234567890",
    "日本語のテキストも少し。中文也有一点。",
    "Emoji 😀🎉👍🏽 and accents: café, naïve, Ångström.",
] * 20
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML written compactly with whitespace control: tojson, raise_exception, bos_token, tools.
CHATML_COMPACT = """{{- bos_token }}
{%- if tools %}
    {{- '<|im_start|>system\\nTools: ' + (tools | tojson) + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message['role'] not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('Unknown role: ' + message['role']) }}
    {%- endif %}
    {%- if message.name is defined %}
        {{- '<|im_start|>' + message['role'] + ' ' + message.name + '\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message['role'] + '\\n' }}
    {%- endif %}
    {{- message['content'] | trim + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
# ChatML laid out over lines, relying on trim_blocks and lstrip_blocks, SmolLM2 style.
CHATML_LINES = """{% for message in messages %}
  {% if loop.first and message['role'] != 'system' %}
<|im_start|>system
You are a helpful assistant, {{ strftime_now('%Y') }} edition.<|im_end|>
  {% endif %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}
"""

text_alphabet = st.sampled_from(list("abc xyz\n\t.,!'") + list("éü日本語中文😀🎉👍🏽𝄞") + ["\u200d"])
texts = st.text(text_alphabet, max_size=40)
messages_strategy = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": texts}), min_size=1, max_size=4
)


def _byte_level_bpe() -> BackendTokenizer:
    tokenizer = BackendTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


def _sentencepiece_style_bpe() -> BackendTokenizer:
    tokenizer = BackendTokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    # Byte-fallback pieces are ordinary vocabulary entries (not added tokens), as in Llama 2.
    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    return BackendTokenizer.from_str(json.dumps(spec))


def _write_dir(path, backend: BackendTokenizer, **config):
    path.mkdir(parents=True, exist_ok=True)
    backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def chatml_dir(tmp_path_factory):
    return _write_dir(
        tmp_path_factory.mktemp("chatml"),
        _byte_level_bpe(),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_COMPACT,
    )


@pytest.fixture(scope="module")
def ours(chatml_dir):
    return Tokenizer.from_dir(chatml_dir)


@pytest.fixture(scope="module")
def oracle(chatml_dir):
    transformers = pytest.importorskip("transformers", reason="transformers is the oracle (the ref extra)")
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(chatml_dir))


@pytest.fixture(scope="module")
def sentencepiece_style():
    return Tokenizer(_sentencepiece_style_bpe())


@settings(max_examples=50)
@given(text=texts, add_special_tokens=st.booleans())
def test_encode_decode_match_transformers(ours, oracle, text, add_special_tokens):
    ids = ours.encode(text, add_special_tokens=add_special_tokens)
    assert ids == oracle.encode(text, add_special_tokens=add_special_tokens)
    assert ours.decode(ids) == oracle.decode(ids) == text
    with_specials = [ours.bos_token_id, *ids, ours.eos_token_id]
    skipped = ours.decode(with_specials, skip_special_tokens=True)
    assert skipped == oracle.decode(with_specials, skip_special_tokens=True) == text


def test_special_tokens_match_transformers(ours, oracle):
    assert ours.special_tokens == oracle.special_tokens_map
    assert (ours.bos_token, ours.bos_token_id) == (oracle.bos_token, oracle.bos_token_id) == ("<|im_start|>", 1)
    assert (ours.eos_token, ours.eos_token_id) == (oracle.eos_token, oracle.eos_token_id)
    assert ours.added_tokens == {i: token.content for i, token in oracle.added_tokens_decoder.items()}
    assert ours.special_token_ids == {i for i, token in oracle.added_tokens_decoder.items() if token.special}
    assert ours.vocab_size == len(oracle)
    assert ours.encode("<|im_end|>", add_special_tokens=False) == [ours.eos_token_id]


@settings(max_examples=40)
@given(messages=messages_strategy, system=st.none() | texts, add_generation_prompt=st.booleans())
@pytest.mark.parametrize("template", [CHATML_COMPACT, CHATML_LINES], ids=["compact", "lines"])
def test_chat_template_matches_transformers(ours, oracle, template, messages, system, add_generation_prompt):
    if system is not None:
        messages = [{"role": "system", "content": system}, *messages]
    expected = oracle.apply_chat_template(
        messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    tokenizer = Tokenizer(ours.backend, {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}, template)
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected
    expected_ids = oracle.apply_chat_template(
        messages, chat_template=template, add_generation_prompt=add_generation_prompt, return_dict=False
    )
    assert tokenizer.encode_chat(messages, add_generation_prompt=add_generation_prompt) == expected_ids
    assert expected_ids.count(ours.bos_token_id) == expected.count("<|im_start|>")


@settings(max_examples=40)
@given(messages=messages_strategy, answer=texts)
@pytest.mark.parametrize("template", [CHATML_COMPACT, CHATML_LINES], ids=["compact", "lines"])
def test_continue_final_message_matches_transformers(ours, oracle, template, messages, answer):
    """The text ends inside the last message (a prefilled answer); COMPACT trims messages, LINES keeps them."""
    messages = [*messages, {"role": "assistant", "content": answer}]
    expected = oracle.apply_chat_template(
        messages, chat_template=template, tokenize=False, add_generation_prompt=False, continue_final_message=True
    )
    tokenizer = Tokenizer(ours.backend, {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}, template)
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True) == expected
    ids = tokenizer.encode_chat(messages, add_generation_prompt=False, continue_final_message=True)
    assert ids == tokenizer.encode(expected, add_special_tokens=False)


def test_a_template_given_in_place_of_the_models_renders_as_transformers_does(ours, oracle, tmp_path):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    expected = oracle.apply_chat_template(messages, chat_template=CHATML_LINES, tokenize=False)
    assert ours.apply_chat_template(messages, add_generation_prompt=False, chat_template=CHATML_LINES) == expected
    (tmp_path / "template.jinja").write_text(CHATML_LINES, encoding="utf-8")
    assert load_chat_template(tmp_path / "template.jinja") == load_chat_template(CHATML_LINES) == CHATML_LINES
    with pytest.raises(TokenizerError, match="no such file"):
        load_chat_template(tmp_path / "missing.jinja")


def test_chat_template_tools_names_and_none_values_match_transformers(ours, oracle):
    tools = [{"name": "météo", "parameters": {"ville": {"type": "string"}}, "emoji": "😀"}]
    messages = [
        {"role": "user", "content": "  Quel temps ?  ", "name": "ana"},
        {"role": "assistant", "content": "Beau.", "name": None},
    ]
    try:
        expected = oracle.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    except TypeError as error:  # older transformers (5.17 on the GPU machine) hand the template name=None
        from transformers import __version__

        pytest.skip(f"transformers {__version__} cannot render a None-valued message key: {error}")
    assert "météo" in expected and "None" not in expected
    assert ours.apply_chat_template(messages, tools=tools) == expected


def test_raise_exception_matches_transformers(ours, oracle):
    messages = [{"role": "robot", "content": "beep"}]
    with pytest.raises(jinja2.TemplateError) as expected:
        oracle.apply_chat_template(messages, tokenize=False)
    with pytest.raises(jinja2.TemplateError, match="Unknown role: robot") as raised:
        ours.apply_chat_template(messages)
    assert str(raised.value) == str(expected.value)


def test_template_file_and_named_templates_take_precedence_as_in_transformers(tmp_path, ours):
    transformers = pytest.importorskip("transformers", reason="transformers is the oracle (the ref extra)")
    backend = ours.backend
    named = [{"name": "default", "template": CHATML_LINES}, {"name": "tool_use", "template": "tools!"}]
    listed = _write_dir(tmp_path / "listed", backend, bos_token="<|im_start|>", chat_template=named)
    overridden = _write_dir(tmp_path / "file", backend, bos_token="<|im_start|>", chat_template="ignored")
    (overridden / "chat_template.jinja").write_text(CHATML_COMPACT)
    messages = [{"role": "user", "content": "hi"}]
    for directory, marker in [(listed, f"{datetime.now().year} edition"), (overridden, "<|im_start|><|im_start|>")]:
        expected = transformers.PreTrainedTokenizerFast.from_pretrained(str(directory)).apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        assert marker in expected
        assert Tokenizer.from_dir(directory).apply_chat_template(messages) == expected


def test_missing_template_and_missing_tokenizer_are_errors(tmp_path, ours):
    with pytest.raises(TokenizerError, match="no chat template"):
        Tokenizer(ours.backend, {}).apply_chat_template([{"role": "user", "content": "hi"}])
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def _stream(tokenizer, ids, prompt_ids=(), skip_special_tokens=True):
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=skip_special_tokens)
    chunks = [detokenizer.step([i]) for i in ids]
    return chunks, detokenizer


@settings(max_examples=60)
@given(prompt=texts, text=texts, which=st.sampled_from(["byte_level", "sentencepiece_style"]))
def test_streaming_text_is_the_full_decode_and_never_a_broken_character(ours, sentencepiece_style, prompt, text, which):
    tokenizer = ours if which == "byte_level" else sentencepiece_style
    ids = tokenizer.encode(text, add_special_tokens=False)
    chunks, detokenizer = _stream(tokenizer, ids)
    assert "".join(chunks) == detokenizer.text == tokenizer.decode(ids)
    assert not any("\ufffd" in chunk for chunk in chunks)
    assert detokenizer.finish() == ""
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    chunks, _ = _stream(tokenizer, ids, prompt_ids)
    assert tokenizer.decode(prompt_ids) + "".join(chunks) == tokenizer.decode(prompt_ids + ids)
    assert not any("\ufffd" in chunk for chunk in chunks)


@settings(max_examples=60)
@given(data=st.data(), which=st.sampled_from(["byte_level", "sentencepiece_style"]), skip=st.booleans())
def test_streaming_arbitrary_ids_holds_back_only_incomplete_text(ours, sentencepiece_style, data, which, skip):
    tokenizer = ours if which == "byte_level" else sentencepiece_style
    ids = data.draw(st.lists(st.integers(0, tokenizer.vocab_size - 1), max_size=30))
    chunks, detokenizer = _stream(tokenizer, ids, skip_special_tokens=skip)
    assert not any(chunk.endswith("\ufffd") for chunk in chunks)
    streamed = "".join(chunks) + detokenizer.finish()
    expected = tokenizer.decode(ids, skip_special_tokens=skip)
    # Byte fallback turns every byte of an invalid run into U+FFFD, bytes already streamed included.
    if which == "byte_level" or "\ufffd" not in expected:
        assert streamed == expected


stop_alphabet = st.text("abc", max_size=4)


@settings(max_examples=100)
@given(pieces=st.lists(stop_alphabet, max_size=12), stop=st.lists(stop_alphabet, min_size=1, max_size=3))
def test_find_stop_string_finds_the_earliest_match_as_soon_as_it_completes(pieces, stop):
    text = ""
    for piece in pieces:
        text += piece
        found = find_stop_string(text, stop, len(piece))
        matches = [(text.find(s), s) for s in stop if s and s in text]
        if found is not None or matches:
            assert found is not None and found[0] == min(index for index, _ in matches)
            assert text[found[0] :].startswith(found[1])
            return


@settings(max_examples=100)
@given(text=st.text("abc", max_size=10), stop=st.lists(stop_alphabet, max_size=3))
def test_partial_stop_length_is_the_longest_tail_that_could_grow_into_a_stop(text, stop):
    possible = [k for k in range(1, len(text) + 1) for s in stop if k < len(s) and s.startswith(text[len(text) - k :])]
    assert partial_stop_length(text, stop) == max(possible, default=0)
