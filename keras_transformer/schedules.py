"""The paper's learning-rate schedule (Sec. 5.3)."""

import keras
from keras import ops

from keras_transformer.config import PAPER_WARMUP_STEPS


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)`.

    The rate grows linearly for the first `warmup_steps` steps and then decays
    with the inverse square root of the step; it peaks at step `warmup_steps`
    with `scale * (d_model * warmup_steps)^-0.5`.

    The paper's `step_num` counts from 1; Keras optimizers count their
    iterations from 0, so `schedule(iterations)` evaluates the formula at
    `step_num = iterations + 1` (the first update uses step 1).

    Args:
        d_model: the model width.
        warmup_steps: the paper's 4000; a number, or a `keras.Variable` that the
            schedule reads at every step (so that a run can plan its warm-up
            after it has started, as `train.py --time-budget` does).
        scale: a constant factor (1.0 in the paper); a number or a
            `keras.Variable`, like `warmup_steps`.

    Example:
    >>> schedule = TransformerSchedule(d_model=512)
    >>> optimizer = keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    """

    def __init__(self, d_model, warmup_steps=PAPER_WARMUP_STEPS, scale=1.0):
        if d_model < 1:
            raise ValueError(f"d_model must be >= 1. Received: d_model={d_model}")
        if _value(warmup_steps) < 1:
            raise ValueError(
                f"warmup_steps must be >= 1. Received: warmup_steps={_value(warmup_steps)}"
            )
        if _value(scale) <= 0:
            raise ValueError(f"scale must be > 0. Received: scale={_value(scale)}")
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step):
        step_num = ops.cast(step, "float32") + 1.0
        warmup = ops.cast(self.warmup_steps, "float32")
        rate = ops.minimum(ops.power(step_num, -0.5), step_num * ops.power(warmup, -1.5))
        return ops.cast(self.scale, "float32") * self.d_model**-0.5 * rate

    def peak_learning_rate(self):
        """The rate at step `warmup_steps`: `scale * (d_model * warmup_steps)^-0.5`."""
        return _value(self.scale) * (self.d_model * _value(self.warmup_steps)) ** -0.5

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": _value(self.warmup_steps),
                "scale": _value(self.scale)}


def _value(number):
    """A schedule setting as a Python number, also when a variable holds it."""
    if isinstance(number, keras.Variable):
        return float(keras.ops.convert_to_numpy(number))
    return number
