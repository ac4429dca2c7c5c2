"""A pytest plugin: with CI_NO_SKIPS=1 in the environment, a session in which a
test was skipped for a reason outside `ALLOWED_SKIPS` fails, naming the tests.

A skip hides a check; CI (.ci/run) runs on a CPU with the test extra installed,
so the only tests it may skip are those that need hardware it lacks. Loaded by
tests/conftest.py; imports no TensorFlow (tests/test_skip_check.py runs it on
its own).
"""

import os
import re

import pytest

# Skip reasons that CI may show: checks of hardware a CPU runner lacks.
ALLOWED_SKIPS = (
    re.compile(r"needs a GPU"),
)
VARIABLE = "CI_NO_SKIPS"

_skipped = []


def _reason(report):
    if isinstance(report.longrepr, tuple):  # (path, line, "Skipped: reason")
        return report.longrepr[2]
    return str(report.longrepr)


def pytest_collectreport(report):
    if report.skipped:  # a module skipped as a whole (pytest.importorskip at its top)
        _skipped.append((report.nodeid, _reason(report)))


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append((report.nodeid, _reason(report)))


def hidden_skips(skipped):
    """The `(node id, reason)` pairs whose reason no `ALLOWED_SKIPS` pattern matches."""
    return [(node, reason) for node, reason in skipped
            if not any(pattern.search(reason) for pattern in ALLOWED_SKIPS)]


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get(VARIABLE) != "1":
        return
    hidden = hidden_skips(_skipped)
    if not hidden:
        return
    terminal = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{VARIABLE}=1: {len(hidden)} test(s) skipped for a reason CI does not allow "
             "(tests/skip_check.py ALLOWED_SKIPS):"]
    lines += [f"  {node}: {reason}" for node, reason in hidden]
    for line in lines:
        if terminal is not None:
            terminal.write_line(line, red=True)
        else:
            print(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
