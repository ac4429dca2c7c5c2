"""What `tf.distribute` needs beyond Keras: picking a strategy, the workers of a
multi-worker run, and the two Keras 3 workarounds that let `fit` run on one.
"""

import json
import os

import keras
import tensorflow as tf

from keras_transformer.config import STRATEGIES
from keras_transformer.losses import LabelSmoothedCrossEntropy
from keras_transformer.losses import global_sum


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
      several GPUs, one_device with one, and with none TensorFlow's default
      strategy (no distribution): `OneDeviceStrategy` feeds a CPU through a
      prefetching iterator of its own whose threads compete with the steps
      for the cores and leave them idle at the end of every `fit` (the time
      breakdown in docs/cpu-recipes.md).

    Call it first: a multi-worker strategy must be made before TensorFlow runs
    anything.
    """
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
    if spans_workers(name):
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
    if name == "auto" and not gpus:
        return tf.distribute.get_strategy()
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


def spans_workers(name):
    """Whether the strategy called `name` runs several workers: "multi_worker", or
    "auto" where the `TF_CONFIG` environment variable names several tasks."""
    if name == "auto":
        cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
        return len(cluster.get("worker", [])) + len(cluster.get("chief", [])) > 1
    return name == "multi_worker"


def is_multi_worker(strategy):
    """Whether `strategy` is a MultiWorkerMirroredStrategy spanning several workers."""
    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and strategy.extended._in_multi_worker_mode())


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


def require_same_on_all_workers(strategy, value, what):
    """`same_on_all_workers`, or a `ValueError` saying that the workers disagree
    on `what` and that the run directory must be one that they all share."""
    if not same_on_all_workers(strategy, value):
        raise ValueError(f"the workers disagree on {what}; --out must be a directory that "
                         "every worker shares")


def spans_devices(strategy):
    """Whether `strategy`'s replicas are on several devices that one XLA program
    cannot span: MirroredStrategy over several GPUs, multi-worker; not TPUs, whose
    strategy compiles its replicas itself."""
    return strategy.num_replicas_in_sync > 1 and not isinstance(strategy, tf.distribute.TPUStrategy)


class MultiWorkerModel(keras.Model):
    """A `keras.Model` whose `fit` and `evaluate` also run under a
    `MultiWorkerMirroredStrategy` spanning several workers (Keras 3.x fails there
    on dict inputs and on scalar logs; see the two methods), on one device
    trace the training step once (see `_maybe_symbolic_build`), and with XLA on
    several devices compile each replica's step (see `compile`)."""

    replica_jit_compile = False

    def compile(self, *args, jit_compile="auto", **kwargs):
        """`keras.Model.compile`. With `jit_compile=True` under a strategy whose
        replicas span several devices (`spans_devices`), XLA compiles each
        replica's forward and backward pass (`replica_jit_compile` is then true
        and `jit_compile` false), and the all-reduces (the loss's token count, the
        gradients) and the optimizer's update run outside it: Keras alone would
        compile the step of all replicas as one program, which cannot reach the
        weights kept on the other devices ("Trying to access resource ...
        located in device GPU:1 from device GPU:0"). The loss must then be a
        `LabelSmoothedCrossEntropy`, which takes the global token count from
        outside the program."""
        self.replica_jit_compile = jit_compile is True and spans_devices(self.distribute_strategy)
        if self.replica_jit_compile:
            loss = kwargs.get("loss", args[1] if len(args) > 1 else None)
            if not isinstance(loss, LabelSmoothedCrossEntropy):
                raise ValueError(
                    "jit_compile=True on several devices compiles each replica's step, which "
                    "needs keras_transformer's LabelSmoothedCrossEntropy loss. Received: "
                    f"loss={loss!r}; use jit_compile=False for another loss.")
            jit_compile = False
        super().compile(*args, jit_compile=jit_compile, **kwargs)
        self._replica_steps = {}

    def compile_from_config(self, config):
        # Keras's own, which skips a model whose `compile` is overridden (a saved
        # model would load without its optimizer); this `compile` only adds to it.
        self.compile(**keras.saving.deserialize_keras_object(config))
        if hasattr(self, "optimizer") and self.built:
            self.optimizer.build(self.trainable_variables)  # its variables, to load

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras calls this at every `fit` and `evaluate`, so at every dev pass of a
        # run; under a strategy its own reads a batch for it, from an iterator made
        # for it: a dev pipeline started once more each checkpoint interval, for
        # nothing once the model, loss, metrics and optimizer are built (on an H200,
        # 1.0 s of an interval's 3.0 s of training steps; on a CPU, 0.6 s and at
        # times 10 s).
        if self._symbolically_built():
            return
        # Before the first step, Keras 3 (TensorFlow trainer) learns the batch's
        # structure by *reducing* the first distributed batch across replicas: a
        # collective that fails under MultiWorkerMirroredStrategy for dict inputs
        # ("Attempt to convert a value ({'encoder_inputs': PerReplica...",
        # keras-team/keras#20329). One local replica's batch has the same structure
        # and dtypes, which is all the symbolic build reads.
        strategy = self._distribute_strategy
        if strategy is None:
            # One device (the default strategy): Keras leaves the optimizer's slots
            # and the metrics' state to the first trace of the step, and a trace
            # that creates variables is traced again without them: the base model's
            # training step traced twice, 15 s each on a 2-core CPU, at every start
            # and resume. The batch (`train_on_batch`) or the dataset's spec (`fit`,
            # `evaluate`: Keras's TFEpochIterator; no batch read) builds them first.
            if data_batch is None:
                dataset = getattr(iterator, "_distributed_dataset", None)
                if dataset is None:
                    return super()._maybe_symbolic_build(iterator=iterator)
                data_batch = dataset.element_spec
            self._symbolic_build(data_batch=data_batch)
            return
        if iterator is None:
            return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)
        for _, _, batches in iterator:
            data_batch = tf.nest.map_structure(
                lambda value: strategy.experimental_local_results(value)[0], next(batches)
            )
            break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    def _symbolically_built(self):
        """Whether everything `_symbolic_build` builds is built."""
        return (all(layer.built for layer in self._flatten_layers())
                and all(part is None or part.built for part in (
                    self._compile_metrics, self._compile_loss, self.optimizer)))

    def train_step(self, data):
        if not self.replica_jit_compile:
            return self._before_multi_worker_reduction(super().train_step(data))
        # Keras's train_step, with the forward and backward pass compiled by XLA on
        # this replica and the global token count handed in.
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        token_count = global_sum(self.loss.token_count(y))
        loss, y_pred, gradients = self._replica_step("train")(x, y, sample_weight, token_count)
        self._track_loss(loss, x)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_weights))
        return self._before_multi_worker_reduction(
            self.compute_metrics(x, y, y_pred, sample_weight=sample_weight))

    def test_step(self, data):
        if not self.replica_jit_compile:
            return self._before_multi_worker_reduction(super().test_step(data))
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        token_count = global_sum(self.loss.token_count(y))
        loss, y_pred = self._replica_step("test")(x, y, sample_weight, token_count)
        self._track_loss(loss, x)
        return self._before_multi_worker_reduction(
            self.compute_metrics(x, y, y_pred, sample_weight=sample_weight))

    def _replica_step(self, kind):
        """This replica's XLA-compiled "train" (loss, logits, gradients) or "test"
        (loss, logits) pass; traced once for each replica's device."""
        if kind not in self._replica_steps:
            self._replica_steps[kind] = tf.function(
                self._replica_train if kind == "train" else self._replica_test,
                jit_compile=True, reduce_retracing=True)
        return self._replica_steps[kind]

    def _replica_loss(self, y, y_pred, sample_weight, token_count):
        loss = self.loss.over_tokens(y, y_pred, sample_weight, token_count)
        if self.losses:  # as Keras adds them: scaled by the replicas (the sum of N)
            loss += tf.add_n(self.losses) / self.distribute_strategy.num_replicas_in_sync
        return loss

    def _replica_train(self, x, y, sample_weight, token_count):
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self._replica_loss(y, y_pred, sample_weight, token_count)
            scaled = self.optimizer.scale_loss(loss)  # mixed_float16's loss scale
        return loss, y_pred, tape.gradient(scaled, self.trainable_weights)

    def _replica_test(self, x, y, sample_weight, token_count):
        y_pred = self(x, training=False)
        return self._replica_loss(y, y_pred, sample_weight, token_count), y_pred

    def _track_loss(self, loss, x):
        # As Keras's steps log it: each replica's share times the replicas
        # (unscale_loss_for_distribution), weighed by its rows.
        self._loss_tracker.update_state(
            loss * self.distribute_strategy.num_replicas_in_sync,
            sample_weight=tf.shape(tf.nest.flatten(x)[0])[0])

    def _before_multi_worker_reduction(self, logs):
        # Across workers Keras 3 averages each step's logs with
        # `strategy.reduce("MEAN", value, axis=0)`, which fails on scalars ("Invalid
        # reduction dimension 0 for input with 0 dimensions", tensorflow#72388).
        # The values are already the same on every replica (synchronized metrics),
        # so a length-1 axis makes that mean a no-op that returns the scalar.
        if not is_multi_worker(self.distribute_strategy):
            return logs
        return tf.nest.map_structure(lambda value: tf.reshape(value, [-1]), logs)
