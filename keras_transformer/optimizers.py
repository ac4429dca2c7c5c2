"""The paper's optimizer (Sec. 5.3), its update compiled by XLA on each device of a
`tf.distribute` strategy, and gradient accumulation that works under every strategy."""

import contextlib

import keras
import tensorflow as tf
from keras import ops
# What MirroredStrategy's own per-variable update enters for each device
# (`MirroredExtended._update`): no public API compiles all of a device's updates
# as one program.
from tensorflow.python.distribute.distribute_lib import UpdateContext
from tensorflow.python.distribute.distribute_utils import select_replica

from keras_transformer.config import PAPER_WARMUP_STEPS
from keras_transformer.schedules import TransformerSchedule

# Sec. 5.3: "We used the Adam optimizer with beta1 = 0.9, beta2 = 0.98 and epsilon = 1e-9".
ADAM_SETTINGS = dict(beta_1=0.9, beta_2=0.98, epsilon=1e-9)


def transformer_optimizer(d_model, warmup_steps=PAPER_WARMUP_STEPS, scale=1.0, accumulate_steps=1,
                          jit_compile=False):
    """Adam with the paper's beta1 0.9, beta2 0.98, epsilon 1e-9 and schedule
    (Sec. 5.3); with `accumulate_steps` N > 1, an `AccumulatingAdam` that makes
    one update from every N batches; `jit_compile` as `Adam`'s."""
    return adam(TransformerSchedule(d_model, warmup_steps, scale), accumulate_steps, jit_compile)


def adam(learning_rate, accumulate_steps=1, jit_compile=False):
    """`Adam` with the paper's settings; an `AccumulatingAdam` for N > 1."""
    if accumulate_steps == 1:
        return Adam(learning_rate, jit_compile=jit_compile, **ADAM_SETTINGS)
    return AccumulatingAdam(learning_rate, accumulate_steps=accumulate_steps,
                            jit_compile=jit_compile, **ADAM_SETTINGS)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Adam(keras.optimizers.Adam):
    """Keras's Adam, each variable's update one fused op (`ResourceApplyAdam`, the
    same formula), whose update of variables mirrored over devices (under
    `MirroredStrategy` or `MultiWorkerMirroredStrategy`) runs, with `jit_compile`,
    as one XLA program on each device.

    Keras makes each variable's update from 22 small graph ops; the fused op
    makes the base model's training step 18000 ops instead of 22600, which a run
    traces, and converts for XLA, as it starts: its trace took 8.4 to 8.8 s
    instead of 10.7 to 10.8 s on a 2-core Intel Xeon.

    With XLA compiling each replica's forward and backward pass
    (`distributed.MultiWorkerModel`), the update runs outside that program, after
    the gradients' all-reduce; as Keras runs it, each variable's update is a few
    small kernels of its own: 49 ms on an H200 for the base model's 253 variables,
    more than the rest of its step (38 ms), against 7 ms as one XLA program
    (benchmarks/results/gpu/2026-11-27-update-xla-h200.log; before the fused op).
    Here each device's updates of all the variables, all-reduced gradients in, are
    one program. On one device (no mirrored variables) the update sits in the
    step's program when the step is compiled.

    Args:
        learning_rate: a float or a `LearningRateSchedule`.
        jit_compile: whether mirrored variables' update is compiled by XLA.
        **kwargs: `keras.optimizers.Adam`'s.
    """

    def __init__(self, learning_rate=0.001, jit_compile=False, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.jit_compile = jit_compile
        self._device_updates = {}  # replica index: its compiled update
        self._scalars = None  # while an update is made: dtype -> ResourceApplyAdam's scalars

    def _distributed_tf_update_step(self, distribution, grads_and_vars, learning_rate):
        variables = [variable for _, variable in grads_and_vars]
        if not isinstance(variables[0], tf.distribute.DistributedValues):
            with self._update_scalars(variables, learning_rate):
                return super()._distributed_tf_update_step(distribution, grads_and_vars,
                                                           learning_rate)
        if not self.jit_compile:
            return super()._distributed_tf_update_step(distribution, grads_and_vars,
                                                       learning_rate)
        # In the cross-replica context, after the all-reduce. As MirroredStrategy's
        # own update of one variable does for each device, with the device's
        # replica as the update's context, so that the optimizer's own variables
        # (moments, step count) read and write their copies on that device.
        for replica, device_variables in enumerate(zip(*(v.values for v in variables))):
            gradients = [select_replica(replica, gradient) for gradient, _ in grads_and_vars]
            with tf.device(device_variables[0].device), UpdateContext(replica):
                # A float learning rate is a variable: its value on this device.
                rate = tf.convert_to_tensor(select_replica(replica, learning_rate))
                self._device_update(replica)(gradients, list(device_variables), rate)

    def _device_update(self, replica):
        """The update of replica `replica`'s copies of the variables, one XLA
        program, traced once for that replica's device."""
        if replica not in self._device_updates:
            def update(gradients, variables, learning_rate):
                with self._update_scalars(variables, learning_rate):
                    for gradient, variable in zip(gradients, variables):
                        self.update_step(gradient, variable, learning_rate)

            self._device_updates[replica] = tf.function(update, jit_compile=True)
        return self._device_updates[replica]

    @contextlib.contextmanager
    def _update_scalars(self, variables, learning_rate):
        """Within it, `update_step` makes each variable's update one fused op
        (`ResourceApplyAdam`, which XLA compiles too) from the learning rate and
        the step's powers of beta1 and beta2, made here once for all `variables`
        (on one device)."""
        if self.amsgrad:  # Keras's own update
            yield
            return
        step = ops.cast(self.iterations + 1, "float32")
        self._scalars = {}
        for dtype in {variable.dtype for variable in variables}:
            def constant(value, dtype=dtype):
                return tf.cast(value, dtype)

            self._scalars[dtype] = dict(
                lr=constant(learning_rate),
                beta1_power=tf.pow(constant(self.beta_1), constant(step)),
                beta2_power=tf.pow(constant(self.beta_2), constant(step)),
                beta1=constant(self.beta_1), beta2=constant(self.beta_2),
                epsilon=constant(self.epsilon))
        try:
            yield
        finally:
            self._scalars = None

    def update_step(self, gradient, variable, learning_rate):
        """Keras's Adam step (Algorithm 1 of Kingma and Ba, with its epsilon-hat),
        as one `ResourceApplyAdam` within `_update_scalars`: alpha = lr x
        sqrt(1 - beta2^t) / (1 - beta1^t), m += (g - m)(1 - beta1), v += (g^2 - v)
        (1 - beta2), variable -= alpha x m / (sqrt(v) + epsilon)."""
        if self._scalars is None:
            return super().update_step(gradient, variable, learning_rate)
        index = self._get_variable_index(variable)
        return tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable), m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            grad=tf.cast(tf.convert_to_tensor(gradient), variable.dtype),
            **self._scalars[variable.dtype])

    def get_config(self):
        return {**super().get_config(), "jit_compile": self.jit_compile}


def _handle(variable):
    """The resource handle of a Keras variable or a `tf.Variable` (under a
    strategy's update, the handle of the copy on the update's device)."""
    return (variable.value if isinstance(variable, keras.Variable) else variable).handle


@keras.saving.register_keras_serializable(package="keras_transformer")
class AccumulatingAdam(Adam):
    """Adam that makes one update from every `accumulate_steps` batches, with the
    mean of their gradients: a batch N times larger than fits the device.

    Keras's own `gradient_accumulation_steps` chooses between accumulating and
    updating around the cross-replica update, which `MirroredStrategy` and
    `MultiWorkerMirroredStrategy` refuse ("`merge_call` called while defining a
    new graph"). Here every call all-reduces its gradients as usual, and the
    choice is made inside each variable's own update: add the gradient to the
    variable's accumulator, or, on every N-th call, take an Adam step with the
    mean of the N gradients and clear the accumulator.

    `iterations` counts updates (so checkpoints, Adam's bias correction and the
    learning-rate schedule do too); a checkpoint taken between updates would
    hold a partial sum, so take them at multiples of N calls (`train.py` does).

    For the loss to be normalized over the target tokens of all N batches
    together, as one step on their concatenation would be, weigh each batch's
    tokens by N x (its target tokens) / (the N batches' target tokens):
    `TrainingBatches.dataset(accumulate_steps=N)` gives those weights.

    Args:
        learning_rate: a float or a `LearningRateSchedule`, evaluated at updates.
        accumulate_steps: N, the batches per update.
        **kwargs: `keras.optimizers.Adam`'s.
    """

    def __init__(self, learning_rate=0.001, accumulate_steps=2, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        if accumulate_steps < 1:
            raise ValueError(
                f"accumulate_steps must be >= 1. Received: accumulate_steps={accumulate_steps}")
        self.accumulate_steps = accumulate_steps

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._accumulated = self.add_optimizer_variables(var_list, "accumulated_gradient")

    @property
    def iterations(self):
        return ops.floor_divide(self._iterations, self.accumulate_steps)

    @property
    def pending_batches(self):
        """The batches added to the accumulators since the last update (a
        checkpoint or a stop belongs where there are none)."""
        return ops.mod(self._iterations, self.accumulate_steps)

    def _get_current_learning_rate(self):
        if isinstance(self._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            return self._learning_rate(self.iterations)
        return super()._get_current_learning_rate()

    def update_step(self, gradient, variable, learning_rate):
        accumulated = self._accumulated[self._get_variable_index(variable)]
        gradient = ops.cast(gradient, accumulated.dtype)
        last = ops.equal((self._iterations + 1) % self.accumulate_steps, 0)

        def update():
            mean = (accumulated + gradient) / self.accumulate_steps
            super(AccumulatingAdam, self).update_step(mean, variable, learning_rate)
            self.assign(accumulated, ops.zeros_like(accumulated))

        def accumulate():
            self.assign_add(accumulated, gradient)

        ops.cond(last, update, accumulate)

    def get_config(self):
        return {**super().get_config(), "accumulate_steps": self.accumulate_steps}
