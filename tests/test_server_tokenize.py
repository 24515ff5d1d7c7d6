"""The server's vLLM tokenizer endpoints (/tokenize, /detokenize) and /version.

Oracles: the `tokenizers` library reading the model's tokenizer.json itself (ids, token
strings, decoded text), and, for the chat form, the prompt the offline engine runs for the
same chat and the prompt tokens /v1/chat/completions counts.
"""

import httpx
import pytest
import tokenizers

import tinyvllm
from tests.server_fixtures import serve, tiny_model_dir  # noqa: F401
from tests.test_server import assert_error, post
from tinyvllm.llm import LLM
from tinyvllm.sampling_params import SamplingParams

MODEL_NAME = "tiny-test"
MAX_MODEL_LEN = 256
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
TEXT = "The quick brown fox"


@pytest.fixture(scope="module")
def server_url(tiny_model_dir):  # noqa: F811
    args = ["--model", str(tiny_model_dir), "--backend", "numpy", "--num-blocks", "64",
            "--max-model-len", str(MAX_MODEL_LEN), "--served-model-name", MODEL_NAME]  # fmt: skip
    with serve(args) as url:
        yield url


@pytest.fixture(scope="module")
def backend(tiny_model_dir):  # noqa: F811
    return tokenizers.Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


def tokenize(server_url, body) -> dict:
    response = post(server_url, "/tokenize", body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("add_special_tokens", [None, True, False])
def test_tokenize_text_gives_the_tokenizer_files_ids(server_url, backend, add_special_tokens):
    body = {"model": MODEL_NAME, "prompt": TEXT}
    if add_special_tokens is not None:
        body["add_special_tokens"] = add_special_tokens
    ids = backend.encode(TEXT, add_special_tokens=add_special_tokens is not False).ids  # vLLM's default: True
    assert tokenize(server_url, body) == {"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids,
                                          "token_strs": None}  # fmt: skip
    with_strs = tokenize(server_url, {**body, "return_token_strs": True})
    assert with_strs["tokens"] == ids and with_strs["token_strs"] == [backend.id_to_token(i) for i in ids]


def test_tokenize_chat_gives_the_prompt_chat_completions_runs(server_url, tiny_model_dir):  # noqa: F811
    oracle = LLM(tiny_model_dir, backend="numpy", num_blocks=64, max_model_len=MAX_MODEL_LEN)
    [output] = oracle.chat(CHAT, SamplingParams(temperature=0.0, max_tokens=1))
    result = tokenize(server_url, {"messages": CHAT})
    assert result["tokens"] == output.prompt_token_ids and result["count"] == len(output.prompt_token_ids)
    completion = post(server_url, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1}).json()
    assert completion["usage"]["prompt_tokens"] == result["count"]

    rendered = oracle.engine.tokenizer.apply_chat_template(CHAT, add_generation_prompt=False)
    without = tokenize(server_url, {"messages": CHAT, "add_generation_prompt": False})["tokens"]
    assert without == oracle.engine.tokenizer.backend.encode(rendered, add_special_tokens=False).ids
    assert len(without) < result["count"]


def test_template_options_reach_the_template_in_tokenize_and_chat(server_url, tiny_model_dir):  # noqa: F811
    """continue_final_message ends the prompt inside the last message; chat_template_kwargs are the
    template's variables (Llama 3.2's writes date_string). Oracle: the offline engine's LLM.chat."""
    oracle = LLM(tiny_model_dir, backend="numpy", num_blocks=64, max_model_len=MAX_MODEL_LEN)
    prefilled = [*CHAT, {"role": "assistant", "content": "Sure, here"}]
    options = {"add_generation_prompt": False, "continue_final_message": True,
               "chat_template_kwargs": {"date_string": "01 Jan 2000"}}  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=1)
    [output] = oracle.chat(prefilled, params, use_tqdm=False, **options)
    rendered = oracle.get_tokenizer().decode(output.prompt_token_ids)
    assert rendered.endswith("Sure, here") and "01 Jan 2000" in rendered
    assert tokenize(server_url, {"messages": prefilled, **options})["tokens"] == output.prompt_token_ids
    completion = post(server_url, "/v1/chat/completions", {"messages": prefilled, "max_tokens": 1, **options})
    assert completion.json()["usage"]["prompt_tokens"] == len(output.prompt_token_ids)


def test_serve_chat_template_replaces_the_models(tiny_model_dir, tmp_path):  # noqa: F811
    """`serve --chat-template FILE`: every chat renders through it. Oracle: LLM.chat with the same template."""
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] "
    (tmp_path / "plain.jinja").write_text(template, encoding="utf-8")
    oracle = LLM(tiny_model_dir, backend="numpy", num_blocks=64, max_model_len=MAX_MODEL_LEN)
    [output] = oracle.chat(CHAT, SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False, chat_template=template)
    assert oracle.get_tokenizer().decode(output.prompt_token_ids).startswith("[system] Be brief.")
    args = ["--model", str(tiny_model_dir), "--backend", "numpy", "--num-blocks", "64",
            "--max-model-len", str(MAX_MODEL_LEN), "--chat-template", str(tmp_path / "plain.jinja")]  # fmt: skip
    with serve(args) as url:
        assert tokenize(url, {"messages": CHAT})["tokens"] == output.prompt_token_ids


def test_detokenize_decodes_as_the_tokenizer_file_does(server_url, backend):
    ids = backend.encode(TEXT, add_special_tokens=True).ids  # the BOS id too: special tokens stay in the text
    response = post(server_url, "/detokenize", {"model": MODEL_NAME, "tokens": ids})
    assert response.status_code == 200, response.text
    assert response.json() == {"prompt": backend.decode(ids, skip_special_tokens=False)}
    plain = tokenize(server_url, {"prompt": TEXT, "add_special_tokens": False})["tokens"]
    assert post(server_url, "/detokenize", {"tokens": plain}).json() == {"prompt": TEXT}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {"prompt": [1, 2]}, "prompt"),
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": TEXT, "add_special_tokens": "yes"}, "add_special_tokens"),
        ("/tokenize", {"prompt": TEXT, "return_token_strs": 1}, "return_token_strs"),
        ("/tokenize", {"messages": "hi"}, "messages"),
        ("/tokenize", {"messages": CHAT, "continue_final_message": True}, "continue_final_message"),
        ("/tokenize", {"messages": CHAT, "chat_template_kwargs": [1]}, "chat_template_kwargs"),
        ("/tokenize", {"messages": CHAT, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
        ("/v1/chat/completions", {"messages": CHAT, "add_generation_prompt": "no"}, "add_generation_prompt"),
        ("/detokenize", {"tokens": [1, 10**6]}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
        ("/detokenize", {"tokens": [True]}, "tokens"),
    ],
)
def test_bad_tokenizer_requests_are_400s_that_name_the_field(server_url, path, body, param):
    assert_error(post(server_url, path, body), 400, param)


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
def test_another_models_name_is_a_404(server_url, path):
    response = post(server_url, path, {"model": "other", "prompt": TEXT, "tokens": [1]})
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


def test_version_is_the_packages(server_url):
    assert httpx.get(f"{server_url}/version").json() == {"version": tinyvllm.__version__}
