"""bench/suite_stability.py reads a suite's log: summary, failures, slowest tests."""

from __future__ import annotations

from bench.suite_stability import _parse

LOG = """\
== pytest
........F.
============================= slowest 25 durations =============================
61.20s call     tests/ui/test_ui_browser.py::test_monitor_follows_a_live_run_in_chromium
3.50s setup    tests/store/test_pg.py::test_roundtrip[pg]
0.01s teardown tests/a.py::b
=========================== short test summary info ============================
FAILED tests/ui/test_ui_browser.py::test_monitor_follows_a_live_run_in_chromium - E
ERROR tests/store/test_pg.py::test_roundtrip[pg] - OSError
= 1 failed, 1782 passed, 2 skipped, 2 deselected, 1 error in 1499.01s (0:24:59) =
"""


def test_a_failed_suite_names_its_failures_and_slowest_tests() -> None:
    parsed = _parse(LOG)
    assert (
        parsed["summary"] == "1 failed, 1782 passed, 2 skipped, 2 deselected, 1 error"
    )
    assert parsed["failed_tests"] == [
        "tests/store/test_pg.py::test_roundtrip[pg]",
        "tests/ui/test_ui_browser.py::test_monitor_follows_a_live_run_in_chromium",
    ]
    assert [s["seconds"] for s in parsed["slowest"]] == [61.2, 3.5, 0.01]
    assert parsed["slowest"][1]["phase"] == "setup"


def test_a_suite_that_never_reached_pytest_has_no_summary() -> None:
    parsed = _parse("== ruff\nE501 line too long\nmake: *** [test] Error 1\n")
    assert parsed == {"summary": None, "failed_tests": [], "slowest": []}
