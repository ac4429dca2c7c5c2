"""Pieces shared by the encoder and decoder layers."""

import keras
from keras import ops

from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.dropout import check_rate


class TransformerBlock(keras.layers.Layer):
    """The arguments shared by the encoder and decoder layers (see those)."""

    def __init__(
        self,
        num_heads,
        d_ff,
        key_dim=None,
        value_dim=None,
        dropout_rate=0.1,
        norm_first=False,
        layer_norm_epsilon=1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_rate(dropout_rate)
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.dropout_rate = dropout_rate
        self.norm_first = norm_first
        self.layer_norm_epsilon = layer_norm_epsilon

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "d_ff": self.d_ff,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout_rate": self.dropout_rate,
                "norm_first": self.norm_first,
                "layer_norm_epsilon": self.layer_norm_epsilon,
            }
        )
        return config


def residual(layer, x, sublayer, norm, dropout, training):
    """Sec. 5.4: `LayerNorm(x + Dropout(Sublayer(x)))`, or pre-norm.

    `sublayer` returns `(output, extra)`; returns `(new_x, extra)`.
    """
    if layer.norm_first:
        outputs, extra = sublayer(norm(x))
        return ops.add(x, dropout(outputs, training=training)), extra
    outputs, extra = sublayer(x)
    return norm(ops.add(x, dropout(outputs, training=training))), extra


def norm_and_dropout(layer, name, inputs_shape):
    norm = keras.layers.LayerNormalization(
        epsilon=layer.layer_norm_epsilon, dtype=layer.dtype_policy, name=f"{name}_norm"
    )
    norm.build(inputs_shape)
    dropout = Dropout(
        layer.dropout_rate, dtype=layer.dtype_policy, name=f"{name}_dropout"
    )
    return norm, dropout


def head_dims(d_model, num_heads, key_dim, value_dim):
    if (key_dim is None or value_dim is None) and d_model % num_heads:
        raise ValueError(
            f"d_model must be divisible by num_heads unless key_dim and value_dim are "
            f"given. Received: d_model={d_model}, num_heads={num_heads}"
        )
    return key_dim or d_model // num_heads, value_dim or d_model // num_heads
