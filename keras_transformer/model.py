"""The encoder-decoder Transformer as a functional `keras.Model` (Sec. 3)."""

import keras
import tensorflow as tf
from keras import ops

from keras_transformer.config import TransformerConfig
from keras_transformer.layers import Dropout
from keras_transformer.layers import LearnedPositionalEmbedding
from keras_transformer.layers import SharedEmbedding
from keras_transformer.layers import SinusoidalPositionalEncoding
from keras_transformer.layers import TransformerDecoderLayer
from keras_transformer.layers import TransformerEncoderLayer

PADDING_ID = 0


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """The Transformer encoder-decoder, a functional model.

    Inputs are a dict of two int32 tensors, `encoder_inputs` `(B, S)` (source ids)
    and `decoder_inputs` `(B, T)` (target ids shifted right, starting with the
    begin-of-sequence id), padded with id 0; the padding and causal masks are
    derived inside. The output is float32 logits `(B, T, vocab_size)`.

    Beyond `model(inputs)`, three methods serve incremental decoding: `encode`
    runs the encoder; `initial_cache` runs it once per source and computes every
    decoder layer's cross-attention keys and values once; `decode_step` decodes
    one position with the fixed-size self-attention cache.

    Args:
        config: a `TransformerConfig` (or its dict).
        dtype: optional dtype policy for every layer (e.g. "mixed_bfloat16");
            defaults to the global policy.

    Example:
    >>> config = TransformerConfig.tiny(vocab_size=100)
    >>> model = Transformer(config)
    >>> logits = model({"encoder_inputs": keras.ops.ones((2, 7), "int32"),
    ...                 "decoder_inputs": keras.ops.ones((2, 5), "int32")})
    >>> logits.shape
    (2, 5, 100)
    """

    def __init__(self, config, dtype=None, **kwargs):
        if isinstance(config, dict):
            config = TransformerConfig.from_dict(config)
        policy = keras.dtype_policies.get(dtype) if dtype else keras.config.dtype_policy()

        # === Layers ===
        self.embedding = SharedEmbedding(
            config.vocab_size, config.d_model, dtype=policy, name="shared_embedding"
        )
        if config.positional_encoding == "learned":
            self.encoder_position, self.decoder_position = (
                LearnedPositionalEmbedding(config.max_length, dtype=policy, name=name)
                for name in ("encoder_position", "decoder_position")
            )
        else:
            self.encoder_position, self.decoder_position = (
                SinusoidalPositionalEncoding(dtype=policy, name=name)
                for name in ("encoder_position", "decoder_position")
            )
        # Sec. 5.4: dropout on the sums of the embeddings and the positional encodings.
        self.encoder_dropout, self.decoder_dropout = (
            Dropout(config.dropout_rate, dtype=policy, name=name)
            for name in ("encoder_embedding_dropout", "decoder_embedding_dropout")
        )
        layer_args = dict(
            num_heads=config.num_heads,
            d_ff=config.d_ff,
            key_dim=config.d_k,
            value_dim=config.d_v,
            dropout_rate=config.dropout_rate,
            norm_first=config.norm_first,
            layer_norm_epsilon=config.layer_norm_epsilon,
            dtype=policy,
        )
        self.encoder_layers = [
            TransformerEncoderLayer(**layer_args, name=f"encoder_layer_{i}")
            for i in range(config.num_layers)
        ]
        self.decoder_layers = [
            TransformerDecoderLayer(**layer_args, name=f"decoder_layer_{i}")
            for i in range(config.num_layers)
        ]
        # Pre-norm stacks end with a layer norm; post-norm ones already do.
        self.encoder_norm, self.decoder_norm = (
            keras.layers.LayerNormalization(
                epsilon=config.layer_norm_epsilon, dtype=policy, name=name
            )
            if config.norm_first
            else None
            for name in ("encoder_norm", "decoder_norm")
        )

        # === Functional model ===
        encoder_inputs = keras.Input(shape=(None,), dtype="int32", name="encoder_inputs")
        decoder_inputs = keras.Input(shape=(None,), dtype="int32", name="decoder_inputs")
        encoder_padding_mask = ops.not_equal(encoder_inputs, PADDING_ID)  # (B, S)
        decoder_padding_mask = ops.not_equal(decoder_inputs, PADDING_ID)  # (B, T)
        encoder_outputs = self._encode(encoder_inputs, encoder_padding_mask)
        x = self._embed(decoder_inputs, self.decoder_position, self.decoder_dropout)
        for layer in self.decoder_layers:
            x = layer(
                x,
                encoder_outputs,
                decoder_padding_mask=decoder_padding_mask,
                encoder_padding_mask=encoder_padding_mask,
            )
        logits = self._logits(x)
        super().__init__(
            inputs={"encoder_inputs": encoder_inputs, "decoder_inputs": decoder_inputs},
            outputs=logits,
            name=kwargs.pop("name", "transformer"),
            **kwargs,
        )

        # === Config ===
        self.config = config
        self._policy = policy

    # Incremental decoding --------------------------------------------------

    def encode(self, encoder_inputs, training=False):
        """Encoder output `(B, S, d_model)` for source ids `(B, S)`."""
        encoder_inputs = ops.convert_to_tensor(encoder_inputs, "int32")
        padding_mask = ops.not_equal(encoder_inputs, PADDING_ID)
        return self._encode(encoder_inputs, padding_mask, training=training)

    def initial_cache(self, encoder_inputs, max_length):
        """The decoding state for source ids `(B, S)`, before the first step.

        Runs the encoder once and every decoder layer's cross-attention key and
        value projections once. Every entry has the batch as its first axis, so
        a beam search can tile and reorder it with `tf.gather`.

        Args:
            encoder_inputs: int32 `(B, S)` source ids, padded with 0.
            max_length: the number of decoder positions the self-attention
                cache holds (the begin-of-sequence token included).

        Returns:
            A dict: `"self_attention"` and `"cross_attention"`, lists (one entry
            per decoder layer) of `(keys (B, L, h, d_k), values (B, L, h, d_v))`
            with `L = max_length` (zeros) and `L = S`; `"encoder_padding_mask"`,
            boolean `(B, S)`.
        """
        encoder_inputs = ops.convert_to_tensor(encoder_inputs, "int32")
        padding_mask = ops.not_equal(encoder_inputs, PADDING_ID)  # (B, S)
        encoder_outputs = self._encode(encoder_inputs, padding_mask, training=False)
        batch_size = ops.shape(encoder_inputs)[0]
        config = self.config
        dtype = self._policy.compute_dtype

        def zeros(head_dim):
            return ops.zeros((batch_size, max_length, config.num_heads, head_dim), dtype)

        return {
            "self_attention": [
                (zeros(config.d_k), zeros(config.d_v)) for _ in self.decoder_layers
            ],
            "cross_attention": [
                layer.project_encoder_sequence(encoder_outputs) for layer in self.decoder_layers
            ],
            "encoder_padding_mask": padding_mask,
        }

    def decode_step(self, token_ids, cache, step):
        """Logits for the position after `step`, and the updated cache.

        Args:
            token_ids: int32 `(B,)`, the tokens at position `step` (position 0
                holds the begin-of-sequence id).
            cache: the dict from `initial_cache` or from the previous step.
            step: int scalar, the position of `token_ids`.

        Returns:
            `(logits, cache)`: float32 `(B, vocab_size)` logits of the next
            token, and the cache with position `step` written.
        """
        token_ids = ops.expand_dims(ops.convert_to_tensor(token_ids, "int32"), 1)  # (B, 1)
        x = self._embed(token_ids, self.decoder_position, self.decoder_dropout, step, False)
        self_caches = []
        for layer, self_cache, cross_cache in zip(
            self.decoder_layers, cache["self_attention"], cache["cross_attention"]
        ):
            x, self_cache, _ = layer(
                x,
                encoder_padding_mask=cache["encoder_padding_mask"],
                self_attention_cache=self_cache,
                self_attention_cache_update_index=step,
                cross_attention_cache=cross_cache,
                training=False,
            )
            self_caches.append(self_cache)
        logits = self._logits(x)[:, 0, :]  # (B, V)
        return logits, dict(cache, self_attention=self_caches)

    # Distributed training --------------------------------------------------

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Before the first step, Keras 3 (TensorFlow trainer) learns the batch's
        # structure by *reducing* the first distributed batch across replicas: a
        # collective that fails under MultiWorkerMirroredStrategy for dict inputs
        # ("Attempt to convert a value ({'encoder_inputs': PerReplica...",
        # keras-team/keras#20329). One local replica's batch has the same structure
        # and dtypes, which is all the symbolic build reads.
        strategy = self._distribute_strategy
        if strategy is None or iterator is None:
            return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)
        for _, _, batches in iterator:
            data_batch = tf.nest.map_structure(
                lambda value: strategy.experimental_local_results(value)[0], next(batches)
            )
            break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    def train_step(self, data):
        return self._before_multi_worker_reduction(super().train_step(data))

    def test_step(self, data):
        return self._before_multi_worker_reduction(super().test_step(data))

    def _before_multi_worker_reduction(self, logs):
        # Across workers Keras 3 averages each step's logs with
        # `strategy.reduce("MEAN", value, axis=0)`, which fails on scalars ("Invalid
        # reduction dimension 0 for input with 0 dimensions", tensorflow#72388).
        # The values are already the same on every replica (synchronized metrics),
        # so a length-1 axis makes that mean a no-op that returns the scalar.
        if not is_multi_worker(self.distribute_strategy):
            return logs
        return tf.nest.map_structure(lambda value: tf.reshape(value, [-1]), logs)

    # Shared pieces ---------------------------------------------------------

    def _embed(self, token_ids, position, dropout, start_index=0, training=None):
        # Sec. 3.4-3.5: scaled embeddings plus positional encodings, then dropout.
        x = self.embedding(token_ids)  # (B, T, d)
        x = ops.add(x, position(x, start_index=start_index))
        return dropout(x, training=training)

    def _encode(self, encoder_inputs, padding_mask, training=None):
        x = self._embed(encoder_inputs, self.encoder_position, self.encoder_dropout,
                        training=training)
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=padding_mask, training=training)
        return x if self.encoder_norm is None else self.encoder_norm(x)

    def _logits(self, x):
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return self.embedding(x, reverse=True)  # (B, T, V) float32

    def get_config(self):
        return {
            "config": self.config.to_dict(),
            "dtype": keras.dtype_policies.serialize(self._policy),
            "name": self.name,
            "trainable": self.trainable,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)


def is_multi_worker(strategy):
    """Whether `strategy` is a MultiWorkerMirroredStrategy spanning several workers."""
    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and strategy.extended._in_multi_worker_mode())


def build_transformer(config):
    """Builds the functional Transformer for a `TransformerConfig`."""
    return Transformer(config)
