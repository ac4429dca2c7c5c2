import json
import os
import socket
import subprocess
import sys

import pytest
import tensorflow as tf

from keras_transformer import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "replica_equivalence.py")
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           TF_CPP_MIN_LOG_LEVEL="2")


def last_json_line(output):
    return json.loads(output.strip().splitlines()[-1])


def check_equal_to_one_device(result, num_replicas):
    assert result["num_replicas"] == num_replicas
    assert result["largest_update"] > 1e-3  # the weights did move
    assert result["largest_difference"] < 1e-5, result
    assert abs(result["loss"][0] - result["loss"][1]) < 1e-5, result
    assert abs(result["val_loss"][0] - result["val_loss"][1]) < 1e-5, result
    # Replicas see unequal token counts, so a per-replica mean would not match.
    assert len({n for batch in result["tokens_per_replica"] for n in batch}) > 1, result


def test_strategy_choices():
    assert isinstance(distributed.make_strategy("one_device"), tf.distribute.OneDeviceStrategy)
    if not tf.config.list_logical_devices("GPU"):
        # On a CPU, auto is TensorFlow's default strategy: no prefetching iterator of
        # its own (see make_strategy).
        assert distributed.make_strategy("auto") is tf.distribute.get_strategy()
    with pytest.raises(ValueError, match="Unknown strategy 'gpu8'"):
        distributed.make_strategy("gpu8")


def test_a_saved_model_loads_with_its_optimizer(tmp_path):
    """MultiWorkerModel overrides `compile`, which Keras then skips when it loads a
    saved model; `compile_from_config` compiles it as Keras would."""
    import keras
    import numpy as np

    import keras_transformer as kt
    from keras_transformer import training

    model = kt.build_transformer(kt.TransformerConfig.tiny(60, d_model=16, d_ff=32))
    training.compile_for_training(model)
    rng = np.random.RandomState(0)
    inputs = {name: rng.randint(4, 60, (4, 6)).astype("int32")
              for name in ("encoder_inputs", "decoder_inputs")}
    model.train_on_batch(inputs, rng.randint(4, 60, (4, 6)).astype("int32"))
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert int(loaded.optimizer.iterations.numpy()) == 1
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert [m.name for m in loaded.metrics] == [m.name for m in model.metrics]


@pytest.mark.parametrize("jit_compile", [True, False, "auto"])
def test_the_update_is_compiled_where_the_steps_are(jit_compile):
    """train's optimizer compiles its update on mirrored variables exactly when the
    steps are compiled (`jit_compile=True`), and keeps that through its config."""
    import keras_transformer as kt
    from keras_transformer import optimizers
    from keras_transformer import training

    for accumulate_steps in (1, 2):
        model = kt.build_transformer(kt.TransformerConfig.tiny(60, d_model=16, d_ff=32))
        training.compile_for_training(model, jit_compile=jit_compile,
                                      accumulate_steps=accumulate_steps)
        optimizer = model.optimizer
        assert isinstance(optimizer, optimizers.Adam)
        assert optimizer.jit_compile is (jit_compile is True)
        assert type(optimizer).from_config(optimizer.get_config()).jit_compile is (
            jit_compile is True)


@pytest.mark.parametrize("strategy", ["one_device", "default"])
def test_each_dev_pass_starts_the_dev_set_once(strategy):
    """Keras's `evaluate` under a strategy (train's on a GPU) reads a batch of its own
    from a dev iterator made for it before every dev pass, to build a model that is
    built already: 1.0 s of each checkpoint interval's 3.0 s of steps on an H200. The
    dev set's generator counts the iterators made over it."""
    import keras_transformer as kt
    from keras_transformer import training

    started = []

    def dev_batches():
        started.append(1)
        for _ in range(2):
            yield inputs, targets

    rows, length = 4, 6
    inputs = {name: tf.fill([rows, length], 5) for name in ("encoder_inputs", "decoder_inputs")}
    targets = tf.fill([rows, length], 6)
    spec = tf.TensorSpec([rows, length], tf.int32)
    dev = tf.data.Dataset.from_generator(
        dev_batches, output_signature=({"encoder_inputs": spec, "decoder_inputs": spec}, spec)
    ).apply(tf.data.experimental.assert_cardinality(2))  # of known length, as train's
    scope = (tf.distribute.OneDeviceStrategy("/cpu:0") if strategy == "one_device"
             else tf.distribute.get_strategy())
    with scope.scope():
        model = kt.build_transformer(kt.TransformerConfig.tiny(60, d_model=16, d_ff=32))
        training.compile_for_training(model)
    model.fit(tf.data.Dataset.from_tensors((inputs, targets)).repeat(), epochs=3,
              steps_per_epoch=2, validation_data=dev, verbose=0, shuffle=False)
    assert len(started) == 3
    assert int(model.optimizer.iterations.numpy()) == 6


@pytest.mark.slow
@pytest.mark.parametrize("replicas, flags", [(8, []), (2, ["--xla"]), (2, ["--xla", "--adam"])],
                         ids=["8", "2-xla", "2-xla-adam"])
def test_mirrored_replicas_equal_one_device(replicas, flags):
    """Logical CPU replicas make the same two updates as one device (separate
    process: logical devices must be configured before TensorFlow starts); with
    XLA, each replica's step compiled apart (Keras's one program for all of them
    fails: "Trying to access resource ... located in device CPU:1"), and with the
    paper's Adam, each device's update one XLA program, traced once."""
    output = subprocess.run(
        [sys.executable, SCRIPT, "mirrored", str(replicas), *flags],
        capture_output=True, text=True, env=ENV, check=True, timeout=600,
    ).stdout
    report = last_json_line(output)
    check_equal_to_one_device(report, num_replicas=replicas)
    xla = "--xla" in flags
    assert report["replica_jit_compile"] == xla and report["jit_compile"] is False
    assert report["compiled_updates"] == ([1] * replicas if "--adam" in flags else [])


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.slow
@pytest.mark.parametrize("xla", [False, True], ids=["no-xla", "xla"])
def test_multi_worker_equals_one_device(xla):
    """Two worker processes on localhost (MultiWorkerMirroredStrategy from
    TF_CONFIG) make the same two updates and log the same loss as one device
    (with XLA, each replica's step compiled apart)."""
    workers = ",".join(f"localhost:{port}" for port in free_ports(2))
    processes = [
        subprocess.Popen([sys.executable, SCRIPT, "multi_worker", str(index), workers,
                          *["--xla"] * xla],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        for index in range(2)
    ]
    try:
        outputs = [process.communicate(timeout=600) for process in processes]
    finally:
        for process in processes:
            process.kill()
    for process, (stdout, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-3000:]
        report = last_json_line(stdout)
        check_equal_to_one_device(report, num_replicas=2)
        assert report["replica_jit_compile"] == xla
