"""Tests for keras_transformer.runs: the run directory's layout, loading and config."""

import json
import os
import subprocess
import sys

import pytest

from keras_transformer import TrainingConfig
from keras_transformer import runs
from tests.translation_fixtures import make_model
from tests.translation_fixtures import make_run_dir

pytestmark = pytest.mark.keeps_graphs


@pytest.fixture(scope="module")
def model(tokenizer):
    return make_model(tokenizer.vocab_size)


def test_load_run_reports_missing_pieces(tmp_path, model, tokenizer):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        runs.load_run(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        runs.load_run(str(tmp_path))
    run = make_run_dir(tmp_path / "run", tokenizer, model)
    os.remove(os.path.join(run, runs.AVERAGED_WEIGHTS))
    with pytest.raises(FileNotFoundError, match="try weights='final'"):
        runs.load_run(run)
    loaded, _, config = runs.load_run(run, "final")
    assert loaded.config == model.config and config["model"] == model.config.to_dict()


def test_config_is_written_whole_and_read_back(tmp_path, model):
    run = str(tmp_path / "run")
    training = TrainingConfig(steps=7)
    runs.write_config(run, model.config, training)
    assert os.listdir(run) == [runs.CONFIG]  # no temporary file left behind
    with open(os.path.join(run, runs.CONFIG)) as f:
        assert json.load(f) == runs.read_config(run)
    assert runs.read_config(run) == {"model": model.config.to_dict(),
                                     "training": training.to_dict()}
    assert runs.read_config(str(tmp_path / "none")) is None


def test_a_resumed_run_may_change_only_how_long_it_trains(tmp_path, model):
    run = str(tmp_path / "run")
    fields = TrainingConfig(model="tiny", steps=7).to_dict()
    config, model_config, saved = runs.resolve_configs(run, fields, {"model", "steps"})
    assert saved is None and config.steps == 7 and model_config.d_model == 64
    runs.write_config(run, model_config, config)

    longer = dict(fields, steps=20, time_budget=3.0)
    config, resumed_model, saved = runs.resolve_configs(run, longer, {"steps", "time_budget"})
    assert (config.steps, config.time_budget) == (20, 3.0)
    assert resumed_model == model_config and saved["training"]["steps"] == 7
    with pytest.raises(ValueError, match=r"other settings \({'tokens_per_batch': 99}"):
        runs.resolve_configs(run, dict(fields, tokens_per_batch=99), {"tokens_per_batch"})
    runs.check_same_model(run, saved, model_config)
    wider = runs.resolve_configs(run, fields, set(), {"d_model": 128})[1]
    with pytest.raises(ValueError, match=r"another shape \({'d_model': 128}"):
        runs.check_same_model(run, saved, wider)


def test_a_file_is_whole_or_absent_and_temporaries_carry_the_pid(tmp_path):
    path = str(tmp_path / "model.weights.h5")
    seen = []

    def crash(temporary):
        seen.append(os.path.basename(temporary))
        with open(temporary, "w") as f:
            f.write("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        runs.write_atomically(path, crash)
    assert seen == [f"model.tmp-{os.getpid()}.weights.h5"]  # Keras's suffix kept
    assert os.listdir(tmp_path) == []

    runs.write_atomically(path, lambda temporary: open(temporary, "w").write("whole"))
    assert open(path).read() == "whole" and os.listdir(tmp_path) == ["model.weights.h5"]

    def directory(temporary):
        os.makedirs(temporary)
        open(os.path.join(temporary, "file"), "w").write("x")

    runs.write_atomically(str(tmp_path / "vocab"), directory)
    assert os.listdir(tmp_path / "vocab") == ["file"]


def test_what_killed_writers_left_is_removed(tmp_path):
    run = tmp_path / "run"
    (run / runs.CHECKPOINTS).mkdir(parents=True)
    left = [run / "config.tmp-12.json", run / runs.CHECKPOINTS / "ckpt-00000004.tmp-12.weights.h5",
            run / "config.json.tmp-7"]
    for path in left:
        path.write_text("partial")
    (run / "vocab.tmp-12").mkdir()
    kept = [run / runs.CONFIG, run / runs.CHECKPOINTS / "ckpt-00000002.weights.h5"]
    for path in kept:
        path.write_text("whole")
    removed = runs.remove_temporaries(str(run))
    assert sorted(removed) == sorted(["config.tmp-12.json", "config.json.tmp-7", "vocab.tmp-12",
                                      os.path.join(runs.CHECKPOINTS,
                                                   "ckpt-00000004.tmp-12.weights.h5")])
    assert all(path.exists() for path in kept) and not any(path.exists() for path in left)


_HOLD_LOCK = """
import sys, time
from keras_transformer import runs
runs.RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_one_trainer_per_run_directory(tmp_path, capsys):
    run = str(tmp_path / "run")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, run], stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=root))
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(runs.RunLockedError,
                           match=f"run is in use by pid {holder.pid} on .* since .*; wait for"):
            runs.RunLock(run).acquire()
    finally:
        holder.kill()
        holder.wait()
    # Killed while holding it: the system dropped the lock, the file still names it.
    lock = runs.RunLock(run).acquire()
    assert f"from pid {holder.pid} on" in capsys.readouterr().err
    assert f"pid {os.getpid()} on" in open(os.path.join(run, runs.LOCK)).read()
    lock.release()
    assert open(os.path.join(run, runs.LOCK)).read() == ""  # a clean end: no notice next time
    runs.RunLock(run).acquire().release()
    assert capsys.readouterr().err == ""


def test_a_swapped_vocabulary_is_refused_on_resume(tmp_path, model, tokenizer):
    run = make_run_dir(tmp_path / "run", tokenizer, model)
    saved = runs.read_config(run)
    assert saved["vocab_sha256"] == runs.vocabulary_digest(os.path.join(run, runs.VOCAB))
    runs.check_same_vocabulary(run, saved)
    with open(os.path.join(run, runs.VOCAB, "subword.vocab"), "a") as f:
        f.write("extra\t0\n")
    with pytest.raises(ValueError, match="is not the vocabulary this run was trained with"):
        runs.check_same_vocabulary(run, saved)
