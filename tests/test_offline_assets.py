"""perf/offline_assets.py: a set packed into pieces, received over two commands, unpacked whole."""

import json
from pathlib import Path

import pytest

from perf import offline_assets

FILES = {"wheels/README": b"no wheels here", "cache/pkg-1.0/model.gguf": bytes(range(256)) * 40}


def fake_core(folder: Path) -> None:
    for name, data in FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


@pytest.fixture
def packed(tmp_path, monkeypatch):
    """The fake core set packed into 4 KB pieces in an outbox of its own; HOME and the cache in tmp_path."""
    monkeypatch.setattr(offline_assets, "OUTBOX", tmp_path / "outbox")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TINYVLLM_CACHE", str(tmp_path / "cache"))
    pieces = offline_assets.pack("core", fake_core, 4096)
    return tmp_path, pieces


def carry(tmp_path: Path, names: list[str]) -> Path:
    """A command's copy of the outbox holding the manifest and the named pieces only."""
    outbox = tmp_path / f"command-{len(list(tmp_path.glob('command-*')))}"
    outbox.mkdir()
    for name in ["core.manifest", *names]:
        (outbox / name).write_bytes((tmp_path / "outbox" / name).read_bytes())
    return outbox


def test_pack_cuts_the_set_into_pieces_the_manifest_names(packed):
    tmp_path, pieces = packed
    manifest = json.loads((tmp_path / "outbox" / "core.manifest").read_text())
    assert len(pieces) >= 3 and all(piece.stat().st_size <= 4096 for piece in pieces)
    assert [name for name, _ in manifest["pieces"]] == [piece.name for piece in pieces]
    assert all(offline_assets.sha256(piece) == digest for piece, (_, digest) in zip(pieces, manifest["pieces"]))


def test_pieces_over_two_commands_unpack_into_the_cache(packed):
    tmp_path, pieces = packed
    first = offline_assets.receive(carry(tmp_path, [pieces[0].name]))
    assert first == [f"core: 1 of {len(pieces)} pieces in"]
    assert not (tmp_path / "cache").exists()
    second = offline_assets.receive(carry(tmp_path, [piece.name for piece in pieces[1:]]))
    assert second[0].startswith("core: 0 wheels") and str(tmp_path / "cache") in second[0]
    assert (tmp_path / "cache" / "pkg-1.0" / "model.gguf").read_bytes() == FILES["cache/pkg-1.0/model.gguf"]


def test_a_piece_that_is_not_the_manifests_is_refused(packed):
    tmp_path, pieces = packed
    outbox = carry(tmp_path, [pieces[0].name])
    (outbox / pieces[0].name).write_bytes(b"something else")
    with pytest.raises(SystemExit, match="sha256 differs"):
        offline_assets.receive(outbox)


def test_a_wheel_list_names_each_wheel_by_name_and_version():
    wheel_list = """# vLLM's wheels
# size_MB  wheel
   289.6  vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
     0.1  partial_json_parser-0.2.1.1.post7-py3-none-any.whl
"""
    assert offline_assets.wheel_requirements(wheel_list) == ["vllm==0.26.0", "partial_json_parser==0.2.1.1.post7"]
