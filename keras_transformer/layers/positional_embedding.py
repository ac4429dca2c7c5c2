import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class LearnedPositionalEmbedding(keras.layers.Layer):
    """Learned positional embeddings, the alternative of Table 3 row (E).

    Args:
        max_positions: the number of positions that have an embedding.
        embeddings_initializer: initializer of the `(max_positions, d_model)`
            table.

    Call arguments:
        inputs: `(B, T, d_model)` embeddings; only their shape is used.
        start_index: position of the first token (for step-by-step decoding).

    Returns:
        `(B, T, d_model)` position embeddings, to be added to the embeddings.
    """

    def __init__(self, max_positions, embeddings_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if max_positions < 1:
            raise ValueError(f"max_positions must be >= 1. Received: max_positions={max_positions}")
        self.max_positions = max_positions
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, inputs_shape):
        self.position_embeddings = self.add_weight(
            name="embeddings",
            shape=(self.max_positions, inputs_shape[-1]),
            initializer=self.embeddings_initializer,
        )

    def call(self, inputs, start_index=0):
        shape = ops.shape(inputs)
        embeddings = ops.slice(
            self.position_embeddings, (start_index, 0), (shape[-2], inputs.shape[-1])
        )  # (T, d)
        return ops.broadcast_to(embeddings, shape)

    def compute_output_spec(self, inputs, start_index=0):
        return keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_positions": self.max_positions,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
