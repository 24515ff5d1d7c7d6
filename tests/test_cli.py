"""The command line on a tiny random model (NumPy backend): generate, serve's model argument and bench."""

import json

import pytest

from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir
from tinyvllm import LLM, SamplingParams
from tinyvllm.cli import build_parser, main, serve_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return str(
        make_random_llama_dir(tmp_path_factory.mktemp("tiny"), tokenizer="bytes", config_overrides=TINY_OVERRIDES)
    )


def test_generate_json_matches_the_library(tiny_model, capsys):
    main(
        [
            "generate",
            "hello",
            "--raw",
            "--json",
            "--model",
            tiny_model,
            "--backend",
            "numpy",
            "--max-tokens",
            "6",
            "--ignore-eos",
        ]
    )
    printed = json.loads(capsys.readouterr().out)
    expected = LLM(tiny_model, backend="numpy").generate(
        ["hello"], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    )[0]
    assert printed["token_ids"] == expected.token_ids
    assert printed["text"] == expected.text
    assert printed["prompt_tokens"] == len(expected.prompt_token_ids)


@pytest.mark.parametrize("run, row", [("latency", "decode tok/s"), ("throughput", "output tok/s")])
def test_bench_prints_a_table(tiny_model, capsys, run, row):
    main(
        [
            "bench",
            run,
            "--model",
            tiny_model,
            "--backend",
            "numpy",
            "--prompt-len",
            "8",
            "--new-tokens",
            "4",
            "--requests",
            "3",
            "--min-len",
            "2",
            "--max-len",
            "5",
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    values = {line.rsplit(None, 1)[0].strip(): float(line.rsplit(None, 1)[1]) for line in lines}
    assert values[row] > 0


def test_bad_sampling_flag_exits_with_the_parameter_named(tiny_model):
    with pytest.raises(SystemExit, match="top_p"):
        main(["generate", "hi", "--model", tiny_model, "--backend", "numpy", "--top-p", "0"])


@pytest.mark.parametrize(
    "arguments, model",
    [
        (["serve"], None),
        (["serve", "some/dir"], "some/dir"),
        (["serve", "--model", "some/dir"], "some/dir"),
        (["serve", "some/dir", "--port", "9000", "--model", "some/dir"], "some/dir"),
    ],
)
def test_serve_takes_the_model_positionally_or_by_flag(arguments, model):
    assert serve_model(build_parser().parse_args(arguments)) == model


def test_serve_refuses_two_different_models_naming_both():
    with pytest.raises(SystemExit, match=r"MODEL \(one\) and --model \(other\)"):
        main(["serve", "one", "--model", "other"])
