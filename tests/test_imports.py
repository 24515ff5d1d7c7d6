"""What loads Numba: only the CUDA backend and the kernels it launches.

Importing the package, reading a model's config, weights and tokenizer, and the whole
NumPy-backend engine (LLM(..., backend="numpy") generating tokens) must import no Numba:
the CLI answers without paying for it and a machine without CUDA needs none of it. Each
case runs in a fresh interpreter, since the test run has imported Numba already.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir

REPOSITORY = Path(__file__).resolve().parent.parent

IMPORT_PACKAGE = "import tinyvllm"
LOAD_MODEL = """
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.tokenizer import Tokenizer
from tinyvllm.model.weights import load_weights
config = ModelConfig.from_dir(MODEL)
assert load_weights(MODEL, config)
assert Tokenizer.from_dir(MODEL).encode("hello")
"""
GENERATE_ON_NUMPY = """
from tinyvllm import LLM, SamplingParams
llm = LLM(MODEL, backend="numpy")
(output,) = llm.generate(["hello"], SamplingParams(max_tokens=3, temperature=0.8, seed=1, ignore_eos=True))
assert len(output.outputs[0].token_ids) == 3
"""
CLI_HELP = """
import contextlib, io
from tinyvllm import cli
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    cli.main(["--help"])
"""


def modules_after(code: str, model: Path) -> set[str]:
    """The top-level modules a fresh interpreter holds after running `code` (MODEL = model)."""
    script = f"import sys\nMODEL = {str(model)!r}\n{code}\nprint(' '.join(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], cwd=REPOSITORY, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return {name.split(".")[0] for name in result.stdout.split()}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_random_llama_dir(tmp_path_factory.mktemp("tiny"), tokenizer="bytes", config_overrides=TINY_OVERRIDES)


@pytest.mark.parametrize("code", [IMPORT_PACKAGE, LOAD_MODEL, GENERATE_ON_NUMPY, CLI_HELP])
def test_no_numba_without_the_cuda_backend(code, tiny_model):
    modules = modules_after(code, tiny_model)
    assert "numba" not in modules and "llvmlite" not in modules


def test_the_cuda_backend_does_import_numba(tiny_model):
    """The check above can fail: the same probe sees Numba once a kernel module is imported."""
    assert "numba" in modules_after("import tinyvllm.backends.cuda_backend", tiny_model)
