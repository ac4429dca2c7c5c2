import keras

from keras_transformer.layers.projection import Projection


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionwiseFeedForward(keras.layers.Layer):
    """`FFN(x) = max(0, x W1 + b1) W2 + b2`, applied at each position (Sec. 3.3).

    Args:
        d_ff: the inner size (paper: 2048 for base, 4096 for big).
        activation: the inner activation; the paper's is ReLU.
        kernel_initializer: initializer of W1 and W2.
        bias_initializer: initializer of b1 and b2.

    Call arguments:
        inputs: `(B, T, d_model)`.
        search_options: optional `SearchOptions`, passed to the projections.

    Returns:
        `(B, T, d_model)`.
    """

    def __init__(
        self,
        d_ff,
        activation="relu",
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if d_ff < 1:
            raise ValueError(f"d_ff must be >= 1. Received: d_ff={d_ff}")
        self.d_ff = d_ff
        self.activation = keras.activations.get(activation)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def build(self, inputs_shape):
        def projection(units, name, input_shape):
            layer = Projection(
                units,
                kernel_initializer=self.kernel_initializer,
                bias_initializer=self.bias_initializer,
                dtype=self.dtype_policy,
                name=name,
            )
            layer.build(input_shape)
            return layer

        # Named and shaped as keras.layers.Dense would be: W1, b1 and W2, b2.
        d_model = inputs_shape[-1]
        self._inner_dense = projection(self.d_ff, "inner", inputs_shape)
        self._output_dense = projection(d_model, "output", (*inputs_shape[:-1], self.d_ff))

    def call(self, inputs, search_options=None):
        hidden = self.activation(self._inner_dense(inputs, search_options=search_options))
        return self._output_dense(hidden, search_options=search_options)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "d_ff": self.d_ff,
                "activation": keras.activations.serialize(self.activation),
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
