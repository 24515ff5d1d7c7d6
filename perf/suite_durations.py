"""A pytest plugin that appends each test's wall time to a file as soon as the test ends.

`pytest --durations` prints only when the whole run ends, so a suite stopped at a time limit
says nothing about where its time went. Loaded with `-p perf.suite_durations` and
SUITE_DURATIONS=FILE (perf/gpu_check.sh does both), it appends one line per test phase,
`seconds<TAB>outcome<TAB>node id<TAB>phase<TAB>worker<TAB>seconds since the run began`, for
every call and for each setup or teardown of a second or more (module fixtures that build an
engine are paid once per worker that runs the module's tests); `sort -rn FILE | head` then
names the slowest, and the last two columns show how each worker spent the run. Under
pytest-xdist the controller writes (every worker's report reaches it), the workers do not.

With SUITE_ORDER=FILE (an earlier run's file), the tests run slowest first, tests the file
does not know ahead of all: pytest-xdist hands tests out in collection order, so a long test
collected last would run alone after every other worker is done. Every worker reads the same
file, so they all collect the same order, as pytest-xdist requires.
"""

import math
import os
import time
from pathlib import Path

import pytest

SLOW_FIXTURE_SECONDS = 1.0
RUN_BEGAN = time.monotonic()


def earlier_durations(path: Path) -> dict[str, float]:
    """Each node id's seconds, its phases added, in a file this plugin wrote (the last line
    for an id and phase wins; lines of three columns are calls)."""
    phases = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        seconds, _outcome, node_id, *rest = line.split("\t")
        phases[node_id, rest[0] if rest else "call"] = float(seconds)
    durations = {}
    for (node_id, _phase), seconds in phases.items():
        durations[node_id] = durations.get(node_id, 0.0) + seconds
    return durations


@pytest.hookimpl
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    path = os.environ.get("SUITE_ORDER")
    if not path:
        return
    durations = earlier_durations(Path(path))
    items.sort(key=lambda item: -durations.get(item.nodeid, math.inf))  # stable: ties keep their order


@pytest.hookimpl
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get("SUITE_DURATIONS")
    failed = report.outcome == "failed"
    slow = report.duration >= SLOW_FIXTURE_SECONDS
    in_worker = "PYTEST_XDIST_WORKER" in os.environ
    if not path or in_worker or not (report.when == "call" or failed or slow):
        return
    node = getattr(report, "node", None)  # under pytest-xdist, the worker that ran it
    worker = node.gateway.id if node is not None else "-"
    ended = time.monotonic() - RUN_BEGAN
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"{report.duration:.2f}\t{report.outcome}\t{report.nodeid}\t{report.when}\t{worker}\t{ended:.0f}\n")
