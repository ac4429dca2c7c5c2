"""train.py as a user runs it: errors, and a run killed and resumed."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

import keras_transformer  # noqa: F401  (registers the classes model.keras holds)
from keras_transformer.training import list_checkpoints
from tests.test_distributed import free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Small and quick: a 600-token vocabulary, short sentences, tiny batches.
QUICK = ["--vocab-size", "600", "--vocab-sentences", "4000", "--max-length", "24",
         "--tokens-per-batch", "256", "--checkpoint-every", "2", "--steps", "6",
         "--average-last", "2", "--test-sentences", "0", "--warmup-steps", "4"]


def _train(args, wait=True, capture=False, **environment):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", **environment)
    command = [sys.executable, os.path.join(ROOT, "train.py"), *args]
    if not wait:
        output = subprocess.PIPE if capture else subprocess.DEVNULL
        return subprocess.Popen(command, env=env, stdout=output, stderr=output, text=True)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "many"], "argument --steps: invalid int value: 'many'"),
        (["--strategy", "gpu8"], "strategy must be auto, one_device"),
        (["--model", "huge"], "model must be one of tiny, base"),
        (["--data", "nowhere/{split}.en,nowhere/{split}.es"], "nowhere/train.en"),
        (["--data", "corpus.en,corpus.es"], "need a '{split}' placeholder"),
    ],
)
def test_bad_flags_and_paths_give_one_line(args, message, tmp_path):
    result = _train([*args, "--out", str(tmp_path / "run")])
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("train.py")]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_killed_run_resumes_like_an_uninterrupted_one(tmp_path):
    whole, interrupted = str(tmp_path / "whole"), str(tmp_path / "interrupted")
    assert _train([*QUICK, "--out", whole]).returncode == 0

    # Kill the second run as soon as its first checkpoint exists (mid-training).
    process = _train([*QUICK, "--out", interrupted], wait=False)
    first = os.path.join(interrupted, "checkpoints", "ckpt-00000002.weights.h5")
    deadline = time.time() + 600
    while not os.path.exists(first) and process.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not os.path.exists(os.path.join(interrupted, "model.keras"))

    resumed = _train([*QUICK, "--out", interrupted])
    assert resumed.returncode == 0, resumed.stderr
    assert "Resuming" in resumed.stdout

    expected = keras.saving.load_model(os.path.join(whole, "model.keras"))
    actual = keras.saving.load_model(os.path.join(interrupted, "model.keras"))
    assert int(actual.optimizer.iterations.numpy()) == 6
    for a, b in zip(actual.get_weights(), expected.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    for a, b in zip(actual.optimizer.variables, expected.optimizer.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)


@pytest.mark.slow
def test_multi_worker_run_trains_and_resumes(tmp_path):
    """Two workers on localhost (TF_CONFIG), one shared run directory that only the
    chief writes, dev BLEU (beam search on the distributed model's weights) every
    checkpoint; run again with more steps, both resume from its checkpoint."""
    run = str(tmp_path / "run")
    workers = [f"localhost:{port}" for port in free_ports(2)]

    def train_on_two_workers(steps):
        processes = [
            _train([*QUICK, "--steps", str(steps), "--strategy", "multi_worker",
                    "--bleu-every", "2", "--bleu-sentences", "4", "--out", run],
                   wait=False, capture=True,
                   TF_CONFIG=json.dumps({"cluster": {"worker": workers},
                                         "task": {"type": "worker", "index": index}}))
            for index in range(2)
        ]
        outputs = [process.communicate(timeout=900) for process in processes]
        for process, (_, stderr) in zip(processes, outputs):
            assert process.returncode == 0, stderr[-3000:]
        return [stdout for stdout, _ in outputs]

    train_on_two_workers(4)
    assert [step for step, _ in list_checkpoints(os.path.join(run, "checkpoints"))] == [2, 4]
    for stdout in train_on_two_workers(6):
        assert f"Resuming {run} at step 4." in stdout
    model = keras.saving.load_model(os.path.join(run, "model.keras"))
    assert int(model.optimizer.iterations.numpy()) == 6
    with open(os.path.join(run, "log.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3  # one row per epoch: one writer
    assert all(0.0 <= float(row["bleu"]) <= 100.0 for row in rows)


@pytest.mark.slow
def test_main_job_end_to_end(tmp_path):
    """What scripts/quickstart.sh does, small: train, export, translate, BLEU."""
    run, export = str(tmp_path / "run"), str(tmp_path / "export")
    trained = _train([*QUICK, "--test-sentences", "5", "--out", run])
    assert trained.returncode == 0, trained.stderr
    assert "Test BLEU on 5 sentences" in trained.stdout
    for name in ("config.json", "averaged.weights.h5", "model.keras", "vocab"):
        assert os.path.exists(os.path.join(run, name)), name

    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")

    def script(name, *args, stdin=None):
        result = subprocess.run([sys.executable, os.path.join(ROOT, name), *args], env=env,
                                input=stdin, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stderr
        return result.stdout

    script("export.py", "--run", run, "--out", export)
    assert os.path.exists(os.path.join(export, "1", "saved_model.pb"))
    translations = script("translate.py", "--export", export,
                          stdin="Jesus wept.\nLove your neighbor as yourself.\n")
    assert len(translations.splitlines()) == 2
    scores = script("evaluate.py", "--export", export, "--test", "bundled", "--split", "test",
                    "--limit", "10", "--no-progress")
    assert "BLEU" in scores
