"""tests/skip_check.py, run on small test files in pytest processes of their own."""

import os
import subprocess
import sys

from tests import python_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = '''
import pytest

def test_passes():
    pass

@pytest.mark.skipif(True, reason="needs a GPU")
def test_on_a_gpu():
    pass

def test_without_a_dependency():
    pytest.importorskip("a_module_that_is_not_installed")
'''


def pytest_session(tmp_path, variable, *selection):
    (tmp_path / "test_cases.py").write_text(CASES)
    environment = dict(os.environ, PYTHONPATH=python_path(ROOT))
    environment.pop("CI_NO_SKIPS", None)
    if variable is not None:
        environment["CI_NO_SKIPS"] = variable
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.skip_check", "-p", "no:cacheprovider",
         "-rs", "-q", "--rootdir", str(tmp_path), str(tmp_path / "test_cases.py"), *selection],
        capture_output=True, text=True, cwd=tmp_path, env=environment, timeout=300)


def test_a_skip_for_a_missing_dependency_fails_ci(tmp_path):
    result = pytest_session(tmp_path, "1")
    assert result.returncode == 1, result.stdout
    assert "CI_NO_SKIPS=1: 1 test(s) skipped" in result.stdout
    assert "test_cases.py::test_without_a_dependency: " in result.stdout
    assert "test_on_a_gpu: " not in result.stdout.split("CI_NO_SKIPS=1:")[1]


def test_allowed_skips_and_sessions_without_the_variable_pass(tmp_path):
    assert pytest_session(tmp_path, "1", "-k", "not dependency").returncode == 0
    result = pytest_session(tmp_path, None)
    assert result.returncode == 0, result.stdout
    assert "2 skipped" in result.stdout and "CI_NO_SKIPS" not in result.stdout
