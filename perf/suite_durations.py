"""A pytest plugin that appends each test's wall time to a file as soon as the test ends.

`pytest --durations` prints only when the whole run ends, so a suite stopped at a time limit
says nothing about where its time went. Loaded with `-p perf.suite_durations` and
SUITE_DURATIONS=FILE (perf/gpu_check.sh does both), it appends one line per test,
`seconds<TAB>outcome<TAB>node id`; `sort -rn FILE | head` then names the slowest. Under
pytest-xdist the controller writes (every worker's report reaches it), the workers do not.

With SUITE_ORDER=FILE (an earlier run's file), the tests run slowest first, tests the file
does not know ahead of all: pytest-xdist hands tests out in collection order, so a long test
collected last would run alone after every other worker is done. Every worker reads the same
file, so they all collect the same order, as pytest-xdist requires.
"""

import math
import os
from pathlib import Path

import pytest


def earlier_durations(path: Path) -> dict[str, float]:
    """Each node id's seconds in a file this plugin wrote (the last line for an id wins)."""
    durations = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        seconds, _outcome, node_id = line.split("\t", 2)
        durations[node_id] = float(seconds)
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
    failed_setup = report.when == "setup" and report.outcome != "passed"
    in_worker = "PYTEST_XDIST_WORKER" in os.environ
    if not path or in_worker or not (report.when == "call" or failed_setup):
        return
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"{report.duration:.2f}\t{report.outcome}\t{report.nodeid}\n")
