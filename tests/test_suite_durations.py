"""The GPU suite's schedule: perf/suite_durations.py orders tests slowest first by an earlier run."""

from types import SimpleNamespace

from perf import suite_durations


def config(dist="no"):
    return SimpleNamespace(getoption=lambda name, default=None: dist if name == "dist" else default)


def test_tests_run_slowest_first_and_unknown_tests_count_as_the_slowest(tmp_path, monkeypatch):
    earlier = tmp_path / "durations.tsv"
    earlier.write_text("1.50\tpassed\tt.py::fast\n90.00\tfailed\tt.py::slow\n3.00\tpassed\tt.py::fast\n")
    monkeypatch.setenv("SUITE_ORDER", str(earlier))
    items = [SimpleNamespace(nodeid=name) for name in ("t.py::fast", "t.py::new", "t.py::slow", "t.py::other_new")]
    suite_durations.pytest_collection_modifyitems(config(), items)
    # the last line for an id wins (fast: 3.00); ties keep their collection order
    assert [item.nodeid for item in items] == ["t.py::new", "t.py::slow", "t.py::other_new", "t.py::fast"]


def test_without_suite_order_the_collection_order_stays(monkeypatch):
    monkeypatch.delenv("SUITE_ORDER", raising=False)
    items = [SimpleNamespace(nodeid=name) for name in ("b", "a")]
    suite_durations.pytest_collection_modifyitems(config("worksteal"), items)
    assert [item.nodeid for item in items] == ["b", "a"]


def test_worksteal_slices_are_xdists_even_shares_of_what_is_left():
    # xdist 3.8's WorkStealingScheduling.check_schedule: len(pending) // nodes_remaining
    assert suite_durations.worksteal_slices(10, 4) == [2, 2, 3, 3]
    assert suite_durations.worksteal_slices(3, 4) == [0, 1, 1, 1]


def test_worksteal_slices_get_about_equal_time_each_slowest_first(tmp_path, monkeypatch):
    earlier = tmp_path / "durations.tsv"
    times = {"a": 1, "b": 100, "c": 1, "d": 90, "e": 80, "f": 1, "g": 70, "h": 1}
    earlier.write_text("".join(f"{seconds}\tpassed\tt.py::{name}\n" for name, seconds in times.items()))
    monkeypatch.setenv("SUITE_ORDER", str(earlier))
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    items = [SimpleNamespace(nodeid=f"t.py::{name}") for name in times]
    suite_durations.pytest_collection_modifyitems(config("worksteal"), items)
    # slices of four: 100 + 70 + 1 + 1 and 90 + 80 + 1 + 1, the best split (slowest first
    # would give 340 and 4)
    assert [item.nodeid[-1] for item in items] == ["b", "g", "a", "f", "d", "e", "c", "h"]


def test_a_tests_phases_add_up_and_old_three_column_lines_are_calls(tmp_path):
    earlier = tmp_path / "durations.tsv"
    earlier.write_text(
        "2.00\tpassed\tt.py::a\n"
        "40.00\tpassed\tt.py::b\tsetup\tgw1\t40\n"
        "5.00\tpassed\tt.py::b\tcall\tgw1\t45\n"
        "7.00\tpassed\tt.py::b\tcall\tgw2\t60\n"
    )
    # b: its setup plus its last call
    assert suite_durations.earlier_durations(earlier) == {"t.py::a": 2.0, "t.py::b": 47.0}


def test_a_worker_report_is_logged_with_its_phase_and_worker(tmp_path, monkeypatch):
    log = tmp_path / "log.tsv"
    monkeypatch.setenv("SUITE_DURATIONS", str(log))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    worker = SimpleNamespace(gateway=SimpleNamespace(id="gw3"))

    def report(when, duration, outcome="passed"):
        return SimpleNamespace(when=when, duration=duration, outcome=outcome, nodeid="t.py::x", node=worker)

    for phase in (report("setup", 12.0), report("call", 0.5), report("teardown", 0.1), report("setup", 0.2, "failed")):
        suite_durations.pytest_runtest_logreport(phase)
    lines = [line.split("\t") for line in log.read_text().splitlines()]
    assert [(seconds, outcome, phase, gw) for seconds, outcome, _, phase, gw, _ in lines] == [
        ("12.00", "passed", "setup", "gw3"),
        ("0.50", "passed", "call", "gw3"),
        ("0.20", "failed", "setup", "gw3"),
    ]
