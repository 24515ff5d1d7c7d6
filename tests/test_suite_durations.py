"""The GPU suite's schedule: perf/suite_durations.py orders tests slowest first by an earlier run."""

from types import SimpleNamespace

from perf import suite_durations


def test_tests_run_slowest_first_and_unknown_tests_lead(tmp_path, monkeypatch):
    earlier = tmp_path / "durations.tsv"
    earlier.write_text("1.50\tpassed\tt.py::fast\n90.00\tfailed\tt.py::slow\n3.00\tpassed\tt.py::fast\n")
    monkeypatch.setenv("SUITE_ORDER", str(earlier))
    items = [SimpleNamespace(nodeid=name) for name in ("t.py::fast", "t.py::new", "t.py::slow", "t.py::other_new")]
    suite_durations.pytest_collection_modifyitems(items)
    # the last line for an id wins (fast: 3.00); unknown tests keep their collection order
    assert [item.nodeid for item in items] == ["t.py::new", "t.py::other_new", "t.py::slow", "t.py::fast"]


def test_without_suite_order_the_collection_order_stays(monkeypatch):
    monkeypatch.delenv("SUITE_ORDER", raising=False)
    items = [SimpleNamespace(nodeid=name) for name in ("b", "a")]
    suite_durations.pytest_collection_modifyitems(items)
    assert [item.nodeid for item in items] == ["b", "a"]
