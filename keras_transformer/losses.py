"""Label-smoothed cross entropy over non-padding target tokens (Sec. 5.4)."""

import keras
import tensorflow as tf
from keras import ops

from keras_transformer.token_ids import PAD_ID


def token_cross_entropy(targets, logits, label_smoothing=0.0):
    """Per-token label-smoothed cross entropy, without a one-hot over the vocabulary.

    With the smoothed target `q = (1 - eps) * onehot(y) + eps / V` (as in
    Szegedy et al. 2016 and `keras.losses.CategoricalCrossentropy`),
    `-sum_k q_k log p_k = lse - (1 - eps) * z_y - eps * mean_k z_k`, where `z`
    are the logits and `lse = logsumexp(z)`; its gradient is `softmax(z) - q`.
    Both are written out: the forward pass reads the logits twice, the backward
    pass writes the gradient once and subtracts `1 - eps` at the targets with a
    scatter, instead of the several `(B, T, V)` passes autodiff would make.

    Args:
        targets: int `(B, T)` target ids.
        logits: `(B, T, V)` logits (computed in float32).
        label_smoothing: eps_ls.

    Returns:
        float32 `(B, T)` losses, padding positions included (mask them yourself).
    """
    logits = tf.cast(logits, tf.float32)
    targets = tf.cast(targets, tf.int32)
    epsilon = float(label_smoothing)

    @tf.custom_gradient
    def cross_entropy(logits):
        log_normalizer = tf.reduce_logsumexp(logits, axis=-1)  # (B, T)
        target_logits = tf.gather(logits, targets, batch_dims=2)  # (B, T)
        losses = log_normalizer - (1.0 - epsilon) * target_logits
        if epsilon:
            losses -= epsilon * tf.reduce_mean(logits, axis=-1)

        def gradient(upstream):  # (B, T)
            vocab_size = tf.cast(tf.shape(logits)[-1], tf.float32)
            upstream = upstream[..., None]  # (B, T, 1)
            result = (tf.exp(logits - log_normalizer[..., None]) - epsilon / vocab_size) * upstream
            shape = tf.shape(targets)
            rows, columns = tf.meshgrid(tf.range(shape[0]), tf.range(shape[1]), indexing="ij")
            indices = tf.stack([rows, columns, targets], axis=-1)  # (B, T, 3)
            return tf.tensor_scatter_nd_sub(result, indices, (1.0 - epsilon) * upstream[..., 0])

        return losses, gradient

    return cross_entropy(logits)


def global_sum(value):
    """Sums `value` over the replicas of the current `tf.distribute` replica context."""
    context = tf.distribute.get_replica_context()
    if context is not None and context.num_replicas_in_sync > 1:
        return context.all_reduce(tf.distribute.ReduceOp.SUM, value)
    return value


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Label-smoothed cross entropy averaged over the non-padding target tokens
    of the whole global batch.

    Under a `tf.distribute` strategy each replica divides its token-loss sum by
    the token count of the global batch (an all-reduce), and Keras sums the
    replicas' gradients, so N replicas compute exactly the gradient of one
    device on the same global batch, however the padding falls.

    `sample_weight` (per token, (B, T), or per row, (B, 1)) multiplies the token
    losses; the divisor stays the count of non-padding tokens, as in Keras's
    "sum_over_batch_size". That is how `TrainingBatches.dataset(accumulate_steps=N)`
    normalizes a loss over N batches that make one update.

    Args:
        label_smoothing: eps_ls (paper: 0.1).
        padding_id: target id that carries no loss.
    """

    def __init__(self, label_smoothing=0.1, padding_id=PAD_ID, name="label_smoothed_ce",
                 **kwargs):
        super().__init__(name=name, **kwargs)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(
                f"label_smoothing must be in [0, 1). Received: label_smoothing={label_smoothing}"
            )
        self.label_smoothing = label_smoothing
        self.padding_id = padding_id

    def call(self, y_true, y_pred):
        return token_cross_entropy(y_true, y_pred, self.label_smoothing)

    def __call__(self, y_true, y_pred, sample_weight=None):
        return self.over_tokens(y_true, y_pred, sample_weight,
                                global_sum(self.token_count(y_true)))

    def token_count(self, y_true):
        """The non-padding tokens of `y_true` (this replica's), as a float32 scalar."""
        return ops.sum(ops.cast(ops.not_equal(y_true, self.padding_id), "float32"))

    def over_tokens(self, y_true, y_pred, sample_weight, token_count):
        """The (weighted) token-loss sum of `y_true` over `token_count`: the loss,
        given the global batch's token count, so that a step compiled with XLA
        on each replica (`distributed.MultiWorkerModel`) can take the all-reduce
        that counts them from outside its program."""
        losses = self.call(y_true, y_pred)  # (B, T)
        real = ops.cast(ops.not_equal(y_true, self.padding_id), "float32")
        if sample_weight is not None:
            losses = losses * ops.cast(sample_weight, "float32")
        return ops.sum(losses * real) / ops.maximum(token_count, 1.0)

    def get_config(self):
        return {
            "name": self.name,
            "label_smoothing": self.label_smoothing,
            "padding_id": self.padding_id,
        }
