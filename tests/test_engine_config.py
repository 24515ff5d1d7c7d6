"""EngineConfig: every option checked when it is built, the model-dependent defaults resolved
against the model, and the command line's engine flags generated from its fields."""

import argparse
import dataclasses
import subprocess
import sys

import pytest

from tests.random_llama import LLAMA_3_2_1B_CONFIG, TINY_OVERRIDES, make_random_llama_dir
from tinyvllm import LLM, LLMEngine, SamplingParams
from tinyvllm.cli import add_engine_arguments, engine_config, main
from tinyvllm.config import LINEAR_BACKENDS, NUMPY_BATCHED_TOKENS, EngineConfig, ResolvedEngineConfig
from tinyvllm.model.config import ModelConfig

BAD_OPTIONS = [
    ({"mode": "eager"}, "mode"),
    ({"backend": "tpu"}, "backend"),
    ({"block_size": 12}, "block_size: must be a power of two"),
    ({"block_size": 0}, "block_size"),
    ({"block_size": 16.0}, "block_size"),
    ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"num_blocks": 0}, "num_blocks"),
    ({"num_blocks": True}, "num_blocks"),
    ({"max_num_seqs": -1}, "max_num_seqs"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ({"max_model_len": "long"}, "max_model_len"),
    ({"linear_backend": "magic"}, "linear_backend"),
    ({"enforce_eager": "yes"}, "enforce_eager"),
    ({"activation_dtype": "float16"}, "activation_dtype"),
    ({"cpu_kv_cache_gib": 0}, "cpu_kv_cache_gib"),
    ({"dtype": "float16"}, "dtype"),
    ({"seed": -1}, "seed"),
    ({"seed": 1.5}, "seed"),
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_random_llama_dir(tmp_path_factory.mktemp("tiny"), tokenizer="bytes", config_overrides=TINY_OVERRIDES)


def model_config(max_position_embeddings: int) -> ModelConfig:
    return ModelConfig.from_dict({**LLAMA_3_2_1B_CONFIG, "max_position_embeddings": max_position_embeddings})


@pytest.mark.parametrize("options, named", BAD_OPTIONS)
def test_a_bad_option_is_refused_naming_it(options, named):
    with pytest.raises(ValueError, match=named):
        EngineConfig(**options)


def test_the_defaults_are_the_documented_ones():
    config = EngineConfig()
    assert (config.mode, config.backend, config.block_size, config.max_num_seqs) == ("continuous", "auto", 16, 256)
    assert (config.gpu_memory_utilization, config.cpu_kv_cache_gib, config.enforce_eager) == (0.9, 1.0, False)
    assert (config.num_blocks, config.max_model_len, config.max_num_batched_tokens) == (None, None, None)
    assert (config.linear_backend, config.activation_dtype) == ("auto", "float32")
    assert (config.dtype, config.seed) == ("auto", None)
    assert EngineConfig(seed=0).seed == 0  # unlike the sizes, a seed may be zero


@pytest.mark.parametrize(
    "max_position_embeddings, options, max_model_len, max_num_batched_tokens, max_blocks_per_seq",
    [
        (131072, {"backend": "cuda"}, 8192, 8192, 512),  # Llama 3.2 1B: max_model_len capped at 8192
        (512, {"backend": "cuda"}, 512, 8192, 32),  # a short model: the token budget stays at 8192
        (131072, {"backend": "cuda", "max_model_len": 10000, "block_size": 32}, 10000, 10000, 313),
        (131072, {"max_model_len": 100, "max_num_batched_tokens": 16}, 100, 16, 7),
        (131072, {"backend": "numpy"}, 8192, NUMPY_BATCHED_TOKENS, 512),  # a step of seconds on a CPU
    ],
)
def test_resolve_fills_in_what_depends_on_the_model(
    max_position_embeddings, options, max_model_len, max_num_batched_tokens, max_blocks_per_seq
):
    given = EngineConfig(**options)
    resolved = given.resolve(model_config(max_position_embeddings))
    assert isinstance(resolved, ResolvedEngineConfig)
    assert (resolved.max_model_len, resolved.max_num_batched_tokens) == (max_model_len, max_num_batched_tokens)
    assert resolved.max_blocks_per_seq == max_blocks_per_seq
    unchanged = {spec.name for spec in dataclasses.fields(EngineConfig)} - {"max_model_len", "max_num_batched_tokens"}
    assert all(getattr(resolved, name) == getattr(given, name) for name in unchanged)


def test_resolve_refuses_a_max_model_len_beyond_the_model():
    with pytest.raises(ValueError, match="max_model_len: 600 exceeds the model's max_position_embeddings 512"):
        EngineConfig(max_model_len=600).resolve(model_config(512))


def test_a_resolved_config_needs_the_model_dependent_values():
    with pytest.raises(ValueError, match="max_model_len"):
        ResolvedEngineConfig(max_num_batched_tokens=64)


@pytest.mark.parametrize("backend", ["auto", "cuda", "numpy"])
def test_llm_refuses_a_bad_block_size_on_every_backend_before_loading(backend, tmp_path):
    with pytest.raises(ValueError, match="block_size: must be a power of two, got 12"):
        LLM(tmp_path / "no-model-here", backend=backend, block_size=12)


def test_an_unknown_option_is_named(tmp_path):
    with pytest.raises(TypeError, match="max_num_sequences"):
        LLM(tmp_path / "no-model-here", max_num_sequences=4)
    with pytest.raises(TypeError, match="not both"):
        LLMEngine(tmp_path / "no-model-here", engine_config=EngineConfig(), block_size=4)


def test_engine_config_and_keyword_options_build_the_same_engine(tiny_model):
    options = {"backend": "numpy", "block_size": 4, "max_num_seqs": 8, "max_model_len": 128}
    by_keywords = LLMEngine(tiny_model, **options)
    by_config = LLMEngine(tiny_model, engine_config=EngineConfig(**options))
    assert by_keywords.engine_config == by_config.engine_config
    assert by_config.engine_config.max_num_batched_tokens == NUMPY_BATCHED_TOKENS and by_config.max_model_len == 128
    assert by_config.scheduler.config is by_config.engine_config is by_config.runner.limits


def parse_engine_flags(flags: list[str]) -> EngineConfig:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    return engine_config(parser.parse_args(flags))


def test_every_option_is_a_flag_with_its_default():
    assert parse_engine_flags([]) == EngineConfig()
    flags = [
        "--mode",
        "static",
        "--backend",
        "numpy",
        "--block-size",
        "8",
        "--gpu-memory-utilization",
        "0.5",
        "--num-blocks",
        "64",
        "--max-num-seqs",
        "4",
        "--max-num-batched-tokens",
        "32",
        "--max-model-len",
        "96",
        "--linear-backend",
        "gemv",
        "--enforce-eager",
        "--activation-dtype",
        "bf16",
        "--cpu-kv-cache-gib",
        "0.25",
    ]
    assert parse_engine_flags(flags) == EngineConfig(
        mode="static",
        backend="numpy",
        block_size=8,
        gpu_memory_utilization=0.5,
        num_blocks=64,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        max_model_len=96,
        linear_backend="gemv",
        enforce_eager=True,
        activation_dtype="bf16",
        cpu_kv_cache_gib=0.25,
    )


def test_prefix_caching_is_on_by_default_and_off_by_flag():
    assert parse_engine_flags([]).enable_prefix_caching is True
    assert parse_engine_flags(["--no-enable-prefix-caching"]).enable_prefix_caching is False


def test_a_bad_engine_flag_exits_naming_the_option(tmp_path):
    with pytest.raises(SystemExit, match="tinyvllm generate: block_size: must be a power of two"):
        main(["generate", "hi", "--model", str(tmp_path), "--backend", "numpy", "--block-size", "12"])


@pytest.mark.parametrize("argv", [["--help"], ["generate", "--help"], ["serve", "--help"]])
def test_help_imports_no_numba(argv):
    script = (
        "import sys\n"
        "from tinyvllm.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('IMPORTED', sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'numpy')))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "usage: tinyvllm" in result.stdout
    assert result.stdout.splitlines()[-1] == "IMPORTED []"


def test_every_linear_backend_choice_picks_a_product_kernel():
    from tinyvllm.backends import variants  # imports Numba: the config module itself must not

    for choice in LINEAR_BACKENDS:
        for cublas_available in (True, False):
            assert variants.product_kernel(choice, 1, cublas_available) in ("cublas", "tiled", "gemv")


def test_an_engine_seed_makes_unseeded_requests_reproducible(tiny_model):
    """Two engines with one seed sample the same tokens for requests that give no seed;
    another engine seed samples others (the oracle: the runs themselves, token for token)."""
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    prompts = [[1, 2, 3], [4, 5]]

    def sample(seed):
        llm = LLM(tiny_model, backend="numpy", seed=seed)
        return [output.outputs[0].token_ids for output in llm.generate(prompts, params, use_tqdm=False)]

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_the_cuda_backend_without_a_gpu_is_refused_in_one_line(monkeypatch):
    from tinyvllm.engine import setup

    monkeypatch.setattr("tinyvllm.kernels.device.simulator.SIMULATOR", False)
    monkeypatch.setattr(setup, "missing_for_cuda", lambda: "a CUDA GPU and its driver, and this machine has none")
    config = EngineConfig(backend="cuda").resolve(model_config(512))
    with pytest.raises(ValueError, match="backend: 'cuda' needs a CUDA GPU"):
        setup.make_backend(config)
