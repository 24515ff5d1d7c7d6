"""A pytest plugin that appends each test's wall time to a file as soon as the test ends.

`pytest --durations` prints only when the whole run ends, so a suite stopped at a time limit
says nothing about where its time went. Loaded with `-p perf.suite_durations` and
SUITE_DURATIONS=FILE (perf/gpu_check.sh does both), it appends one line per test phase,
`seconds<TAB>outcome<TAB>node id<TAB>phase<TAB>worker<TAB>seconds since the run began`, for
every call and for each setup or teardown of a second or more (module fixtures that build an
engine are paid once per worker that runs the module's tests); `sort -rn FILE | head` then
names the slowest, and the last two columns show how each worker spent the run. Under
pytest-xdist the controller writes (every worker's report reaches it), the workers do not.

With SUITE_ORDER=FILE (an earlier run's file), the tests run slowest first (a test the file
does not know counts as the slowest it knows): a long test collected last would run alone
after every other worker is done. Under `--dist worksteal` the order is also dealt out
for the workers: worksteal hands worker i the i-th contiguous slice of the collection and
later moves only the ends of the longest queues, so a plain slowest-first order gave the
first worker the suite's longest tests one after another (the 01e94c0 run: 342 s of tests
on one worker, 188 s on another). Each slice is instead filled longest test first into
whichever slice holds the least time (the longest-processing-time rule), and runs slowest
first. Every worker reads the same file, so they all collect the same order, as
pytest-xdist requires.
"""

import heapq
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


def worksteal_slices(count: int, workers: int) -> list[int]:
    """The sizes of the slices pytest-xdist's worksteal scheduler first hands `workers`
    workers from `count` tests: each takes an even share of what is left."""
    sizes = []
    for i in range(workers):
        sizes.append((count - sum(sizes)) // (workers - i))
    return sizes


def deal(seconds: list[float], workers: int) -> list[int]:
    """An order of the tests (indices into `seconds`) whose worksteal slices hold about equal
    time: longest first into the slice with the least time and room left, each slice then
    slowest first."""
    sizes = worksteal_slices(len(seconds), workers)
    slices: list[list[int]] = [[] for _ in range(workers)]
    loads = [(0.0, i) for i in range(workers) if sizes[i]]
    for test in sorted(range(len(seconds)), key=lambda t: -seconds[t]):  # stable: ties keep their order
        load, i = heapq.heappop(loads)
        slices[i].append(test)
        if len(slices[i]) < sizes[i]:
            heapq.heappush(loads, (load + seconds[test], i))
    return [test for tests in slices for test in tests]


@pytest.hookimpl
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = os.environ.get("SUITE_ORDER")
    if not path:
        return
    durations = earlier_durations(Path(path))
    slowest = max(durations.values(), default=0.0)
    seconds = [durations.get(item.nodeid, slowest) for item in items]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if config.getoption("dist", "no") != "worksteal":
        workers = 1
    items[:] = [items[i] for i in deal(seconds, workers)]


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
