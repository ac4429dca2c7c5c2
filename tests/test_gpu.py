"""Training on the accelerator's paths: XLA, mixed_float16 loss scaling, and
MirroredStrategy over logical GPUs. Each device-agnostic test runs on the CPU
and, marked `gpu`, on the first GPU when there is one (`pytest -m gpu` runs
those alone); TF32 is off (tests/conftest.py), so float32 is float32."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer import training

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_GPU = bool(tf.config.list_physical_devices("GPU"))
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
DEVICES = ["cpu", pytest.param("gpu", marks=[pytest.mark.gpu, needs_gpu])]
CONFIG = kt.TransformerConfig.tiny(60, d_model=32, d_ff=64, num_heads=4, dropout_rate=0.0)


def batch(seed=0, rows=8, length=12):
    rng = np.random.RandomState(seed)
    inputs = {"encoder_inputs": rng.randint(4, 60, (rows, length)).astype("int32"),
              "decoder_inputs": rng.randint(4, 60, (rows, length)).astype("int32")}
    inputs["encoder_inputs"][:, -3:] = 0  # some padding
    return inputs, rng.randint(4, 60, (rows, length)).astype("int32")


def train(device, jit_compile, weights, steps=2):
    with tf.device(f"/{device}:0"):
        model = kt.build_transformer(CONFIG)
        model.set_weights(weights)
        # SGD: Adam's first steps are about lr * sign(gradient), which would turn
        # rounding-level differences into learning-rate-sized ones.
        model.compile(optimizer=keras.optimizers.SGD(0.5),
                      loss=kt.LabelSmoothedCrossEntropy(0.1), jit_compile=jit_compile)
        losses = [float(model.train_on_batch(*batch(step))) for step in range(steps)]
    return model.get_weights(), losses


@pytest.mark.parametrize("device", DEVICES)
def test_xla_training_equals_training_without_it(device):
    initial = kt.build_transformer(CONFIG).get_weights()
    compiled, compiled_losses = train(device, True, initial)
    graph, graph_losses = train(device, False, initial)
    assert max(np.abs(a - b).max() for a, b in zip(graph, initial)) > 1e-3  # they moved
    assert max(np.abs(a - b).max() for a, b in zip(compiled, graph)) < 1e-5
    np.testing.assert_allclose(compiled_losses, graph_losses, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_float16_scales_the_loss_and_skips_overflowing_steps(device):
    inputs, targets = batch()
    with tf.device(f"/{device}:0"):
        reference = kt.build_transformer(CONFIG)
        weights = reference.get_weights()
        reference_loss = float(kt.LabelSmoothedCrossEntropy(0.1)(targets, reference(inputs)))
        training.set_precision("mixed_float16")
        try:
            model = kt.build_transformer(CONFIG)
        finally:
            training.set_precision("float32")
        model.set_weights(weights)
        training.compile_for_training(model, 0.1, warmup_steps=10)
        optimizer = model.optimizer
        assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        assert model.get_layer("shared_embedding").compute_dtype == "float16"
        # The first step's loss is the float32 model's, to float16's precision.
        first = float(model.train_on_batch(inputs, targets, return_dict=True)["loss"])
        assert first == pytest.approx(reference_loss, rel=1e-2)
        assert float(optimizer.dynamic_scale.numpy()) == 2.0**15
        # A scale whose scaled loss overflows float16: the step is skipped (no
        # weight moves) and the scale halves.
        optimizer.dynamic_scale.assign(2.0**100)
        before = model.get_weights()
        model.train_on_batch(inputs, targets)
        assert float(optimizer.dynamic_scale.numpy()) == 2.0**99
        assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
        optimizer.dynamic_scale.assign(2.0**15)
        model.train_on_batch(inputs, targets)
        assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


# NCCL refuses two replicas on one GPU ("invalid usage"): its check needs two.
needs_two_gpus = pytest.mark.skipif(len(tf.config.list_physical_devices("GPU")) < 2,
                                    reason="needs a GPU per replica (NCCL)")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("all_reduce", [pytest.param("nccl", marks=needs_two_gpus),
                                        "hierarchical"])
@pytest.mark.parametrize("xla", [False, True], ids=["no-xla", "xla"])
def test_mirrored_over_two_gpus_equals_one_gpu(all_reduce, xla):
    """With XLA, each replica's step is compiled apart (MultiWorkerModel.compile)."""
    from tests.test_distributed import ENV
    from tests.test_distributed import SCRIPT
    from tests.test_distributed import check_equal_to_one_device
    from tests.test_distributed import last_json_line

    result = subprocess.run(
        [sys.executable, SCRIPT, "mirrored_gpu", "2", all_reduce, *["--xla"] * xla],
        capture_output=True, text=True, env=ENV, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = last_json_line(result.stdout)
    check_equal_to_one_device(report, num_replicas=2)
    assert report["replica_jit_compile"] == xla
