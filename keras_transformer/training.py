"""Training pieces: precision, compile, the fit loop, checkpoints, averaging, callbacks.

`train.py` reads top to bottom over these; users of `model.fit` in their own
scripts use them directly (see docs/library.md). Checkpoints are named and
listed by `runs.Checkpoints`, the run directory's other files by `runs.Run`.
"""

import concurrent.futures
import csv
import functools
import logging
import math
import os
import signal
import sys
import threading
import time

import keras
import numpy as np
import tensorflow as tf

from keras_transformer import runs
from keras_transformer.budget import ProgressLine
from keras_transformer.config import PAPER_WARMUP_STEPS
from keras_transformer.config import PRECISIONS
from keras_transformer.config import TrainingConfig
from keras_transformer.config import TransformerConfig
from keras_transformer.data.batching import with_known_length
from keras_transformer.data.batching import without_autotuning
from keras_transformer.distributed import is_chief
from keras_transformer.distributed import is_multi_worker
from keras_transformer.durable import write_atomically
from keras_transformer.hardware import available_cores
from keras_transformer.losses import LabelSmoothedCrossEntropy
from keras_transformer.metrics import Perplexity
from keras_transformer.metrics import TargetTokens
from keras_transformer.metrics import TokenAccuracy
from keras_transformer.model import build_transformer
from keras_transformer.optimizers import adam
from keras_transformer.runs import Checkpoints
from keras_transformer.schedules import TransformerSchedule
from keras_transformer.token_ids import EOS_ID


def set_precision(precision):
    """Sets the global Keras dtype policy; call it before building the model."""
    if precision not in PRECISIONS:
        raise ValueError(
            f"Unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}"
        )
    keras.config.set_dtype_policy(precision)


def compile_for_training(model, label_smoothing=TransformerConfig.label_smoothing,
                         warmup_steps=PAPER_WARMUP_STEPS,
                         learning_rate_scale=TrainingConfig.learning_rate_scale,
                         jit_compile=False, accumulate_steps=1):
    """Compiles `model` with the paper's recipe (Sec. 5.3-5.4).

    Adam (beta1 0.9, beta2 0.98, epsilon 1e-9) on `TransformerSchedule`, the
    label-smoothed cross entropy averaged over the global batch's target tokens,
    and token accuracy, perplexity and the target tokens trained on (for the
    tokens/s of the logs). Under `mixed_float16` Keras wraps the
    optimizer in a `LossScaleOptimizer` (dynamic loss scaling). With
    `accumulate_steps` N > 1 the optimizer is an `AccumulatingAdam`, one update
    from every N batches: feed it `TrainingBatches.dataset(accumulate_steps=N)`,
    whose token weights normalize the loss over the N batches. The schedule's
    warm-up and scale are `keras.Variable`s, so that a budgeted run can plan
    them once it has timed its first steps (`budget.plan_run`).

    Returns:
        The optimizer's `TransformerSchedule`.
    """
    warmup_steps, learning_rate_scale = (
        keras.Variable(value, dtype="float32", trainable=False, name=name)
        for value, name in ((warmup_steps, "warmup_steps"),
                            (learning_rate_scale, "learning_rate_scale")))
    schedule = TransformerSchedule(model.config.d_model, warmup_steps, learning_rate_scale)
    model.compile(
        # Under XLA on several devices, each device's update as one program too.
        optimizer=adam(schedule, accumulate_steps, jit_compile=jit_compile is True),
        loss=LabelSmoothedCrossEntropy(label_smoothing),
        metrics=[TokenAccuracy(), Perplexity(), TargetTokens()],
        jit_compile=jit_compile,
    )
    return schedule


# `time_training_step` times a step on sentences of this many tokens (about the
# mean padded length of the bundled corpus's batches), over this many steps after
# the first, which traces the step.
TIMED_SENTENCE_TOKENS = 32
TIMED_STEPS = 3


def time_training_step(model_config, tokens_per_batch, jit_compile=False, clock=time.monotonic,
                       steps=TIMED_STEPS, sentence_tokens=TIMED_SENTENCE_TOKENS):
    """The median seconds, on `clock` (`time.monotonic`: wall clock;
    `time.process_time`: the process's CPU time, all its threads), of a training
    step of a new `model_config` model, compiled as `compile_for_training`
    compiles it in the global dtype policy, on a batch of random ids:
    `tokens_per_batch` source and as many target tokens in sentences of
    `sentence_tokens`. The first step, which traces (with `jit_compile`,
    compiles) the step, is not counted.

    Clears Keras's session afterwards (the dtype policy kept), so that the models
    a process builds next are named as they would be without this one.
    """
    policy = keras.config.dtype_policy()
    model = build_transformer(model_config)
    compile_for_training(model, model_config.label_smoothing, jit_compile=jit_compile)
    rows = max(1, tokens_per_batch // sentence_tokens)
    # Ids above the reserved ones, so that no position is padding.
    ids = np.random.default_rng(0).integers(EOS_ID + 1, model_config.vocab_size,
                                            (3, rows, sentence_tokens), dtype=np.int32)
    inputs = {"encoder_inputs": ids[0], "decoder_inputs": ids[1]}
    seconds = []
    for _ in range(1 + steps):
        start = clock()
        model.train_on_batch(inputs, ids[2])
        seconds.append(clock() - start)
    del model
    keras.backend.clear_session()
    keras.config.set_dtype_policy(policy)
    return float(np.median(seconds[1:]))


# TensorFlow names each traced function "__inference_<name>_<n>", n from one
# process-wide counter, and its persistent XLA cache (`--compilation-cache`) finds
# a compiled program by that name. A resumed run reaches its first step having
# traced other functions than a fresh one (it reads its vocabulary instead of
# learning it), so its names, and the cache's keys, would all differ.
FUNCTION_COUNTER_BLOCK = 1 << 20


def align_function_names(block=FUNCTION_COUNTER_BLOCK):
    """Moves TensorFlow's function counter to the next multiple of `block`, so
    that the training and dev steps traced next get the same names in every run
    that traces them the same way, whatever came before (a fraction of a second)."""
    from tensorflow.python.framework import ops

    current = ops.uid()
    for _ in range(-current % block):
        ops.uid()


def fit_by_checkpoints(model, batches, dev_batches, step, last_step, checkpoint_every,
                       planned_steps, callbacks, stop=lambda: False, budgeted=False,
                       accumulate_steps=1):
    """Trains from `step` to `last_step` with `model.fit`, an epoch a checkpoint
    interval: the steps to the next multiple of `checkpoint_every`, whole
    intervals, then the steps left over as one shorter epoch, so that the last
    checkpoint is at `last_step`. With `last_step=None` a budget decides: on
    past `planned_steps` until a callback stops training or `stop()` is true.

    Args:
        model: the compiled model.
        batches: `batches(step)`, the training batches from `step` on
            (`TrainingBatches.dataset`).
        dev_batches: the dev batches, finite, whose loss is measured every epoch, or
            on a `budgeted` run only half-way and at `planned_steps` (each pass,
            and its compilations under XLA, costs steps); None for no dev loss.
        step: the step the run is at.
        last_step: where to stop, or None.
        checkpoint_every: steps per epoch.
        planned_steps: the steps expected.
        callbacks: the `fit` callbacks.
        stop: checked after each `fit`.
        budgeted: whether a time budget decides the steps.
        accumulate_steps: batches per step (the optimizer's, see
            `compile_for_training`); `batches(step)` gives that many per step.

    Returns:
        `(losses, step)`: the epochs' training losses and the step reached.
    """
    losses = []
    last_step = sys.maxsize if last_step is None else last_step
    if dev_batches is not None:
        dev_batches = with_known_length(without_autotuning(dev_batches))
    planned_epochs = math.ceil(planned_steps / checkpoint_every)
    validation_freq = [max(1, planned_epochs // 2), planned_epochs] if budgeted else 1
    for epochs, length in _segments(step, last_step, checkpoint_every, planned_steps):
        history = model.fit(
            batches(step),
            epochs=step // checkpoint_every + epochs,
            initial_epoch=step // checkpoint_every,
            steps_per_epoch=length * accumulate_steps,
            callbacks=callbacks,
            validation_data=dev_batches,
            validation_freq=validation_freq,
            shuffle=False,  # the batches come shuffled
            verbose=0,
        )
        losses += history.history.get("loss", [])
        step = int(model.optimizer.iterations.numpy())
        if model.stop_training or stop():
            break
    return losses, step


def _segments(step, last_step, checkpoint_every, planned_steps):
    """`(epochs, steps_per_epoch)` fits from `step` to `last_step` (see
    `fit_by_checkpoints`); `last_step=sys.maxsize`: intervals up to
    `planned_steps`, then on until stopped."""
    if last_step <= step:
        return []
    segments = []
    head = min(-step % checkpoint_every, last_step - step)
    if head:
        segments.append((1, head))
        step += head
    if last_step == sys.maxsize:
        planned = max(1, math.ceil((planned_steps - step) / checkpoint_every))
        return segments + [(planned, checkpoint_every),
                           (sys.maxsize // checkpoint_every - step, checkpoint_every)]
    whole, rest = divmod(last_step - step, checkpoint_every)
    return segments + [(epochs, length) for epochs, length in
                       ((whole, checkpoint_every), (1, rest)) if epochs and length]


# Compiling ahead -----------------------------------------------------------


def compile_ahead(model, batches, dev_batches=(), workers=None):
    """Compiles the XLA training step for the shape of each of `batches`, and the dev
    step for each of `dev_batches`, `workers` at a time, before training; then puts
    the model back as it was.

    Under XLA each batch shape is a compilation of its own: tens of seconds for the
    base model on a GPU, which `fit` would otherwise pay one after another as each
    shape first comes. Here each shape's step runs once in a thread of its own, so
    that the compilations, mostly CPU work, run side by side. The weights, the
    optimizer's state and dropout's random state are then restored, so training goes
    on exactly as without this; the metrics' state is reset by `fit` and `evaluate`.

    Args:
        model: compiled with `jit_compile=True` (`compile_for_training`), on one
            replica: several replicas' steps run side by side would interleave their
            all-reduces.
        batches: one training batch of each shape, as `fit` gets them
            (`TrainingBatches.example_batch`).
        dev_batches: one dev batch of each shape (`one_batch_per_shape`).
        workers: steps run at a time; default: one per CPU core.

    Returns:
        The seconds spent before the steps ran: building the optimizer's and metrics'
        variables and tracing the step functions (0 with no batches).
    """
    started = time.monotonic()
    strategy = model.distribute_strategy
    if strategy.num_replicas_in_sync > 1:
        raise ValueError(
            f"compile_ahead runs one replica's steps side by side; this model trains on "
            f"{strategy.num_replicas_in_sync} replicas, whose steps compile as they come")
    batches, dev_batches = list(batches), list(dev_batches)
    if not batches and not dev_batches:
        return 0.0
    model._maybe_symbolic_build(data_batch=(batches or dev_batches)[0])
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    model.make_train_function()
    model.make_test_function()
    state = _state_variables(model)
    saved = [variable.numpy() for variable in state]
    # One iterator a step function (training, dev), each call taking its next batch,
    # so that each function is traced once; each batch with its shape unknown, as in `fit`'s
    # datasets of several shapes: a step traced for a known shape would be compiled
    # for it under another name than the one `fit` calls, and compiled again there.
    jobs = []
    for function, group in ((model.train_function, batches), (model.test_function, dev_batches)):
        if group:
            datasets = [tf.data.Dataset.from_tensors(batch).map(_shape_unknown) for batch in group]
            dataset = functools.reduce(tf.data.Dataset.concatenate, datasets)
            # Traced here, one function after the other, on an empty iterator (the
            # step never runs, nothing compiles): traced side by side, the two would
            # draw their names from TensorFlow's counter in an order that changes
            # from run to run, and the compile cache finds programs by those names.
            try:
                function(iter(strategy.experimental_distribute_dataset(dataset.take(0))))
            except (StopIteration, tf.errors.OutOfRangeError):
                pass
            iterator = iter(strategy.experimental_distribute_dataset(dataset))
            jobs += [(function, iterator)] * len(group)
    workers = workers or available_cores()
    traced = time.monotonic() - started
    logger, overlapping = tf.get_logger(), _OverlappingCallsFilter()
    logger.addFilter(overlapping)
    try:
        with concurrent.futures.ThreadPoolExecutor(min(workers, len(jobs))) as pool:
            for done in [pool.submit(function, iterator) for function, iterator in jobs]:
                done.result()
    finally:
        logger.removeFilter(overlapping)
    for variable, value in zip(state, saved):
        variable.assign(value)
    return traced


class _OverlappingCallsFilter(logging.Filter):
    """Drops TensorFlow's "N out of the last N calls ... triggered tf.function
    retracing" warning, which `compile_ahead`'s side-by-side calls set off falsely:
    each step function is traced once, but `tf.function` counts every call that
    overlaps the one tracing it as a retrace of its own (on a 16-core GPU machine,
    two such warnings in the middle of train's output)."""

    def filter(self, record):
        return "triggered tf.function retracing" not in record.getMessage()


def _shape_unknown(*batch):
    return tf.nest.map_structure(
        lambda tensor: tf.compat.v1.placeholder_with_default(tensor, [None] * tensor.shape.rank),
        batch)


def _state_variables(model):
    """Every variable a training step changes: the model's (weights and dropout's
    random state) and the optimizer's (its step, moments and accumulators)."""
    found = {}
    for variable in [*model.variables, *model.optimizer.variables]:
        found.setdefault(id(variable), variable)
    return list(found.values())


def one_batch_per_shape(dataset):
    """The first batch of each shape in a finite `dataset` (the dev batches), in the
    order they come."""
    found = {}
    for batch in dataset:
        key = tuple(tuple(tensor.shape) for tensor in tf.nest.flatten(batch))
        found.setdefault(key, batch)
    return list(found.values())


# Checkpoints ---------------------------------------------------------------


class StepCheckpoint(keras.callbacks.Callback):
    """Saves model and optimizer state every epoch, keeping the last `keep`, and adds
    the seconds that took to the epoch's logs (`checkpoint_seconds`, in log.csv).

    `train.py` makes an epoch `checkpoint_every` steps long, so this is a
    checkpoint every N steps, named by the optimizer step. Its files are written
    with `durable.write_atomically`, so a run killed at any moment leaves only
    whole checkpoints; a non-finite loss is never checkpointed, so
    the last checkpoint of a diverged run is a good one. On multi-worker runs
    only the chief writes.

    Args:
        directory: where the checkpoints go (`runs.Run(...).checkpoints.directory`);
            `runs.Checkpoints` names them.
        keep: how many to keep (at least as many as are averaged).
        clock: the run's `budget.TrainingClock`, whose `record()` each
            checkpoint keeps, so that a resumed run's budget counts the whole
            run (None: none kept).
    """

    def __init__(self, directory, keep=TrainingConfig.keep_checkpoints, clock=None):
        super().__init__()
        self.directory = directory
        self.checkpoints = Checkpoints(directory)
        self.keep = keep
        self.clock = clock
        self.seconds = 0.0  # spent writing checkpoints

    def on_epoch_end(self, epoch, logs=None):
        start = time.monotonic()
        self._write(logs)
        seconds = time.monotonic() - start
        self.seconds += seconds
        if logs is not None:  # for the callbacks after this one: log.csv
            logs["checkpoint_seconds"] = round(seconds, 3)

    def _write(self, logs):
        loss = (logs or {}).get("loss")
        if loss is not None and not np.isfinite(loss):
            return
        if not is_chief(self.model.distribute_strategy):
            return
        os.makedirs(self.directory, exist_ok=True)
        step = int(self.model.optimizer.iterations.numpy())
        path = self.checkpoints.path(step)
        # Dropout's random state and the time spent first: a checkpoint is whole
        # once its weights exist.
        states = [v.numpy() for v in _rng_states(self.model)]
        try:
            if states:  # none without dropout (dropout_rate 0)
                write_atomically(self.checkpoints.rng_path(path),
                                 lambda temporary: np.save(temporary, np.stack(states)))
            if self.clock is not None:
                self.checkpoints.write_spent(path, self.clock.record())
            write_atomically(path, self.model.save_weights)
        except OSError:  # a full disk, say: the last whole checkpoint stays the last
            self.checkpoints.remove(path)
            raise
        for _, old in self.checkpoints.list()[: -self.keep]:
            self.checkpoints.remove(old)


class StoppedBySignal(KeyboardInterrupt):
    """Ctrl-C or SIGTERM, raised where the program is; `signal` is its number."""

    def __init__(self, number):
        super().__init__(signal.Signals(number).name)
        self.signal = signal.Signals(number)

    @staticmethod
    def raise_it(number, frame):
        """A signal handler: raises it (Python raises `KeyboardInterrupt` for
        Ctrl-C only, and ends at once on SIGTERM)."""
        raise StoppedBySignal(number)


class StopOnSignal(keras.callbacks.Callback):
    """Ctrl-C (SIGINT) or SIGTERM (a scheduler preempting the job, `docker stop`,
    `kill`) while `fit` trains: the step in progress ends, the epoch ends there as
    every epoch does (its dev pass, then `StepCheckpoint`'s checkpoint at that
    step; dev BLEU is skipped), `fit` returns and `stopped` names the signal. A
    resumed run then starts at the step where this one stopped instead of
    training the steps since the last checkpoint again. A second signal stops at
    once (`StoppedBySignal`, a `KeyboardInterrupt`), from wherever the run is.

    Signals are caught only while `fit` runs, in the main thread of a run on one
    host: a multi-worker run's workers would have to agree on the step to stop
    at, and keep the default (each stops at once). With gradient accumulation a
    run stops at the next update, where the accumulators are empty.
    """

    NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}

    def __init__(self):
        super().__init__()
        self.stopped = None  # the signal that stopped training (a signal.Signals)
        self._received = None
        self._previous = {}

    def on_train_begin(self, logs=None):
        if self.stopped is not None:  # a fit after a stopped one trains; a signal
            self.stopped = self._received = None  # not yet acted on still stops this one
        if (threading.current_thread() is not threading.main_thread()
                or is_multi_worker(self.model.distribute_strategy)):
            return
        for number in self.NAMES:
            self._previous[number] = signal.signal(number, self._receive)

    def on_train_end(self, logs=None):
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous = {}

    def _receive(self, number, frame):
        if self._received is not None:  # the second: at once
            self.on_train_end()
            raise StoppedBySignal(number)
        self._received = signal.Signals(number)

    def on_train_batch_end(self, batch, logs=None):
        if (self._received is not None
                and not int(getattr(self.model.optimizer, "pending_batches", 0))):
            self._stop()

    def on_epoch_end(self, epoch, logs=None):
        if self._received is not None:  # came during the dev pass or the checkpoint
            self._stop()

    def _stop(self):
        if self.stopped is None:
            again = "Ctrl-C again" if self._received == signal.SIGINT else "another signal"
            print(f"\n{self.NAMES[self._received]}: stopping at step "
                  f"{int(self.model.optimizer.iterations.numpy())}, once its checkpoint is "
                  f"written ({again} stops at once).", file=sys.stderr, flush=True)
        self.stopped = self._received
        self.model.stop_training = True


def _rng_states(model):
    """The states of the dropout layers' seed generators (not among the weights)."""
    return [v for v in model.variables if v.path.endswith("seed_generator_state")]


def restore_latest_checkpoint(model, directory, init_from=""):
    """Loads the newest readable checkpoint (weights, optimizer state and dropout's
    random state) into a compiled model; returns its step, or 0 when there is none.
    With none, a run with `init_from` (`TrainingConfig.init_from`) starts from
    those weights, with a fresh optimizer.

    A checkpoint that cannot be read (truncated by a full disk or a power loss)
    is reported on stderr, renamed to `<name>.unreadable` and skipped for the
    one before it; a whole one of another model (`runs.WeightsMismatch`: an
    edited config.json, say) raises a ValueError and leaves every file as it is.
    """
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    found = Checkpoints(directory)
    checkpoints = found.list()
    for step, path in reversed(checkpoints):
        try:
            runs.read_weights(model, path)
            if os.path.exists(found.rng_path(path)):
                for variable, value in zip(_rng_states(model), np.load(found.rng_path(path))):
                    variable.assign(value)
        except runs.WeightsMismatch as error:  # whole, and another model's: keep them all
            raise ValueError(
                f"Checkpoint {error.path} holds the weights of another model than the one "
                f"being resumed: {error.problem}. No checkpoint was renamed or changed. Resume "
                "with the config.json (and the keras_transformer version) that wrote it, or "
                "start a new run in another directory") from None
        except Exception as error:  # h5py, Keras and NumPy each raise their own
            problem = (error.problem if isinstance(error, runs.UnreadableWeights)
                       else f"{type(error).__name__}: {str(error).strip()[:200]}")
            print(f"Checkpoint {path} cannot be read ({problem}); renamed it to "
                  f"{os.path.basename(path)}.unreadable and going back to the one before.",
                  file=sys.stderr, flush=True)
            found.set_aside(path)
            continue
        if int(model.optimizer.iterations.numpy()) != step:
            raise ValueError(
                f"Checkpoint {path} holds optimizer step "
                f"{int(model.optimizer.iterations.numpy())}, not {step}; remove the file to "
                "resume from the previous checkpoint"
            )
        return step
    if checkpoints:
        # Partly loaded: neither the model nor the optimizer is in a known state.
        raise ValueError(f"no checkpoint in {directory} can be read; each is renamed to "
                         "<name>.unreadable. Put whole copies back to resume from them, or "
                         "run the same command again to start the run over from step 0")
    if init_from:
        path = runs.load_initial_weights(model, init_from)
        print(f"Starting from the weights of {path}, with a fresh optimizer.", flush=True)
    return 0


def average_checkpoints(model, paths):
    """Sets the training `model`'s weights to the mean of the checkpoints'
    (`runs.average_weights`; Sec. 6.1). `model` must be compiled as it was when
    the checkpoints were written: they hold its optimizer state too, which is
    loaded along and left as the last file's. Returns the averaged weights."""
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint path")
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    return runs.average_weights(model, paths)


def save_average(model, paths, path):
    """Averages the checkpoints into `model` (`average_checkpoints`) and writes
    the average, without optimizer state, to `path`; returns a new uncompiled
    model that holds it."""
    average_checkpoints(model, paths)
    averaged = build_transformer(model.config)
    averaged.set_weights(model.get_weights())
    write_atomically(path, averaged.save_weights)
    return averaged


# Logging -------------------------------------------------------------------


class RunLog(keras.callbacks.CSVLogger):
    """log.csv: one row per checkpoint interval, appended across `fit` calls and
    resumes. A file that has a header keeps its columns: a run resumed by a
    version that logs more leaves the new values out rather than shifting the
    old columns under the wrong names."""

    def __init__(self, filename):
        super().__init__(filename, append=True)

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if not self.append_header:  # the file has a header: its columns
            with open(self.filename, newline="") as f:
                self.keys = next(csv.reader(f))[1:]


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
    """Every `every_epochs` epochs, translates dev pairs with the model's current
    weights (beam search with the paper's settings, in the precision of a run's
    translations, `RUN_PRECISION`, as `evaluate --run --weights final` does) and
    adds their sacreBLEU to the logs as `bleu`.

    Args:
        tokenizer: the model's `SubwordTokenizer`.
        pairs: the dev pairs, `(source, target)` strings.
        every_epochs: how often; the logs get `bleu` on those epochs only.
        stop: a `StopOnSignal` before this callback: no BLEU on the epoch it
            stops training at, which a signal asked to end soon.
    """

    def __init__(self, tokenizer, pairs, every_epochs=1, stop=None):
        super().__init__()
        self.tokenizer = tokenizer
        self.pairs = list(pairs)
        self.every_epochs = every_epochs
        self.stop = stop

    def on_epoch_end(self, epoch, logs=None):
        if (logs is None or (epoch + 1) % self.every_epochs
                or (self.stop is not None and self.stop.stopped)):
            return
        # Imported here: sacrebleu and the translator only for runs that score BLEU.
        from keras_transformer import evaluation
        from keras_transformer import serving
        from keras_transformer.decoding_config import RUN_PRECISION
        from keras_transformer.decoding_config import in_process_settings

        # A new translator each time: it copies the weights it multiplies by.
        translator = serving.Translator(self.model, self.tokenizer, **in_process_settings(),
                                        precision=RUN_PRECISION)
        logs["bleu"] = float(evaluation.evaluate(translator, self.pairs,
                                                 named="dev sentence")["bleu"])


def run_callbacks(run, config, clock, chief=True, tokenizer=None, dev_pairs=None,
                  compiled_shapes=0, max_steps=None):
    """The callbacks of a `train.py` run, in order: stop on NaN, checkpoint, stop
    on Ctrl-C or SIGTERM once that checkpoint is written, learning rate, the
    clock, dev BLEU every `config.bleu_every` steps (chief only, with `tokenizer`
    and `dev_pairs`), the progress line, and on the chief the TensorBoard and CSV
    logs.

    Args:
        run: the `runs.Run` (or its directory) that the checkpoints and logs go to.
        compiled_shapes: the batch shapes XLA compiles the step for (0: no XLA),
            for the progress line's word on each compilation.
        max_steps: a budgeted run's cap on its steps (`--steps`), for the
            progress line's count.
    """
    run = runs.Run(run) if isinstance(run, (str, os.PathLike)) else run
    stop = StopOnSignal()
    callbacks = [
        keras.callbacks.TerminateOnNaN(),
        StepCheckpoint(run.checkpoints.directory, keep=config.keep_checkpoints, clock=clock),
        stop,
        LearningRateLogger(),
        clock,
    ]
    if config.bleu_every and chief:
        pairs = [(pair["source"].decode(), pair["target"].decode())
                 for pair in dev_pairs.take(config.bleu_sentences).as_numpy_iterator()]
        every_epochs = max(1, round(config.bleu_every / config.checkpoint_every))
        callbacks.append(BleuEvaluation(tokenizer, pairs, every_epochs, stop))
    callbacks.append(ProgressLine(config.steps, clock, compiled_shapes=compiled_shapes,
                                  max_steps=max_steps))
    if chief:
        callbacks += [
            keras.callbacks.TensorBoard(run.tensorboard_dir),
            RunLog(run.csv_log),
        ]
    return callbacks
