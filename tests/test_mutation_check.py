"""scripts/mutation_check.py's mutants stay applicable: each names one line of
the package, which exists exactly once, and tests that exist (the check itself
runs them, minutes per mutant: `python scripts/mutation_check.py`)."""

import ast
import contextlib
import io
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import mutation_check  # noqa: E402


@pytest.mark.parametrize("mutant", mutation_check.MUTANTS, ids=lambda m: m["name"])
def test_mutant_applies_to_one_line_and_names_existing_tests(mutant, tmp_path):
    copy = tmp_path / os.path.basename(mutant["path"])
    with open(os.path.join(ROOT, mutant["path"]), encoding="utf-8") as f:
        original = f.read()
    copy.write_text(original, encoding="utf-8")
    mutation_check.apply(str(copy), mutant["old"], mutant["new"])  # raises unless one line
    mutated = copy.read_text(encoding="utf-8")
    assert mutated != original
    if mutant["path"].endswith(".py"):
        ast.parse(mutated)  # still Python: the tests fail on the defect, not on a typo
    for test in mutant["tests"]:
        path, _, name = test.partition("::")  # name: function, or Class::method
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            source = f.read()
        assert all(f"class {part}" in source if part[0].isupper() else f"def {part}(" in source
                   for part in name.split("::") if part), test


def test_names_are_unique():
    names = [m["name"] for m in mutation_check.MUTANTS]
    assert len(names) == len(set(names)) >= 10


@pytest.mark.slow
def test_every_mutant_is_caught():
    """The check itself: each mutant applied to a copy makes its tests fail
    (4 to 21 minutes on 2 cores, each test run stopping at its first failure), or
    in CI a third of them (MUTATION_SHARD="K/3", which .ci/run turns with the
    number of commits). The mutants marked slow are left to `python
    scripts/mutation_check.py` by hand: each costs a minute or more of XLA
    compilations or training, and CI's run of every test must stay within its 90
    minutes."""
    import json
    import subprocess

    shard = os.environ.get("MUTATION_SHARD")
    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "mutation_check.py"),
                             "--skip-slow", "--jobs", "2", *(["--shard", shard] if shard else [])],
                            capture_output=True, text=True, timeout=3000)
    assert result.stdout, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert (report["missed"], report["stale"]) == ([], []), result.stderr[-3000:]
    fast = [m for m in mutation_check.MUTANTS if not m["slow"]]
    if shard:
        k, n = map(int, shard.split("/"))
        fast = fast[k - 1::n]
    assert [m["name"] for m in report["mutants"]] == [m["name"] for m in fast]
    assert report["caught"] == report["total"] == len(fast) > 0
    assert result.returncode == 0


def test_a_shard_is_every_nth_mutant_and_the_shards_are_all_of_them():
    listed = {}
    for k in (1, 2, 3):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert mutation_check.main(["--skip-slow", "--shard", f"{k}/3", "--list"]) == 0
        listed[k] = out.getvalue().split()
    fast = [m["name"] for m in mutation_check.MUTANTS if not m["slow"]]
    assert listed[2] == fast[1::3] and len(listed[1]) >= len(listed[3]) >= len(fast) // 3
    assert sorted(sum(listed.values(), [])) == sorted(fast)
    for shard in ("0/3", "4/3", "a/b", "3"):
        with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            mutation_check.main(["--shard", shard, "--list"])


@pytest.mark.slow
def test_the_test_server_runs_each_request_in_a_fresh_child_of_the_copy(tmp_path):
    """A mutant counts as caught on exit status 1 alone: a passing run answers 0, a
    failing one 1, one past its timeout None (its child stopped), and each run
    imports the copy's package anew, as its mutant left it."""
    copy = tmp_path / "copy"
    copy.mkdir()
    mutation_check.copy_repository(str(copy))
    (copy / "tests" / "test_probe.py").write_text(
        "import time\n"
        "import keras_transformer\n"
        "def test_passes():\n    assert keras_transformer.MARK == 1\n"
        "def test_fails():\n    assert keras_transformer.MARK == 2\n"
        "def test_sleeps():\n    time.sleep(60)\n", encoding="utf-8")
    init = copy / "keras_transformer" / "__init__.py"
    original = init.read_text(encoding="utf-8")
    init.write_text(original + "\nMARK = 1\n", encoding="utf-8")
    server = mutation_check.TestServer(str(copy))
    try:
        server.check_package_is_the_copy()
        assert server.run_tests(["tests/test_probe.py::test_passes"], 120)[0] == 0
        status, summary = server.run_tests(["tests/test_probe.py::test_fails"], 120)
        assert status == 1 and summary.endswith("tests/test_probe.py::test_fails failed")
        init.write_text(original + "\nMARK = 2\n", encoding="utf-8")  # a mutant's edit
        assert server.run_tests(["tests/test_probe.py::test_fails"], 120)[0] == 0
        assert server.run_tests(["tests/test_probe.py::test_sleeps"], 3) == (None, "timed out")
        assert server.run_tests(["tests/test_probe.py::test_no_such_test"], 120)[0] == 4
    finally:
        server.close()
