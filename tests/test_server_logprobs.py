"""Logprobs through the server, parsed by the official `openai` client: chat's
`logprobs.content` and completions' legacy lists, streamed and not, against the offline
engine's own logprobs for the same greedy request (tests/test_engine_logprobs.py holds
those to a float64 oracle)."""

import openai
import pytest

from tests.server_fixtures import serve, tiny_model_dir  # noqa: F401
from tinyvllm import SamplingParams
from tinyvllm.llm import LLM

MODEL_NAME = "tiny-logprobs"
MAX_TOKENS = 6
PROMPT = "Once upon a time"
CHAT = [{"role": "user", "content": "Hi there"}]
TOLERANCE = 1e-5
"""Nats: the NumPy forward's float32 sums round differently from one request to the next."""
GREEDY = {"temperature": 0.0, "max_tokens": MAX_TOKENS, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def client(tiny_model_dir):  # noqa: F811
    args = ["--model", str(tiny_model_dir), "--backend", "numpy", "--num-blocks", "128",
            "--max-model-len", "128", "--served-model-name", MODEL_NAME]  # fmt: skip
    with serve(args) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def oracle(tiny_model_dir):  # noqa: F811
    return LLM(tiny_model_dir, backend="numpy", num_blocks=64, max_model_len=128)


def _offline(oracle, prompt, count: int):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=count)
    [output] = oracle.chat(prompt, params) if isinstance(prompt, list) else oracle.generate(prompt, params)
    return output.outputs[0]


def test_completion_logprobs_streamed_and_not(client, oracle):
    expected = _offline(oracle, PROMPT, 3)
    tokens = [entry[token].decoded_token for entry, token in zip(expected.logprobs, expected.token_ids)]
    response = client.completions.create(model=MODEL_NAME, prompt=PROMPT, logprobs=3, **GREEDY)
    logprobs = response.choices[0].logprobs
    assert logprobs.tokens == tokens
    assert logprobs.token_logprobs == pytest.approx(
        [entry[token].logprob for entry, token in zip(expected.logprobs, expected.token_ids)], abs=TOLERANCE
    )
    # keyed by text, as OpenAI's legacy shape is: tokens that decode alike share a key
    assert [list(top) for top in logprobs.top_logprobs] == [
        list({logprob.decoded_token: None for logprob in entry.values()}) for entry in expected.logprobs
    ]
    assert logprobs.text_offset == [sum(len(text) for text in tokens[:i]) for i in range(len(tokens))]
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, logprobs=3, stream=True, **GREEDY))
    streamed = [chunk.choices[0].logprobs for chunk in chunks if chunk.choices[0].logprobs is not None]
    assert sum((part.tokens for part in streamed), []) == tokens
    assert sum((part.token_logprobs for part in streamed), []) == pytest.approx(logprobs.token_logprobs, abs=TOLERANCE)
    assert sum((part.text_offset for part in streamed), []) == logprobs.text_offset


def test_chat_logprobs_streamed_and_not(client, oracle):
    expected = _offline(oracle, CHAT, 2)
    response = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, logprobs=True, top_logprobs=2, **GREEDY)
    content = response.choices[0].logprobs.content
    assert len(content) == MAX_TOKENS
    for item, token, entry in zip(content, expected.token_ids, expected.logprobs):
        assert item.token == entry[token].decoded_token and item.bytes == list(item.token.encode())
        assert item.logprob == pytest.approx(entry[token].logprob, abs=TOLERANCE)
        assert [top.token for top in item.top_logprobs] == [lp.decoded_token for lp in list(entry.values())[:2]]
        assert item.top_logprobs[0].logprob >= item.logprob - 1e-6  # greedy: the sampled token is the top one
    chunks = client.chat.completions.create(
        model=MODEL_NAME, messages=CHAT, logprobs=True, top_logprobs=2, stream=True, **GREEDY
    )
    streamed = [
        item
        for chunk in chunks
        if chunk.choices and chunk.choices[0].logprobs
        for item in chunk.choices[0].logprobs.content
    ]
    assert [item.token for item in streamed] == [item.token for item in content]
    assert [item.logprob for item in streamed] == pytest.approx([item.logprob for item in content], abs=TOLERANCE)


def test_chat_logprobs_without_top_logprobs_and_requests_without_them(client):
    plain = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, **GREEDY)
    assert plain.choices[0].logprobs is None
    sampled_only = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, logprobs=True, **GREEDY)
    assert [item.top_logprobs for item in sampled_only.choices[0].logprobs.content] == [[]] * MAX_TOKENS
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=MODEL_NAME, messages=CHAT, top_logprobs=3, **GREEDY)


def _offline_prompt_logprobs(oracle, prompt, count: int) -> list:
    """The offline engine's prompt logprobs in the server's JSON shape (token ids as strings)."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, prompt_logprobs=count)
    [output] = oracle.chat(prompt, params) if isinstance(prompt, list) else oracle.generate(prompt, params)
    return [None if entry is None else {str(t): lp for t, lp in entry.items()} for entry in output.prompt_logprobs]


def assert_same_prompt_logprobs(served: list, expected: list) -> None:
    assert len(served) == len(expected) and served[0] is None and expected[0] is None
    for got, want in zip(served[1:], expected[1:]):
        assert list(got) == list(want)
        for token, logprob in want.items():
            assert got[token]["logprob"] == pytest.approx(logprob.logprob, abs=TOLERANCE)
            assert (got[token]["rank"], got[token]["decoded_token"]) == (logprob.rank, logprob.decoded_token)


def test_prompt_logprobs_per_choice_for_completions_and_per_response_for_chat(client, oracle):
    """vLLM's extra field and its places: each completion choice, the chat response."""
    body = {"prompt_logprobs": 2, "ignore_eos": True}
    completion = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=1, n=2, extra_body=body)
    expected = _offline_prompt_logprobs(oracle, PROMPT, 2)
    for choice in completion.choices:
        assert_same_prompt_logprobs(choice.prompt_logprobs, expected)
    chat = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=1, extra_body=body)
    assert_same_prompt_logprobs(chat.prompt_logprobs, _offline_prompt_logprobs(oracle, CHAT, 2))
    plain = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=1)
    assert "prompt_logprobs" not in plain.choices[0].model_extra


def test_prompt_logprobs_are_refused_when_streamed_or_out_of_range(client):
    for extra in ({"prompt_logprobs": 1, "stream": True}, {"prompt_logprobs": 21}, {"prompt_logprobs": "2"}):
        stream = extra.pop("stream", False)
        with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
            client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=1, stream=stream, extra_body=extra)


def _prompt_scores(oracle, count: int):
    """The offline engine's prompt logprobs of PROMPT: its ids, and per token after the first
    (its text, its logprob)."""
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=count)
    [output] = oracle.generate(PROMPT, params, use_tqdm=False)
    ids = output.prompt_token_ids
    return ids, [(entry[t].decoded_token, entry[t].logprob) for t, entry in zip(ids[1:], output.prompt_logprobs[1:])]


def test_echo_with_no_new_tokens_scores_the_prompt(client, oracle):
    """vLLM's and the harnesses' way to score a text: echo, max_tokens 0, logprobs N."""
    ids, scored = _prompt_scores(oracle, 2)
    response = client.completions.create(model=MODEL_NAME, prompt=PROMPT, echo=True, max_tokens=0, logprobs=2)
    choice = response.choices[0]
    assert choice.text == PROMPT
    first = oracle.get_tokenizer().decode([ids[0]])
    assert choice.logprobs.tokens == [first] + [text for text, _ in scored]
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    assert choice.logprobs.token_logprobs[1:] == pytest.approx([logprob for _, logprob in scored], abs=TOLERANCE)
    assert all(len(top) >= 1 for top in choice.logprobs.top_logprobs[1:])


def test_echo_puts_the_prompt_before_the_completion(client, oracle):
    expected = _offline(oracle, PROMPT, 3)
    _, scored = _prompt_scores(oracle, 3)
    response = client.completions.create(model=MODEL_NAME, prompt=PROMPT, echo=True, logprobs=3, **GREEDY)
    logprobs = response.choices[0].logprobs
    assert response.choices[0].text == PROMPT + expected.text
    generated = [entry[token].decoded_token for entry, token in zip(expected.logprobs, expected.token_ids)]
    assert logprobs.tokens[1:] == [text for text, _ in scored] + generated
    assert logprobs.text_offset == [sum(len(text) for text in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))]
    plain = client.completions.create(model=MODEL_NAME, prompt=PROMPT, echo=True, **GREEDY).choices[0]
    assert (plain.text, plain.logprobs) == (PROMPT + expected.text, None)
    ids = oracle.get_tokenizer().encode(PROMPT)
    by_ids = client.completions.create(model=MODEL_NAME, prompt=ids, echo=True, **GREEDY).choices[0]
    assert by_ids.text == oracle.get_tokenizer().decode(ids) + expected.text
