"""Tests for keras_transformer.durable: whole-or-absent files, leftovers of killed
writers, and one writer per run directory."""

import os
import subprocess
import sys

import pytest

from keras_transformer import durable
from tests import python_path


def test_a_file_is_whole_or_absent_and_temporaries_carry_the_pid(tmp_path):
    path = str(tmp_path / "model.weights.h5")
    seen = []

    def crash(temporary):
        seen.append(os.path.basename(temporary))
        with open(temporary, "w") as f:
            f.write("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        durable.write_atomically(path, crash)
    assert seen == [f"model.tmp-{os.getpid()}.weights.h5"]  # Keras's suffix kept
    assert os.listdir(tmp_path) == []

    durable.write_atomically(path, lambda temporary: open(temporary, "w").write("whole"))
    assert open(path).read() == "whole" and os.listdir(tmp_path) == ["model.weights.h5"]

    def directory(temporary):
        os.makedirs(temporary)
        open(os.path.join(temporary, "file"), "w").write("x")

    durable.write_atomically(str(tmp_path / "vocab"), directory)
    assert os.listdir(tmp_path / "vocab") == ["file"]


def test_what_killed_writers_left_is_removed(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    left = [run / "config.tmp-12.json", run / "checkpoints" / "ckpt-00000004.tmp-12.weights.h5",
            run / "config.json.tmp-7"]
    for path in left:
        path.write_text("partial")
    (run / "vocab.tmp-12").mkdir()
    kept = [run / "config.json", run / "checkpoints" / "ckpt-00000002.weights.h5"]
    for path in kept:
        path.write_text("whole")
    removed = durable.remove_temporaries(str(run))
    assert sorted(removed) == sorted(["config.tmp-12.json", "config.json.tmp-7", "vocab.tmp-12",
                                      os.path.join("checkpoints", "ckpt-00000004.tmp-12.weights.h5")])
    assert all(path.exists() for path in kept) and not any(path.exists() for path in left)


# Holds the lock until its stdin closes (or it is killed), however long the test takes.
_HOLD_LOCK = """
import sys
from keras_transformer import durable
durable.RunLock(sys.argv[1]).acquire()
print("held", flush=True)
sys.stdin.read()
"""


def test_one_trainer_per_run_directory(tmp_path, capsys):
    run = str(tmp_path / "run")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, run], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=python_path(root)))
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(durable.RunLockedError,
                           match=f"run is in use by pid {holder.pid} on .* since .*; wait for"):
            durable.RunLock(run).acquire()
    finally:
        holder.kill()
        holder.wait()
    # Killed while holding it: the system dropped the lock, the file still names it.
    lock = durable.RunLock(run).acquire()
    assert f"from pid {holder.pid} on" in capsys.readouterr().err
    assert f"pid {os.getpid()} on" in open(os.path.join(run, durable.LOCK)).read()
    lock.release()
    assert open(os.path.join(run, durable.LOCK)).read() == ""  # a clean end: no notice next time
    durable.RunLock(run).acquire().release()
    assert capsys.readouterr().err == ""
