"""Metrics over non-padding target tokens."""

import keras
import tensorflow as tf
from keras import ops

from keras_transformer.losses import token_cross_entropy
from keras_transformer.token_ids import PAD_ID


class _TokenMean(keras.metrics.Metric):
    """Sum of a per-token value over non-padding tokens, and their count."""

    def __init__(self, padding_id=PAD_ID, **kwargs):
        super().__init__(**kwargs)
        self.padding_id = padding_id
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def token_values(self, y_true, y_pred):
        raise NotImplementedError

    def update_state(self, y_true, y_pred, sample_weight=None):
        weights = ops.cast(ops.not_equal(y_true, self.padding_id), "float32")
        if sample_weight is not None:
            weights = weights * ops.cast(sample_weight, "float32")
        values = ops.cast(self.token_values(y_true, y_pred), "float32")
        self.total.assign_add(ops.sum(values * weights))
        self.count.assign_add(ops.sum(weights))

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)

    def get_config(self):
        return {"name": self.name, "padding_id": self.padding_id}


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenAccuracy(_TokenMean):
    """Share of non-padding target tokens to which the model gives its largest
    logit (the arg-max prediction is right; where several tie for the largest,
    the target among them counts as right)."""

    def __init__(self, padding_id=PAD_ID, name="token_accuracy", **kwargs):
        super().__init__(padding_id=padding_id, name=name, **kwargs)

    def token_values(self, y_true, y_pred):
        # Right where the target's logit is the largest (a tie for the largest
        # counts as right). Compared with the maximum rather than the arg-max:
        # TensorFlow's ArgMax over the vocabulary took 9% to 17% of a training
        # step on a CPU (cpu-small, tiny), the maximum and a gather 2% to 4%.
        # The gather as the loss makes it: with `ops.take_along_axis` instead, a
        # second run found only half of the first one's XLA programs in the
        # compile cache (tests/test_train_cli.py).
        target = tf.gather(y_pred, tf.cast(y_true, tf.int32), batch_dims=2)  # (B, T)
        return ops.greater_equal(target, ops.max(y_pred, axis=-1))

    def result(self):
        return ops.divide_no_nan(self.total, self.count)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Perplexity(_TokenMean):
    """`exp` of the mean (unsmoothed) negative log-likelihood per non-padding token."""

    def __init__(self, padding_id=PAD_ID, name="perplexity", **kwargs):
        super().__init__(padding_id=padding_id, name=name, **kwargs)

    def token_values(self, y_true, y_pred):
        return token_cross_entropy(y_true, y_pred)

    def result(self):
        return ops.exp(ops.divide_no_nan(self.total, self.count))


@keras.saving.register_keras_serializable(package="keras_transformer")
class TargetTokens(keras.metrics.Metric):
    """How many non-padding target tokens the steps trained on (a sum, reset each
    epoch, over all replicas): the numerator of the progress line's tokens/s."""

    def __init__(self, padding_id=PAD_ID, name="target_tokens", **kwargs):
        super().__init__(name=name, **kwargs)
        self.padding_id = padding_id
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.count.assign_add(ops.sum(ops.cast(ops.not_equal(y_true, self.padding_id),
                                               "float32")))

    def result(self):
        # A value, not the variable: the logs would read it again after the dev
        # pass had reset and refilled it.
        return ops.add(self.count, 0.0)

    def reset_state(self):
        self.count.assign(0.0)

    def get_config(self):
        return {"name": self.name, "padding_id": self.padding_id}
