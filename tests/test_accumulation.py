"""Gradient accumulation: `AccumulatingAdam` and the token weights of
`TrainingBatches.dataset(accumulate_steps=N)` make one update from N batches
equal to one step on their concatenation."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from tests import python_path
from tests.accumulation_equivalence import compare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# float32's unit roundoff.
U = 2.0 ** -24


def check(result, num_replicas):
    assert result["num_replicas"] == num_replicas
    assert len(set(result["tokens"])) > 1, result  # unequal token counts
    # The same sums in another order (one batch against N): each variable's
    # momentum within 128 u of its scale (measured: 16 u on one device).
    assert result["momentum_difference"] < 128 * U, result
    # Averaging each batch's own mean instead would not pass.
    assert result["unweighted_momentum_difference"] > 1e-4, result
    # The schedule and Adam's bias correction count updates, not batches.
    assert result["iterations"] == [1, 1], result
    assert result["learning_rate"][0] == pytest.approx(result["learning_rate"][1], rel=1e-7)
    assert result["loss"][0] == pytest.approx(result["loss"][1], abs=0.05)


def test_one_update_from_n_batches_equals_one_step_on_all_of_them():
    check(compare(tf.distribute.get_strategy()), num_replicas=1)


@pytest.mark.slow
def test_accumulation_under_mirrored_strategy():
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "accumulation_equivalence.py"), "2"],
        env=dict(os.environ, PYTHONPATH=python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    check(json.loads(result.stdout.strip().splitlines()[-1]), num_replicas=2)


def test_accumulating_adam_equals_adam_on_the_mean_gradients():
    """The slow twin: Keras's Adam, one step per group on the group's mean gradient."""
    rng = np.random.RandomState(0)
    gradients = rng.randn(6, 4).astype("float32")
    schedule = kt.TransformerSchedule(d_model=16, warmup_steps=3)
    accumulated = kt.AccumulatingAdam(schedule, accumulate_steps=3)
    twin = keras.optimizers.Adam(schedule)
    ours, reference = keras.Variable(np.ones(4, "float32")), keras.Variable(np.ones(4, "float32"))
    for step, gradient in enumerate(gradients):
        accumulated.apply([gradient], [ours])
        if step % 3 == 2:
            twin.apply([gradients[step - 2:step + 1].mean(axis=0)], [reference])
        np.testing.assert_allclose(ours.numpy(), reference.numpy(), rtol=1e-5)
        assert int(accumulated.iterations.numpy()) == (step + 1) // 3
    assert float(accumulated.learning_rate.numpy()) == pytest.approx(float(schedule(2)))
    config = accumulated.get_config()
    assert config["accumulate_steps"] == 3
    assert kt.AccumulatingAdam.from_config(config).accumulate_steps == 3
    with pytest.raises(ValueError, match="accumulate_steps must be >= 1"):
        kt.AccumulatingAdam(accumulate_steps=0)
