"""Tests for keras_transformer.durable: whole-or-absent files, leftovers of killed
writers, and one writer per run directory."""

import errno
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


# TensorFlow 2.21's error when TensorBoard's writer flushes onto a full disk.
_FLUSH_ON_A_FULL_DISK = (
    "{{function_node __wrapped__FlushSummaryWriter_device_/job:localhost/replica:0/task:0/"
    "device:CPU:0}} /runs/a b/logs/validation/events.out.tfevents.1.v2; No space left on "
    "device\n\tFailed to flush 4 events to /runs/a b/logs/validation/events.out.tfevents.1.v2"
    "\n\tCould not flush events file. [Op:FlushSummaryWriter] name: ")


def test_tensorflows_full_disk_error_names_the_file_it_failed_on():
    import tensorflow as tf

    error = durable.full_disk_error(tf.errors.ResourceExhaustedError(
        None, None, _FLUSH_ON_A_FULL_DISK))
    assert (error.errno, error.strerror) == (errno.ENOSPC, "No space left on device")
    assert error.filename == "/runs/a b/logs/validation/events.out.tfevents.1.v2"
    assert durable.full_disk_error(_FLUSH_ON_A_FULL_DISK, "/export/1").filename == "/export/1"
    quota = durable.full_disk_error("x.pb; " + os.strerror(errno.EDQUOT))
    assert (quota.errno, quota.filename) == (errno.EDQUOT, "x.pb")
    assert durable.full_disk_error("OOM when allocating tensor with shape[4096,4096]") is None


def test_a_full_disk_is_named_and_the_file_keras_left_open_is_closed(tmp_path, monkeypatch):
    """Keras's save_weights leaves its HDF5 file open when a write fails (a full
    disk): h5py would flush it as the process ends, fail again and crash the
    interpreter (a segmentation fault after the traceback, seen on a full tmpfs).
    write_atomically closes it, removes the temporary, and names the system's
    error and the file it was writing, where h5py says "Can't synchronously
    write data (file write failed: time = ...)"."""
    import h5py
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    path = str(tmp_path / "ckpt-00000006.weights.h5")
    create_dataset = h5py.Group.create_dataset
    written = []

    def fills_the_disk(self, *args, **kwargs):
        if written:  # the second array finds the disk full
            raise OSError(errno.ENOSPC, "Can't synchronously write data (file write failed: "
                          "time = Sun Nov 29 11:17:26 2026, errno = 28, error message = 'No "
                          "space left on device')")
        written.append(args)
        return create_dataset(self, *args, **kwargs)

    monkeypatch.setattr(h5py.Group, "create_dataset", fills_the_disk)
    with pytest.raises(OSError) as raised:
        durable.write_atomically(path, model.save_weights)
    assert written  # a file was open and half written
    assert str(raised.value) == f"[Errno 28] No space left on device: '{path}'"
    assert os.listdir(tmp_path) == []
    open_files = [file_id.name for file_id in
                  h5py.h5f.get_obj_ids(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE)]
    assert not [name for name in open_files if str(tmp_path).encode() in name], open_files


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
