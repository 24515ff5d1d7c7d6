"""The command line on a tiny random model (NumPy backend): generate, serve's model argument and bench."""

import dataclasses
import json

import pytest

from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir
from tinyvllm import LLM, SamplingParams
from tinyvllm.cli import build_parser, main, serve_model
from tinyvllm.config import EngineConfig


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
    assert printed["token_ids"] == expected.outputs[0].token_ids
    assert printed["text"] == expected.outputs[0].text
    assert printed["prompt_tokens"] == len(expected.prompt_token_ids)


def bench_arguments(run: str, model: str) -> list[str]:
    """A bench run small enough for the NumPy backend on the tiny model; 31 decode steps take
    about 25 ms there, well above a busy machine's noise between runs."""
    sizes = ["--prompt-len", "8", "--new-tokens", "32", "--requests", "3", "--min-len", "2", "--max-len", "5"]
    return ["bench", run, "--model", model, "--backend", "numpy", *sizes]


@pytest.mark.parametrize("run, row", [("latency", "decode tok/s"), ("throughput", "output tok/s")])
def test_bench_prints_a_table(tiny_model, capsys, run, row):
    main(bench_arguments(run, tiny_model))
    lines = capsys.readouterr().out.splitlines()
    values = {line.rsplit(None, 1)[0].strip(): float(line.rsplit(None, 1)[1]) for line in lines}
    assert values[row] > 0


def test_bad_sampling_flag_exits_with_the_parameter_named(tiny_model):
    with pytest.raises(SystemExit, match="top_p"):
        main(["generate", "hi", "--model", tiny_model, "--backend", "numpy", "--top-p", "0"])


@pytest.mark.parametrize(
    "run, settings, result",
    [
        ("latency", {"prompt_len": 8, "new_tokens": 32}, "decode_tok_per_s"),
        ("throughput", {"requests": 3, "min_len": 2, "max_len": 5}, "output_tok_per_s"),
    ],
)
def test_bench_reports_progress_and_writes_json(tiny_model, tmp_path, capsys, run, settings, result):
    output = tmp_path / "bench.json"
    arguments = bench_arguments(run, tiny_model) + ["--output-json", str(output)]
    main(arguments)
    progress = capsys.readouterr().err.splitlines()
    assert any("model loaded" in line for line in progress)
    assert len(progress) >= 3, "a line for the load, one per phase, one for the file"
    record = json.loads(output.read_text())
    assert record["benchmark"] == run
    assert record["command"] == "tinyvllm " + " ".join(arguments)
    assert record["device"] and record["git_rev"] and record["date"].endswith("+00:00")
    assert record["settings"] == settings
    assert set(record["engine"]) == {spec.name for spec in dataclasses.fields(EngineConfig)}
    assert record["engine"]["backend"] == "numpy" and record["engine"]["num_blocks"] > 0
    assert record["engine"]["max_model_len"] > 0, "the resolved config, not the flags' None"
    assert record["results"][result] > 0


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


def test_serve_refuses_a_chat_template_that_is_neither_file_nor_template(tmp_path):
    with pytest.raises(SystemExit, match="no such file, and not a Jinja template"):
        main(["serve", "--chat-template", str(tmp_path / "missing.jinja")])


def test_version_answers_with_the_package_version(capsys):
    from tinyvllm import __version__

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"tinyvllm {__version__}"
