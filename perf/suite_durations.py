"""A pytest plugin that appends each test's wall time to a file as soon as the test ends.

`pytest --durations` prints only when the whole run ends, so a suite stopped at a time limit
says nothing about where its time went. Loaded with `-p perf.suite_durations` and
SUITE_DURATIONS=FILE (perf/gpu_check.sh does both), it appends one line per test,
`seconds<TAB>outcome<TAB>node id`; `sort -rn FILE | head` then names the slowest. Under
pytest-xdist the controller writes (every worker's report reaches it), the workers do not.
"""

import os

import pytest


@pytest.hookimpl
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get("SUITE_DURATIONS")
    failed_setup = report.when == "setup" and report.outcome != "passed"
    in_worker = "PYTEST_XDIST_WORKER" in os.environ
    if not path or in_worker or not (report.when == "call" or failed_setup):
        return
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"{report.duration:.2f}\t{report.outcome}\t{report.nodeid}\n")
