"""tests.made_once: what several pytest-xdist workers read from disk is made once."""

import os
import subprocess
import sys
import types

import pytest

from tests import made_once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A worker: its own base temporary directory under the session's, as pytest-xdist's.
WORKER = """
import sys, time, types, pathlib
sys.path.insert(0, sys.argv[1])
from tests import made_once
top = pathlib.Path(sys.argv[2])

def make(directory):
    with open(top / "calls", "a") as f:
        f.write(sys.argv[3] + "\\n")
    time.sleep(1.0)  # the other worker asks meanwhile
    (directory / "made").write_text(sys.argv[3])

factory = types.SimpleNamespace(getbasetemp=lambda: top / ("popen-" + sys.argv[3]))
print(made_once(factory, "thing", make))
"""


def test_two_workers_asking_at_once_share_one_making(tmp_path):
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, ROOT, str(tmp_path), name],
                                stdout=subprocess.PIPE, text=True,
                                env=dict(os.environ, PYTEST_XDIST_WORKER=name))
               for name in ("gw0", "gw1")]
    directories = [worker.communicate(timeout=60)[0].strip() for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0]
    assert directories == [str(tmp_path / "thing")] * 2
    calls = (tmp_path / "calls").read_text().split()
    assert len(calls) == 1 and (tmp_path / "thing" / "made").read_text() == calls[0]


def test_a_failed_making_is_made_again_by_the_next_to_ask(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    factory = types.SimpleNamespace(getbasetemp=lambda: tmp_path)

    def fail(directory):
        (directory / "half").write_text("")
        raise RuntimeError("no space left")

    with pytest.raises(RuntimeError, match="no space left"):
        made_once(factory, "thing", fail)
    made = made_once(factory, "thing", lambda directory: (directory / "whole").write_text(""))
    assert sorted(os.listdir(made)) == ["whole"]  # the failed one's files gone
    # Made: the next to ask does not make it again.
    assert made_once(factory, "thing", fail) == made
