import errno
import math
import os
import signal
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer import budget
from keras_transformer import runs
from keras_transformer import training
from tests.seeding import reseed


def _compiled_model(accumulate_steps=1, **overrides):
    model = kt.build_transformer(kt.TransformerConfig.tiny(30, d_model=16, d_ff=32, **overrides))
    training.compile_for_training(model, warmup_steps=10, accumulate_steps=accumulate_steps)
    model.optimizer.build(model.trainable_variables)
    return model


def test_average_checkpoints_is_the_mean(tmp_path):
    model = _compiled_model()
    saved = []
    for step in (1, 2, 3):
        weights = [np.random.randn(*w.shape).astype("float32") for w in model.get_weights()]
        model.set_weights(weights)
        model.optimizer.iterations.assign(step)
        path = runs.Checkpoints(str(tmp_path)).path(step)
        model.save_weights(path)
        saved.append(weights)
    averaged = training.average_checkpoints(
        model, [p for _, p in runs.Checkpoints(str(tmp_path)).list()[-2:]])
    for result, first, second in zip(averaged, saved[1], saved[2]):
        np.testing.assert_allclose(result, (first + second) / 2, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(model.get_weights()[0], averaged[0])


def test_step_checkpoint_keeps_the_last_and_never_a_nan(tmp_path):
    model = _compiled_model()
    clock = budget.TrainingClock(600.0)
    callback = training.StepCheckpoint(str(tmp_path), keep=2, clock=clock)
    callback.set_model(model)
    for step in (10, 20, 30):
        model.optimizer.iterations.assign(step)
        before = callback.seconds
        callback.on_epoch_end(0, logs := {"loss": 1.0})
        assert logs["checkpoint_seconds"] > 0  # for log.csv: this checkpoint's
        assert logs["checkpoint_seconds"] == pytest.approx(callback.seconds - before, abs=1e-3)
    model.optimizer.iterations.assign(40)
    callback.on_epoch_end(0, {"loss": math.nan})
    assert [step for step, _ in runs.Checkpoints(str(tmp_path)).list()] == [20, 30]
    assert sorted(os.listdir(tmp_path)) == [
        "ckpt-00000020.clock.json", "ckpt-00000020.rng.npy", "ckpt-00000020.weights.h5",
        "ckpt-00000030.clock.json", "ckpt-00000030.rng.npy", "ckpt-00000030.weights.h5"]
    # The time the run had spent by each checkpoint, for a resume's budget.
    spent = runs.Checkpoints(str(tmp_path)).spent(30)
    assert set(spent) == {"clock", "wall_seconds", "cpu_seconds", "interval_seconds"}
    assert 0 < spent["wall_seconds"] <= clock.elapsed()

    restored = _compiled_model()
    assert training.restore_latest_checkpoint(restored, str(tmp_path)) == 30
    assert int(restored.optimizer.iterations.numpy()) == 30
    for a, b in zip(restored.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert training.restore_latest_checkpoint(_compiled_model(), str(tmp_path / "none")) == 0


def test_a_checkpoint_that_finds_the_disk_full_leaves_nothing_of_its_own(tmp_path, monkeypatch):
    """Its random state and time record are written before its weights; where
    the weights find the disk full, they are removed too, and the last whole
    checkpoint stays the run's last (train says it resumes there)."""
    model = _compiled_model()
    callback = training.StepCheckpoint(str(tmp_path), keep=2, clock=budget.TrainingClock(600.0))
    callback.set_model(model)
    model.optimizer.iterations.assign(10)
    callback.on_epoch_end(0, {"loss": 1.0})
    whole = sorted(os.listdir(tmp_path))

    def fills_the_disk(path):
        with open(path, "wb") as f:
            f.write(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "Can't synchronously write data (file write failed)")

    monkeypatch.setattr(model, "save_weights", fills_the_disk)
    model.optimizer.iterations.assign(20)
    with pytest.raises(OSError, match=r"No space left on device: .*ckpt-00000020\.weights\.h5"):
        callback.on_epoch_end(0, {"loss": 1.0})
    assert sorted(os.listdir(tmp_path)) == whole
    assert [step for step, _ in runs.Checkpoints(str(tmp_path)).list()] == [10]


def test_a_model_without_dropout_checkpoints_and_resumes(tmp_path):
    """dropout_rate=0: no dropout random state to keep (train.py --dropout-rate 0
    once failed at its first checkpoint)."""
    model = _compiled_model(dropout_rate=0.0)
    callback = training.StepCheckpoint(str(tmp_path))
    callback.set_model(model)
    model.optimizer.iterations.assign(5)
    callback.on_epoch_end(0, {"loss": 1.0})
    restored = _compiled_model(dropout_rate=0.0)
    assert training.restore_latest_checkpoint(restored, str(tmp_path)) == 5
    for a, b in zip(restored.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_restored_checkpoint_draws_the_dropout_masks_the_run_would_have_drawn(tmp_path):
    """Resuming restores dropout's random state with the weights: the restored
    model's next training pass equals the checkpointed model's next one, where
    the same weights alone draw other masks."""
    ids = np.random.default_rng(0).integers(3, 30, (4, 6)).astype("int32")
    inputs = {"encoder_inputs": ids, "decoder_inputs": ids}

    def trained_pass(model):
        return keras.ops.convert_to_numpy(model(inputs, training=True))

    model = _compiled_model(dropout_rate=0.3)
    trained_pass(model)  # the run's masks so far
    callback = training.StepCheckpoint(str(tmp_path))
    callback.set_model(model)
    model.optimizer.iterations.assign(5)
    callback.on_epoch_end(0, {"loss": 1.0})
    expected = trained_pass(model)
    restored = _compiled_model(dropout_rate=0.3)
    assert training.restore_latest_checkpoint(restored, str(tmp_path)) == 5
    np.testing.assert_array_equal(trained_pass(restored), expected)
    weights_only = _compiled_model(dropout_rate=0.3)
    weights_only.set_weights(model.get_weights())
    assert np.abs(trained_pass(weights_only) - expected).max() > 1e-3  # the masks matter


@pytest.mark.parametrize("accumulate_steps", [1, 2])
def test_a_mixed_float16_checkpoint_resumes_with_its_loss_scale(tmp_path, accumulate_steps):
    """Under mixed_float16 Keras wraps the optimizer in a loss-scale optimizer,
    whose file holds the inner optimizer's variables twice: the checkpoint is
    the resumed model's own, and every weight and optimizer variable returns
    (gradient accumulation's too)."""
    training.set_precision("mixed_float16")
    model = _compiled_model(accumulate_steps)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    generator = np.random.default_rng(0)
    for variable in [*model.weights, *model.optimizer.variables]:
        if variable.dtype == "float32":
            variable.assign(generator.standard_normal(variable.shape).astype("float32"))
    updates = model.optimizer.inner_optimizer
    if accumulate_steps > 1:  # counts batches; `iterations`, updates, follows
        updates._iterations.assign(5 * accumulate_steps)
    else:
        updates.iterations.assign(5)
    callback = training.StepCheckpoint(str(tmp_path))
    callback.set_model(model)
    callback.on_epoch_end(0, {"loss": 1.0})
    restored = _compiled_model(accumulate_steps)
    assert training.restore_latest_checkpoint(restored, str(tmp_path)) == 5
    for saved, loaded in zip([*model.weights, *model.optimizer.variables],
                             [*restored.weights, *restored.optimizer.variables], strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded),
                                      keras.ops.convert_to_numpy(saved), err_msg=saved.path)


@pytest.mark.parametrize("other, problem", [
    (dict(num_layers=1), r"85 weight tensors where this model has 43 \(another num_layers\?\)"),
    (dict(d_ff=64), r"its weights have other shapes than this model's \(another d_model, d_ff"),
    (dict(accumulate_steps=2), r"an optimizer state of 171 variables where this model's "
                               r"optimizer has \d+ \(another optimizer"),
], ids=["fewer-layers", "other-shapes", "other-optimizer"])
def test_a_checkpoint_of_another_model_stops_the_resume_and_renames_nothing(
        tmp_path, recwarn, other, problem):
    """A whole checkpoint that another model wrote (an edited config.json, say)
    is no truncated one: resuming stops with a ValueError naming what differs,
    and keeps every file, where Keras would load the layers that fit (a model of
    fewer layers) or fail, and the run renamed each checkpoint `.unreadable`."""
    model = _compiled_model()
    callback = training.StepCheckpoint(str(tmp_path))
    callback.set_model(model)
    model.optimizer.iterations.assign(5)
    callback.on_epoch_end(0, {"loss": 1.0})
    files = sorted(os.listdir(tmp_path))
    recwarn.clear()
    accumulate_steps = other.pop("accumulate_steps", 1)
    resumed = kt.build_transformer(kt.TransformerConfig.tiny(30, **{"d_model": 16, "d_ff": 32,
                                                                   **other}))
    training.compile_for_training(resumed, warmup_steps=10, accumulate_steps=accumulate_steps)
    with pytest.raises(ValueError, match=(
            r"ckpt-00000005\.weights\.h5 holds the weights of another model than the one "
            rf"being resumed: {problem}.*No checkpoint was renamed or changed")):
        training.restore_latest_checkpoint(resumed, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == files
    assert not [str(w.message)[:100] for w in recwarn]  # Keras's, said in our words


def test_precision_choices():
    with pytest.raises(ValueError, match="Unknown precision 'float8'"):
        training.set_precision("float8")
    training.set_precision("mixed_bfloat16")
    assert keras.config.dtype_policy().name == "mixed_bfloat16"


def test_budget_plan_from_the_steady_step():
    # The first steps build the graph and compile; the median is the steady step.
    plan = budget.plan_for_budget(step=20, step_seconds=[30.0, 5.0] + [0.5] * 18,
                                    seconds_left=500.0, average_last=5, warmup_steps=300,
                                    learning_rate_scale=2.0)
    steps = 20 + int(500.0 * (1 - budget.PLANNED_OVERHEAD) / 0.5)
    assert plan.steps == steps
    assert plan.checkpoint_every == math.ceil(steps * budget.PLANNED_AVERAGE_SPAN / 5)
    assert plan.warmup_steps == round(steps * budget.PLANNED_WARMUP_FRACTION)
    # The same peak learning rate as the configured schedule's, at the planned warm-up.
    configured = kt.TransformerSchedule(256, warmup_steps=300, scale=2.0)
    planned = kt.TransformerSchedule(256, plan.warmup_steps, plan.learning_rate_scale)
    np.testing.assert_allclose(float(planned(plan.warmup_steps - 1)), float(configured(299)),
                               rtol=1e-6)
    # A given scale is planned over the planned warm-up; a given warm-up keeps both.
    assert budget.planned_settings(plan, {"learning_rate_scale"}) == dict(
        steps=steps, checkpoint_every=plan.checkpoint_every, warmup_steps=plan.warmup_steps,
        learning_rate_scale=plan.learning_rate_scale)
    assert budget.planned_settings(plan, {"warmup_steps", "checkpoint_every"}) == dict(
        steps=steps)
    capped = budget.plan_for_budget(20, [0.5] * 20, 500.0, 5, 300, 1.0, max_steps=300)
    assert capped.steps == 300
    with pytest.raises(ValueError, match="at least one step"):
        budget.plan_for_budget(0, [], 10.0, 5, 300, 1.0)


def test_training_clock_stops_at_the_epoch_end_nearest_the_budget():
    now = [100.0]
    clock = budget.TrainingClock(budget_seconds=10.0, clock="cpu", start=100.0)
    clock.read = lambda: now[0]

    class Model:
        stop_training = False
        optimizer = type("Optimizer", (), {"iterations": keras.Variable(7)})()

    def epoch(begin, end, logs=None):
        now[0] = begin
        clock.on_epoch_begin(0)
        now[0] = end
        clock.on_epoch_end(0, logs if logs is not None else {})
        return clock.model.stop_training

    clock.set_model(Model())
    logs = {}
    assert not epoch(100.0, 104.0, logs) and logs["step"] == 7
    assert {"cpu_seconds", "elapsed_seconds"} <= set(logs)
    # 7.5 s: the next end, about 11 s, is nearer the budget than this one.
    assert not epoch(104.0, 107.5)
    assert epoch(107.5, 111.0)  # past it

    clock.model.stop_training = False
    # 8 s, in epochs of 4: the next end, about 12 s, is as far past as this is short.
    assert not epoch(100.0, 104.0)
    assert epoch(104.0, 108.0)
    assert not budget.TrainingClock().over_budget()  # no budget, never


def test_tokens_a_second_count_the_steps_and_not_the_dev_pass(monkeypatch):
    import io

    now = [50.0]
    monkeypatch.setattr(budget.time, "monotonic", lambda: now[0])
    clock = budget.TrainingClock(wall_start=0.0)

    class Model:
        optimizer = type("Optimizer", (), {"iterations": keras.Variable(100)})()

    clock.set_model(Model())
    clock.on_epoch_begin(0)
    for begin, end in ((50.0, 50.5), (50.5, 52.0), (52.0, 54.0)):  # 4 s of steps
        now[0] = begin
        clock.on_train_batch_begin(0)
        now[0] = end
        clock.on_train_batch_end(0)
    clock.on_test_begin()
    now[0] = 60.0                      # a 6-second dev pass
    clock.on_test_end()
    logs = {"target_tokens": 123456.0, "learning_rate": 1e-3}
    clock.on_epoch_end(0, logs)
    assert logs["target_tokens_per_second"] == 123456.0 / 4
    assert logs["median_step_seconds"] == 1.5 and logs["dev_pass_seconds"] == 6.0
    assert logs["mean_step_seconds"] == round(4 / 3, 5) and logs["slowest_step_seconds"] == 2.0
    clock.on_epoch_begin(1)  # an interval without a dev pass logs none
    clock.on_epoch_end(1, quiet := {})
    assert "dev_pass_seconds" not in quiet and "median_step_seconds" not in quiet
    stream = io.StringIO()
    progress = budget.ProgressLine(1000, clock, stream)
    progress.set_model(Model())
    progress.on_epoch_end(0, logs)
    assert "lr 1.00e-03  30.9k tokens/s  " in stream.getvalue()


def test_the_run_log_keeps_the_columns_of_an_older_run(tmp_path):
    import csv

    path = str(tmp_path / "log.csv")
    with open(path, "w") as f:
        f.write("epoch,loss,step\n0,6.5,10\n")
    for epoch, logs in ((1, {"loss": 6.0, "step": 20, "target_tokens": 9.0}),
                        (2, {"loss": 5.5, "step": 30})):
        log = training.RunLog(path)
        log.on_train_begin()
        log.on_epoch_end(epoch, logs)
        log.on_train_end()
    with open(path) as f:
        rows = list(csv.reader(f))
    assert rows == [["epoch", "loss", "step"], ["0", "6.5", "10"], ["1", "6.0", "20"],
                    ["2", "5.5", "30"]]
    fresh = str(tmp_path / "fresh.csv")
    log = training.RunLog(fresh)
    log.on_train_begin()
    log.on_epoch_end(0, {"loss": 6.0, "target_tokens": 9.0})
    log.on_train_end()
    with open(fresh) as f:
        assert next(csv.reader(f)) == ["epoch", "loss", "target_tokens", "val_loss",
                                       "val_target_tokens"]


def test_an_unreadable_newest_checkpoint_is_skipped(tmp_path, capsys):
    model = _compiled_model()
    callback = training.StepCheckpoint(str(tmp_path), keep=3)
    callback.set_model(model)
    for step in (10, 20):
        model.optimizer.iterations.assign(step)
        callback.on_epoch_end(0, {"loss": 1.0})
    newest = runs.Checkpoints(str(tmp_path)).path(20)
    with open(newest, "r+b") as f:  # a disk that filled up half-way through
        f.truncate(os.path.getsize(newest) // 2)

    restored = _compiled_model()
    assert training.restore_latest_checkpoint(restored, str(tmp_path)) == 10
    assert int(restored.optimizer.iterations.numpy()) == 10
    assert f"{newest} cannot be read (it is cut short (" in capsys.readouterr().err
    assert os.path.exists(newest + ".unreadable")
    assert [step for step, _ in runs.Checkpoints(str(tmp_path)).list()] == [10]

    with open(runs.Checkpoints(str(tmp_path)).path(10), "wb") as f:
        f.write(b"not a checkpoint")
    with pytest.raises(ValueError, match="no checkpoint in .* can be read; each is renamed .*"
                                         "run the same command again to start the run over "
                                         "from step 0"):
        training.restore_latest_checkpoint(_compiled_model(), str(tmp_path))
    assert training.restore_latest_checkpoint(_compiled_model(), str(tmp_path)) == 0  # as said


def test_a_run_without_checkpoints_starts_from_init_from(tmp_path, capsys):
    source = _compiled_model()
    source.set_weights([np.random.randn(*w.shape).astype("float32") for w in source.get_weights()])
    run = tmp_path / "trained"
    os.makedirs(run / runs.VOCAB)
    os.makedirs(run / runs.CHECKPOINTS)
    (run / runs.VOCAB / "subword.model").write_text("")
    runs.Run(str(run)).write_config(source.config, kt.TrainingConfig())
    source.optimizer.iterations.assign(30)
    source.save_weights(runs.Checkpoints(str(run / runs.CHECKPOINTS)).path(30))

    averaged = kt.build_transformer(source.config)  # averaged weights: no optimizer state
    averaged.set_weights(source.get_weights())
    averaged.save_weights(str(run / runs.AVERAGED_WEIGHTS))

    for init_from in (str(run), runs.Checkpoints(str(run / runs.CHECKPOINTS)).path(30)):
        model = _compiled_model()
        assert training.restore_latest_checkpoint(model, str(tmp_path / "new"), init_from) == 0
        assert int(model.optimizer.iterations.numpy()) == 0  # a fresh optimizer
        for a, b in zip(model.get_weights(), source.get_weights()):
            np.testing.assert_array_equal(a, b)
        assert "Starting from the weights of" in capsys.readouterr().out
    with pytest.raises(ValueError, match="does not fit this model"):
        model = kt.build_transformer(kt.TransformerConfig.tiny(30, d_model=8, d_ff=16))
        training.compile_for_training(model)
        training.restore_latest_checkpoint(model, str(tmp_path / "new"), str(run))


def test_a_model_without_dropout_keeps_only_weights(tmp_path):
    # No dropout layer, no random state to save: the checkpoint holds the weights alone.
    model = kt.build_transformer(kt.TransformerConfig.tiny(30, d_model=16, d_ff=32,
                                                           dropout_rate=0.0))
    training.compile_for_training(model, warmup_steps=10)
    model.optimizer.build(model.trainable_variables)
    callback = training.StepCheckpoint(str(tmp_path), keep=2)
    callback.set_model(model)
    model.optimizer.iterations.assign(5)
    callback.on_epoch_end(0, {"loss": 1.0})
    assert [step for step, _ in runs.Checkpoints(str(tmp_path)).list()] == [5]
    restored = kt.build_transformer(model.config)
    training.compile_for_training(restored, warmup_steps=10)
    assert training.restore_latest_checkpoint(restored, str(tmp_path)) == 5
    for a, b in zip(model.get_weights(), restored.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_the_training_and_dev_steps_are_traced_once(monkeypatch):
    """On one device Keras leaves the optimizer's slots and the metrics' state to
    the first trace of the step, and TensorFlow traces a step that created
    variables a second time: twice the tracing at every start and resume (15 s a
    trace for the base model on a 2-core CPU). The model builds them first."""
    import tensorflow as tf

    model = kt.build_transformer(kt.TransformerConfig.tiny(30, d_model=16, d_ff=32))
    training.compile_for_training(model, warmup_steps=10)  # as train.py: Adam not built
    rng = np.random.default_rng(0)
    ids = lambda: rng.integers(3, model.config.vocab_size, (4, 6)).astype("int32")  # noqa: E731
    batches = tf.data.Dataset.from_tensors(
        ({"encoder_inputs": ids(), "decoder_inputs": ids()}, ids())).repeat()
    traced = {"train": [], "test": []}
    for kind in traced:
        step = getattr(type(model), f"{kind}_step")
        monkeypatch.setattr(type(model), f"{kind}_step",
                            lambda self, data, step=step, kind=kind: (
                                traced[kind].append(len(self.optimizer.variables)),
                                step(self, data))[1])
    model.fit(batches, steps_per_epoch=2, epochs=2, validation_data=batches.take(2), verbose=0,
              shuffle=False)
    slots = 1 + 2 * len(model.trainable_variables)  # the step count, Adam's two moments
    assert traced == {"train": [slots], "test": [slots]}, traced
    # `train_on_batch` too (benchmarks/train_throughput.py steps with it).
    model = kt.build_transformer(kt.TransformerConfig.tiny(30, d_model=16, d_ff=32))
    training.compile_for_training(model, warmup_steps=10)
    traced["train"].clear()
    inputs, targets = next(iter(batches))
    model.train_on_batch(inputs, targets)
    model.train_on_batch(inputs, targets)
    assert traced["train"] == [slots], traced


@pytest.mark.slow  # 8 XLA compilations on a CPU: 45 s
def test_compiling_ahead_leaves_training_as_it_was(tokenizer, xla_on_cpu, monkeypatch):
    """`compile_ahead` runs the XLA step once for each batch shape, side by side, and
    then restores the model: the run that follows equals one without it, weight for
    weight, with dropout on (its random state), Adam's step count and moments and the
    accumulating optimizer's sums all counted; and `fit` traces no step again (the
    slow cache test in test_train_cli.py counts the compilations). Its example
    batches are what the dataset gives."""
    import tensorflow as tf

    from keras_transformer import data
    from keras_transformer.model import Transformer

    pairs = data.load_parallel("bundled", "dev").take(400)
    batches = data.TrainingBatches(pairs, tokenizer, tokens_per_batch=640,
                                   max_sentence_tokens=96, seed=0, num_buckets=2)
    assert len(batches.shapes) == 2, batches.shapes
    for accumulate_steps in (1, 2):
        spec = batches.dataset(0, accumulate_steps).element_spec
        for shape in batches.shapes:
            example = batches.example_batch(shape, accumulate_steps)
            assert tf.nest.map_structure(lambda t: (t.dtype, t.shape.rank), example) \
                == tf.nest.map_structure(lambda s: (s.dtype, s.shape.rank), spec)
    examples = [batches.example_batch(shape, accumulate_steps=2) for shape in batches.shapes]
    dev = data.make_batches(pairs.take(60), tokenizer, 640, 96, shuffle=False,
                            deterministic=True, static_batch_size=True,
                            bucket_boundaries=batches.bucket_boundaries)
    dev_examples = training.one_batch_per_shape(dev)
    assert [tuple(batch[1].shape) for batch in dev_examples] == [(rows, length) for rows, length, _
                                                                 in batches.shapes]
    traced = []
    for kind in ("train", "test"):
        step = getattr(Transformer, f"{kind}_step")
        monkeypatch.setattr(Transformer, f"{kind}_step",
                            lambda self, data, step=step, kind=kind: (traced.append(kind),
                                                                      step(self, data))[1])

    def trained(ahead):
        reseed(1)
        model = kt.build_transformer(kt.TransformerConfig.tiny(
            tokenizer.vocab_size, num_layers=1, d_model=16, d_ff=32))
        training.compile_for_training(model, warmup_steps=10, jit_compile=True,
                                      accumulate_steps=2)
        if ahead:  # one dev shape: alone, its batch keeps a known shape unless made unknown
            started = time.monotonic()
            traced_seconds = training.compile_ahead(model, examples, dev_examples[:1], workers=3)
            # Building and tracing come before the compilations, within the call.
            assert 0 < traced_seconds < time.monotonic() - started
            # Each step traced once, for a batch of unknown shape, as `fit` calls it:
            # a step traced for a known shape would be compiled under another name.
            assert sorted(traced) == ["test", "train"], traced
            traced.clear()
        model.fit(batches.dataset(0, accumulate_steps=2), steps_per_epoch=8, epochs=1,
                  validation_data=dev, verbose=0, shuffle=False)
        if ahead:
            assert traced == []
        return [v.numpy() for v in [*model.variables, *model.optimizer.variables]]

    for got, want in zip(trained(True), trained(False), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow  # 14 XLA compilations on a CPU: about 45 s
def test_compiling_ahead_side_by_side_prints_no_retracing_warning(tokenizer, xla_on_cpu, capfd,
                                                                  caplog):
    """More step calls side by side than TensorFlow's threshold (5) still trace each
    step once, and train's output does not get tf.function's "triggered tf.function
    retracing" warning, which counts every call overlapping the trace as one (two of
    them in train's output on a 16-core H200 machine, 2026-11-27)."""
    from keras_transformer import data

    pairs = data.load_parallel("bundled", "dev").take(1500)
    batches = data.TrainingBatches(pairs, tokenizer, tokens_per_batch=1200,
                                   max_sentence_tokens=96, seed=0, num_buckets=7)
    dev = data.make_batches(pairs.take(300), tokenizer, 1200, 96, shuffle=False,
                            deterministic=True, static_batch_size=True,
                            bucket_boundaries=batches.bucket_boundaries)
    dev_examples = training.one_batch_per_shape(dev)
    calls = len(batches.shapes) + len(dev_examples)
    assert calls >= 12, (batches.shapes, len(dev_examples))
    model = kt.build_transformer(kt.TransformerConfig.tiny(
        tokenizer.vocab_size, num_layers=1, d_model=16, d_ff=32))
    training.compile_for_training(model, warmup_steps=10, jit_compile=True)
    # Only what compile_ahead prints, not what earlier tests in this worker left.
    capfd.readouterr()
    caplog.clear()
    training.compile_ahead(model, [batches.example_batch(shape, 1) for shape in batches.shapes],
                           dev_examples, workers=calls)
    # TensorFlow's logger prints to stderr, or hands its records to the root
    # logger's handlers where there are any (pytest's caplog).
    assert "retracing" not in capfd.readouterr().err + caplog.text
    for function in (model.train_function, model.test_function):
        traced = [cell.cell_contents.experimental_get_tracing_count()
                  for cell in function.__closure__
                  if hasattr(cell.cell_contents, "experimental_get_tracing_count")]
        assert traced == [1], traced


def _repeated_batch(step, rows=4, length=6):
    tokens = np.random.default_rng(0).integers(3, 30, (rows, length)).astype("int32")
    return tf.data.Dataset.from_tensors(
        ({"encoder_inputs": tokens, "decoder_inputs": tokens}, tokens)).repeat()


class _SendSignal(keras.callbacks.Callback):
    """Sends this process `number` at the end of its `at`-th batch, `times` times."""

    def __init__(self, number, at, times=1):
        super().__init__()
        self.number, self.at, self.times, self.batches = number, at, times, 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        if self.batches == self.at:
            for _ in range(self.times):
                os.kill(os.getpid(), self.number)


@pytest.mark.parametrize("number, accumulate_steps, at, stops_at",
                         [(signal.SIGTERM, 1, 3, 3),
                          # with two of three batches yet to come into the update
                          (signal.SIGTERM, 3, 4, 2)])
def test_a_signal_stops_training_at_its_step_with_a_checkpoint_there(
        number, accumulate_steps, at, stops_at, tmp_path, capsys):
    model = kt.build_transformer(kt.TransformerConfig.tiny(30, d_model=16, d_ff=32))
    training.compile_for_training(model, warmup_steps=10, accumulate_steps=accumulate_steps)
    stop = training.StopOnSignal()
    callbacks = [training.StepCheckpoint(str(tmp_path)), _SendSignal(number, at), stop]
    before = signal.getsignal(number)
    losses, step = training.fit_by_checkpoints(
        model, _repeated_batch, _repeated_batch(0).take(1), 0, 40, 10, 40, callbacks,
        accumulate_steps=accumulate_steps)
    assert (step, stop.stopped, len(losses)) == (stops_at, number, 1)
    assert int(model.optimizer._iterations.numpy()) == stops_at * accumulate_steps
    assert [step for step, _ in runs.Checkpoints(str(tmp_path)).list()] == [stops_at]
    assert signal.getsignal(number) is before  # the signal's own handling, after fit
    name = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}[number]
    assert f"{name}: stopping at step {stops_at}, once its checkpoint is written" in (
        capsys.readouterr().err)
    # Fit again with the same callbacks, no signal: it trains on to the step asked.
    callbacks[1].at = 0
    _, step = training.fit_by_checkpoints(
        model, _repeated_batch, _repeated_batch(0).take(1), stops_at, stops_at + 2, 10, 40,
        callbacks, accumulate_steps=accumulate_steps)
    assert (step, stop.stopped) == (stops_at + 2, None)


class _DevLosses(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_epoch_end(self, epoch, logs=None):
        self.losses.append(logs.get("val_loss"))


def test_a_dev_pass_averages_every_dev_batch_without_a_warning(recwarn):
    model = _compiled_model()
    rows = np.stack([np.random.default_rng(seed).integers(3, 30, (4, 6)).astype("int32")
                     for seed in range(3)])
    known = tf.data.Dataset.from_tensor_slices(rows).map(
        lambda tokens: ({"encoder_inputs": tokens, "decoder_inputs": tokens}, tokens))
    dev = known.filter(lambda inputs, targets: True)  # of unknown length, as make_batches'
    assert dev.cardinality() == tf.data.UNKNOWN_CARDINALITY
    dev_losses = _DevLosses()
    training.fit_by_checkpoints(model, _repeated_batch, dev, 0, 2, 2, 2, [dev_losses])
    # Keras 3.15 averages a dataset of unknown length over one batch more than it
    # has (3/4 of the loss here) and warns that the input ran out.
    batch_losses = [model.evaluate(known.skip(index).take(1), verbose=0)[0]
                    for index in range(3)]
    # The batches hold as many target tokens each: the pass's loss is their mean.
    assert dev_losses.losses == [pytest.approx(np.mean(batch_losses), rel=1e-5)]
    assert not [warning for warning in recwarn if "ran out of data" in str(warning.message)]
    # Without dev batches (train's, where every dev pair is too long): no dev pass.
    no_dev = _DevLosses()
    losses, step = training.fit_by_checkpoints(model, _repeated_batch, None, 2, 4, 2, 4, [no_dev])
    assert (len(losses), step, no_dev.losses) == (1, 4, [None])


def test_a_second_signal_stops_at_once(tmp_path):
    model = _compiled_model()
    stop = training.StopOnSignal()
    callbacks = [training.StepCheckpoint(str(tmp_path)), _SendSignal(signal.SIGTERM, 2, 2),
                 stop]
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        training.fit_by_checkpoints(model, _repeated_batch, _repeated_batch(0).take(1), 0, 40,
                                    10, 40, callbacks)
    assert stop.stopped is None and not runs.Checkpoints(str(tmp_path)).list()
    assert signal.getsignal(signal.SIGTERM) is before
