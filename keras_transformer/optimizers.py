"""The paper's optimizer (Sec. 5.3), and gradient accumulation that works under
every `tf.distribute` strategy."""

import keras
from keras import ops

from keras_transformer.schedules import TransformerSchedule

# Sec. 5.3: "We used the Adam optimizer with beta1 = 0.9, beta2 = 0.98 and epsilon = 1e-9".
ADAM_SETTINGS = dict(beta_1=0.9, beta_2=0.98, epsilon=1e-9)


def transformer_optimizer(d_model, warmup_steps=4000, scale=1.0, accumulate_steps=1):
    """Adam with the paper's beta1 0.9, beta2 0.98, epsilon 1e-9 and schedule
    (Sec. 5.3); with `accumulate_steps` N > 1, an `AccumulatingAdam` that makes
    one update from every N batches."""
    return adam(TransformerSchedule(d_model, warmup_steps, scale), accumulate_steps)


def adam(learning_rate, accumulate_steps=1):
    """Adam with the paper's settings; an `AccumulatingAdam` for N > 1."""
    if accumulate_steps == 1:
        return keras.optimizers.Adam(learning_rate, **ADAM_SETTINGS)
    return AccumulatingAdam(learning_rate, accumulate_steps=accumulate_steps, **ADAM_SETTINGS)


@keras.saving.register_keras_serializable(package="keras_transformer")
class AccumulatingAdam(keras.optimizers.Adam):
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
