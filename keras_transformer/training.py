"""Training pieces: strategy selection, precision, compile, checkpoints, averaging.

`train.py` reads top to bottom over these; users of `model.fit` in their own
scripts use them directly (see the README).
"""

import dataclasses
import glob
import json
import math
import os
import re
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from keras_transformer.config import PRECISIONS
from keras_transformer.config import STRATEGIES
from keras_transformer.losses import LabelSmoothedCrossEntropy
from keras_transformer.metrics import Perplexity
from keras_transformer.metrics import TokenAccuracy
from keras_transformer.model import is_multi_worker
from keras_transformer.schedules import transformer_optimizer

CHECKPOINT_PATTERN = re.compile(r"ckpt-(\d+)\.weights\.h5$")


def make_strategy(name="auto", tpu=""):
    """The `tf.distribute` strategy called `name`.

    - "one_device": the first GPU, or the CPU.
    - "mirrored": `MirroredStrategy` over all visible GPUs (the paper used 8);
      over the CPU when there is none.
    - "multi_worker": `MultiWorkerMirroredStrategy`, configured by the
      `TF_CONFIG` environment variable.
    - "tpu": `TPUStrategy` through a `TPUClusterResolver` (`tpu` names the TPU;
      empty means the local one or `TPU_NAME`).
    - "auto": multi_worker when `TF_CONFIG` names several tasks, mirrored with
      several GPUs, else one_device.

    Call it first: a multi-worker strategy must be made before TensorFlow runs
    anything.
    """
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
    if name == "auto":
        cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
        if len(cluster.get("worker", [])) + len(cluster.get("chief", [])) > 1:
            name = "multi_worker"
    if name == "multi_worker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError(
                "strategy 'multi_worker' needs the TF_CONFIG environment variable "
                '(e.g. {"cluster": {"worker": ["host1:port", "host2:port"]}, '
                '"task": {"type": "worker", "index": 0}})'
            )
        # Before anything else touches TensorFlow's runtime (listing devices
        # included): collectives must be configured at program start-up.
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "auto":
        name = "mirrored" if len(gpus) > 1 else "one_device"
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def set_precision(precision):
    """Sets the global Keras dtype policy; call it before building the model."""
    if precision not in PRECISIONS:
        raise ValueError(
            f"Unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}"
        )
    keras.config.set_dtype_policy(precision)


def compile_for_training(model, label_smoothing=0.1, warmup_steps=4000, learning_rate_scale=1.0,
                         jit_compile=False):
    """Compiles `model` with the paper's recipe (Sec. 5.3-5.4).

    Adam (beta1 0.9, beta2 0.98, epsilon 1e-9) on `TransformerSchedule`, the
    label-smoothed cross entropy averaged over the global batch's target tokens,
    and token accuracy and perplexity. Under `mixed_float16` Keras wraps the
    optimizer in a `LossScaleOptimizer` (dynamic loss scaling).
    """
    model.compile(
        optimizer=transformer_optimizer(model.config.d_model, warmup_steps, learning_rate_scale),
        loss=LabelSmoothedCrossEntropy(label_smoothing),
        metrics=[TokenAccuracy(), Perplexity()],
        jit_compile=jit_compile,
    )
    return model


# Checkpoints ---------------------------------------------------------------


def checkpoint_path(directory, step):
    return os.path.join(directory, f"ckpt-{step:08d}.weights.h5")


def list_checkpoints(directory):
    """`[(step, path)]` of the checkpoints in `directory`, oldest first."""
    found = []
    for path in glob.glob(os.path.join(directory, "ckpt-*.weights.h5")):
        match = CHECKPOINT_PATTERN.search(os.path.basename(path))
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


class StepCheckpoint(keras.callbacks.Callback):
    """Saves model and optimizer state every epoch, keeping the last `keep`.

    `train.py` makes an epoch `checkpoint_every` steps long, so this is a
    checkpoint every N steps, named by the optimizer step. A checkpoint is first
    written to a temporary file and then renamed, so a run killed at any moment
    leaves only whole checkpoints; a non-finite loss is never checkpointed, so
    the last checkpoint of a diverged run is a good one. On multi-worker runs
    only the chief writes.

    Args:
        directory: where the `ckpt-<step>.weights.h5` files go.
        keep: how many to keep (at least as many as are averaged).
    """

    def __init__(self, directory, keep=5):
        super().__init__()
        self.directory = directory
        self.keep = keep

    def on_epoch_end(self, epoch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not np.isfinite(loss):
            return
        if not is_chief(self.model.distribute_strategy):
            return
        os.makedirs(self.directory, exist_ok=True)
        step = int(self.model.optimizer.iterations.numpy())
        path = checkpoint_path(self.directory, step)
        # Dropout's random state first: a checkpoint is whole once its weights exist.
        np.save(_rng_path(path), np.stack([v.numpy() for v in _rng_states(self.model)]))
        temporary = path + ".tmp.weights.h5"
        self.model.save_weights(temporary)
        os.replace(temporary, path)
        for _, old in list_checkpoints(self.directory)[: -self.keep]:
            os.remove(old)
            if os.path.exists(_rng_path(old)):
                os.remove(_rng_path(old))


def _rng_path(checkpoint):
    return checkpoint.replace(".weights.h5", ".rng.npy")


def _rng_states(model):
    """The states of the dropout layers' seed generators (not among the weights)."""
    return [v for v in model.variables if v.path.endswith("seed_generator_state")]


def restore_latest_checkpoint(model, directory):
    """Loads the newest checkpoint (weights, optimizer state and dropout's random
    state) into a compiled model; returns its step, or 0 when there is none."""
    checkpoints = list_checkpoints(directory)
    if not checkpoints:
        return 0
    step, path = checkpoints[-1]
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    model.load_weights(path)
    if os.path.exists(_rng_path(path)):
        for variable, value in zip(_rng_states(model), np.load(_rng_path(path))):
            variable.assign(value)
    if int(model.optimizer.iterations.numpy()) != step:
        raise ValueError(
            f"Checkpoint {path} holds optimizer step "
            f"{int(model.optimizer.iterations.numpy())}, not {step}; remove the file to resume "
            "from the previous checkpoint"
        )
    return step


def average_checkpoints(model, paths):
    """Sets `model`'s weights to the mean of the checkpoints' (Sec. 6.1: the paper
    averages the last 5 checkpoints of a base model, the last 20 of a big one).

    `model` must be compiled as it was when the checkpoints were written (they
    hold its optimizer state too, which is loaded along and left as the last
    file's). Returns the averaged weights.
    """
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint path")
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    total = None
    for path in paths:
        model.load_weights(path)
        weights = [w.astype("float64") for w in model.get_weights()]
        total = weights if total is None else [t + w for t, w in zip(total, weights)]
    averaged = [(t / len(paths)).astype(w.dtype) for t, w in zip(total, model.get_weights())]
    model.set_weights(averaged)
    return averaged


# Workers -------------------------------------------------------------------


def is_chief(strategy):
    """Whether this process writes the run's files: always, but on a multi-worker
    run, where only the chief (or worker 0 when there is no chief) does."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True
    return resolver.task_type == "chief" or (
        resolver.task_type == "worker" and resolver.task_id == 0
        and "chief" not in resolver.cluster_spec().as_dict()
    )


def same_on_all_workers(strategy, value):
    """Waits for every worker of a multi-worker run and returns whether `value` (a
    number, such as the step a run resumes at) is the same on all of them.

    Every worker must call it, at the same point: it is a collective all-reduce.
    Other strategies run in one process; for them it returns True at once.
    """
    if not is_multi_worker(strategy):
        return True
    values = tf.constant([value, value * value], tf.float64)
    total = tf.function(
        lambda: strategy.reduce("SUM", strategy.run(lambda: values), axis=None)
    )().numpy()
    # n * sum(x^2) == sum(x)^2 only when all n values are equal (Cauchy-Schwarz),
    # and every worker computes the same answer, so all of them stop or go on.
    return strategy.num_replicas_in_sync * total[1] == total[0] ** 2


# Time budget -----------------------------------------------------------------

CLOCKS = {"wall": time.monotonic, "cpu": time.process_time}
# A budgeted run averages its checkpoints over this last fraction of its steps, and
# warms up over this first fraction (README, "Recipes": measured on two corpora).
PLANNED_AVERAGE_SPAN = 0.25
PLANNED_WARMUP_FRACTION = 0.4
PLANNED_OVERHEAD = 0.1


class TrainingClock(keras.callbacks.Callback):
    """Times a run on one clock and, with a budget, stops it at the first epoch end
    past the budget; adds `step`, `cpu_seconds` and `elapsed_seconds` (since
    `start`, default now) to the epoch logs, and times each step for `plan`.

    Args:
        budget_seconds: stop once the clock has run this long since `start`
            (None: never).
        clock: "wall" (elapsed time) or "cpu" (the process's CPU time, all its
            threads).
        start: the clock's reading that the budget counts from (`time.monotonic()`
            or `time.process_time()` at the program's start: graph building, XLA
            compilation and the vocabulary count too).
    """

    def __init__(self, budget_seconds=None, clock="wall", start=None, wall_start=None):
        super().__init__()
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {sorted(CLOCKS)}. Received: clock={clock!r}")
        self.read = CLOCKS[clock]
        self.budget_seconds = budget_seconds
        self.start = self.read() if start is None else start
        self.wall_start = time.monotonic() if wall_start is None else wall_start
        self.step_seconds = []
        self._step_start = None

    def elapsed(self):
        return self.read() - self.start

    def over_budget(self):
        return self.budget_seconds is not None and self.elapsed() >= self.budget_seconds

    def on_train_batch_begin(self, batch, logs=None):
        self._step_start = self.read()

    def on_train_batch_end(self, batch, logs=None):
        self.step_seconds.append(self.read() - self._step_start)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["step"] = int(self.model.optimizer.iterations.numpy())
            logs["cpu_seconds"] = round(time.process_time(), 2)
            logs["elapsed_seconds"] = round(time.monotonic() - self.wall_start, 2)
        if self.over_budget():
            self.model.stop_training = True


@dataclasses.dataclass(frozen=True)
class BudgetPlan:
    """What a time budget allows: `steps` expected in all, the checkpoint interval
    (`average_last` checkpoints span the last `PLANNED_AVERAGE_SPAN` of the
    steps), and a schedule that warms up over the first `PLANNED_WARMUP_FRACTION`
    to the same peak learning rate as the configured one (`TransformerSchedule`
    peaks at `scale * (d_model * warmup_steps)^-0.5`, so the scale moves with the
    square root of the warm-up)."""

    steps: int
    checkpoint_every: int
    warmup_steps: int
    learning_rate_scale: float


def plan_for_budget(step, step_seconds, seconds_left, average_last, warmup_steps,
                    learning_rate_scale, max_steps=None):
    """Plans a budgeted run from the times of its first steps.

    Args:
        step: the steps done so far.
        step_seconds: the measured times of those steps. Their median is the
            steady step: the first ones build the graph and compile each new
            batch shape; the plan leaves `PLANNED_OVERHEAD` of the time left for
            the compilations, checkpoints and dev passes still to come.
        seconds_left: the budget left.
        average_last: the checkpoints averaged at the end.
        warmup_steps, learning_rate_scale: the configured schedule, whose peak
            learning rate the plan keeps.
        max_steps: optional cap on the steps in all.

    Returns:
        A `BudgetPlan`.
    """
    if not step_seconds:
        raise ValueError("plan_for_budget needs the times of at least one step")
    per_step = max(float(np.median(step_seconds)), 1e-6)
    steps = step + max(1, int(seconds_left * (1 - PLANNED_OVERHEAD) / per_step))
    if max_steps is not None:
        steps = min(steps, max_steps)
    checkpoint_every = max(1, math.ceil(steps * PLANNED_AVERAGE_SPAN / average_last))
    planned_warmup = max(1, round(steps * PLANNED_WARMUP_FRACTION))
    scale = learning_rate_scale * math.sqrt(planned_warmup / warmup_steps)
    return BudgetPlan(steps, checkpoint_every, planned_warmup, scale)


class ProgressLine(keras.callbacks.Callback):
    """One line per epoch (checkpoint interval) for a person: the step, the
    training and dev loss, the learning rate and the time so far.

    Args:
        steps: the steps planned in all (shown as "step 250/1000").
        clock: the run's `TrainingClock`, for the time and the budget.
        stream: where to print (stdout).
    """

    def __init__(self, steps, clock, stream=None):
        super().__init__()
        self.steps = steps
        self.clock = clock
        self.stream = stream or sys.stdout

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        step = int(self.model.optimizer.iterations.numpy())
        parts = [f"step {step}/{self.steps}" if step <= self.steps else f"step {step}"]
        for key, label in (("loss", "loss"), ("val_loss", "dev loss"), ("bleu", "dev BLEU"),
                           ("token_accuracy", "accuracy")):
            if key in logs:
                parts.append(f"{label} {logs[key]:.3f}" if key != "bleu"
                             else f"{label} {logs[key]:.1f}")
        if "learning_rate" in logs:
            parts.append(f"lr {logs['learning_rate']:.2e}")
        elapsed = _minutes(self.clock.elapsed())
        budget = self.clock.budget_seconds
        parts.append(f"{elapsed} of {_minutes(budget)}" if budget else elapsed)
        print("  ".join(parts), file=self.stream, flush=True)


def _minutes(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


# Logging -------------------------------------------------------------------


class LearningRateLogger(keras.callbacks.Callback):
    """Adds the current learning rate to the epoch logs (for TensorBoard, CSV)."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            optimizer = self.model.optimizer
            logs["learning_rate"] = float(
                optimizer.learning_rate.numpy()
                if hasattr(optimizer.learning_rate, "numpy")
                else optimizer.learning_rate
            )


class BleuEvaluation(keras.callbacks.Callback):
    """Every `every_epochs` epochs, translates `sources` and adds sacreBLEU to the logs.

    Args:
        translate: a function from a list of source strings to a list of
            translations (it reads the model's current weights).
        sources, references: the dev subset.
        score: a function `(hypotheses, references) -> float` (sacreBLEU).
        every_epochs: how often; the logs get `bleu` on those epochs only.
    """

    def __init__(self, translate, sources, references, score, every_epochs=1):
        super().__init__()
        self.translate = translate
        self.sources = list(sources)
        self.references = list(references)
        self.score = score
        self.every_epochs = every_epochs

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or (epoch + 1) % self.every_epochs:
            return
        logs["bleu"] = float(self.score(self.translate(self.sources), self.references))
