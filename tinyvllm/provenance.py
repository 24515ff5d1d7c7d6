"""Where a measurement came from: device, date, git revision and command line.

`tinyvllm bench --output-json` and every perf/ results JSON start with these fields
(`device`, `date`, `git_rev`, `command`), so a number can be traced to the machine and
the code that produced it. Nothing here imports Numba: the device's name comes from the
CUDA driver through ctypes, as `tinyvllm.hardware` asks it whether a GPU exists.
"""

import datetime
import os
import platform
import subprocess
from pathlib import Path

from tinyvllm.hardware import cuda_device_name

REPOSITORY = Path(__file__).resolve().parents[1]


def git_revision() -> str:
    """GIT_REV when set (a copied work tree may carry a stale .git), else git's short
    HEAD with "-dirty" for uncommitted changes, else "unknown" (no git, or not a checkout)."""
    if os.environ.get("GIT_REV"):
        return os.environ["GIT_REV"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPOSITORY, capture_output=True, text=True)
        status = subprocess.run(["git", "status", "--porcelain"], cwd=REPOSITORY, capture_output=True, text=True)
    except FileNotFoundError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def cpu_name() -> str:
    """The processor's model name (/proc/cpuinfo on Linux), else what platform reports."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(backend: str) -> str:
    """The GPU's name for the CUDA backend, the CPU's for the NumPy one."""
    if backend == "cuda":
        return cuda_device_name() or "unknown CUDA device"
    return cpu_name()


def run_header(backend: str, command: str) -> dict:
    """device, date (UTC), git revision and command, for the top of a results JSON."""
    return {
        "device": device_name(backend),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_rev": git_revision(),
        "command": command,
    }
