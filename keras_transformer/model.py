"""The encoder-decoder Transformer as a functional `keras.Model` (Sec. 3)."""

import keras
from keras import ops

from keras_transformer import decoder_cache
from keras_transformer.config import TransformerConfig
from keras_transformer.distributed import MultiWorkerModel
from keras_transformer.layers import Dropout
from keras_transformer.layers import LearnedPositionalEmbedding
from keras_transformer.layers import Projection
from keras_transformer.layers import SearchOptions
from keras_transformer.layers import SharedEmbedding
from keras_transformer.layers import SinusoidalPositionalEncoding
from keras_transformer.layers import TransformerDecoderLayer
from keras_transformer.layers import TransformerEncoderLayer
from keras_transformer.layers.matmul import dense
from keras_transformer.layers.matmul import transposed_copy
from keras_transformer.token_ids import PAD_ID


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(MultiWorkerModel):
    """The Transformer encoder-decoder, a functional model.

    Inputs are a dict of two int32 tensors, `encoder_inputs` `(B, S)` (source ids)
    and `decoder_inputs` `(B, T)` (target ids shifted right, starting with the
    begin-of-sequence id), padded with id 0; the padding and causal masks are
    derived inside. The output is float32 logits `(B, T, vocab_size)`.

    Beyond `model(inputs)`: `encode` runs the encoder, and `decode` the decoder
    over a whole target prefix (the paper's forward pass, which the functional
    graph and the attention heat maps run). For incremental decoding,
    `initial_cache` runs the encoder once per source and every decoder layer's
    cross-attention projections once, and `decode_step(token_ids, cache, step)`
    decodes one position and returns the cache it wrote (the cache's structure:
    `decoder_cache.py`); `step_function` is what `decoding.beam_search` searches
    over. Both decoder paths run the one decoder pass, `_decoder_pass`.

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
        self._create_layers(config, policy)

        # Sec. 3: the logits of the target shifted right, given the encoded source.
        encoder_inputs = keras.Input(shape=(None,), dtype="int32", name="encoder_inputs")
        decoder_inputs = keras.Input(shape=(None,), dtype="int32", name="decoder_inputs")
        encoder_padding_mask = ops.not_equal(encoder_inputs, PAD_ID)  # (B, S)
        encoder_outputs = self._encode(encoder_inputs, encoder_padding_mask)
        logits = self.decode(decoder_inputs, {"encoder_outputs": encoder_outputs,
                                              "encoder_padding_mask": encoder_padding_mask})
        super().__init__(
            inputs={"encoder_inputs": encoder_inputs, "decoder_inputs": decoder_inputs},
            outputs=logits,
            name=kwargs.pop("name", "transformer"),
            **kwargs,
        )
        self.config = config
        self._policy = policy

    def _create_layers(self, config, policy):
        self.embedding = SharedEmbedding(
            config.vocab_size, config.d_model, dtype=policy, name="shared_embedding"
        )
        self.encoder_position, self.decoder_position = (
            LearnedPositionalEmbedding(config.max_positions, dtype=policy, name=name)
            if config.positional_encoding == "learned"
            else SinusoidalPositionalEncoding(dtype=policy, name=name)
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

    # The paper's forward pass ----------------------------------------------

    def encode(self, encoder_inputs, training=False, return_attention_scores=False):
        """Encoder output `(B, S, d_model)` for source ids `(B, S)`; with
        `return_attention_scores`, `(outputs, weights)`, the weights a list of
        every encoder layer's self-attention `(B, h, S, S)`."""
        encoder_inputs = ops.convert_to_tensor(encoder_inputs, "int32")
        padding_mask = ops.not_equal(encoder_inputs, PAD_ID)
        return self._encode(encoder_inputs, padding_mask, training=training,
                            return_attention_scores=return_attention_scores)

    def decode(self, decoder_inputs, memory, *, return_attention_scores=False, training=None,
               output_kernel=None, output_bias=None, search_options=None):
        """The decoder (Sec. 3.1) over whole target prefixes: embeddings plus
        positions, the decoder stack (causal self-attention, attention over the
        encoder output, feed-forward), then logits over the shared embedding
        (after a final layer norm in a pre-norm model).

        Args:
            decoder_inputs: int32 `(B, T)` target ids, padded with 0.
            memory: the encoder side, a dict: `"encoder_padding_mask"` `(B, S)`
                and either `"encoder_outputs"` `(B, S, d_model)` or
                `"cross_attention"` (each layer's keys and values, as in
                `initial_cache(encoder_inputs)`, whose cache serves as memory).
            return_attention_scores: also return every decoder layer's weights.
            training: whether dropout is active.
            output_kernel: optional `(d_model, vocab_size)`: the shared
                embedding transposed, for the logits. A matmul reads that
                layout faster than the `(vocab_size, d_model)` table (see
                benchmarks/decode_throughput.py), so a search reuses one copy
                every step (`Translator` keeps one).
            output_bias: optional `(vocab_size,)` zeros added to that product,
                with `output_kernel`: oneDNN then runs the product as its fused
                kernel, which keeps a 16-bit kernel packed for its instructions
                from one step to the next, where a plain product packs all of
                it again every step (`Translator` keeps one for a bfloat16 or
                float16 model). The logits are the same.
            search_options: optional `SearchOptions`, for a search's steps
                (`step_function(use_cache=False)`).

        Returns:
            float32 logits `(B, T, vocab_size)`; with `return_attention_scores`,
            `(logits, weights)`, the weights a list (a dict per layer) of
            `"self_attention"` `(B, h, T, T)` and `"cross_attention"`
            `(B, h, T, S)` weights.
        """
        arguments = dict(decoder_padding_mask=ops.not_equal(decoder_inputs, PAD_ID),  # (B, T)
                         encoder_padding_mask=memory["encoder_padding_mask"],  # (B, S)
                         return_attention_scores=return_attention_scores,
                         search_options=search_options)
        cross_attention = memory.get("cross_attention", [None] * len(self.decoder_layers))
        layer_arguments = [dict(arguments, cross_attention_cache=layer_cross_attention)
                           for layer_cross_attention in cross_attention]
        logits, outputs = self._decoder_pass(
            decoder_inputs, 0, memory.get("encoder_outputs"), layer_arguments, training,
            output_kernel, output_bias)
        if return_attention_scores:
            return logits, [weights for weights, in outputs]
        return logits

    # Incremental decoding --------------------------------------------------

    def initial_cache(self, encoder_inputs, max_output_length=None, beam_size=1):
        """The decoding state for source ids `(B, S)`, before the first step (its
        structure: `decoder_cache.py`).

        Runs the encoder once and every decoder layer's cross-attention key and
        value projections once; their entries stay one per source, which the
        decoder's `B * K` rows (K hypotheses of each source) read in place.

        With `beam_size=1` a search may tile and reorder the whole cache with
        `tf.gather` (greedy search, and `decoding.beam_search`'s default); with
        `beam_size=K`, the state of a beam search whose `reorder_cache` is
        `self.reorder_cache`: the K hypotheses of a source share its
        self-attention cache, which is never gathered.

        Args:
            encoder_inputs: int32 `(B, S)` source ids, padded with 0.
            max_output_length: the number of decoder positions the
                self-attention cache holds (the begin-of-sequence token
                included); None for no self-attention cache (decoding that
                re-runs the whole prefix every step, `decode`).
            beam_size: K, the hypotheses per source that share the cache.

        Returns:
            The cache: `"cross_attention"`, `"encoder_padding_mask"`, and unless
            `max_output_length` is None, `"self_attention"` (zeros) and with
            K > 1 `"self_attention_slots"`. It holds `max_output_length`
            positions eagerly and under XLA; in a TensorFlow graph outside XLA,
            at most 16 at first, and `decode_step` grows it as needed.
        """
        encoder_inputs = ops.convert_to_tensor(encoder_inputs, "int32")
        padding_mask = ops.not_equal(encoder_inputs, PAD_ID)  # (B, S)
        encoder_outputs = self._encode(encoder_inputs, padding_mask, training=False)
        cache = {
            "cross_attention": [
                layer.project_encoder_sequence(encoder_outputs) for layer in self.decoder_layers
            ],
            "encoder_padding_mask": padding_mask,
        }
        if max_output_length is not None:
            cache.update(decoder_cache.self_attention(
                self.config, ops.shape(encoder_inputs)[0], max_output_length, beam_size,
                self._policy.compute_dtype))
        return cache

    @staticmethod
    def reorder_cache(cache, parents):
        """`decoding.beam_search`'s `reorder_cache` for a cache of
        `initial_cache(..., beam_size=K)`: the surviving hypotheses, which extend
        `parents` `(B, K)`, take their parents' rows of the slot table; the keys
        and values stay where they were written."""
        return decoder_cache.reorder(cache, parents)

    @staticmethod
    def select_examples(cache, examples):
        """`decoding.beam_search`'s `select_examples` for a cache of
        `initial_cache(..., beam_size=K)`: the entries of the sources `examples`
        `(B',)`, in that order (the K hypotheses of a source go with it)."""
        return decoder_cache.select_examples(cache, examples)

    def decode_step(self, token_ids, cache, step, output_kernel=None, output_bias=None,
                    search_options=None):
        """Logits for the position after `step`, and the updated cache.

        Args:
            token_ids: int32 `(N,)`, the tokens at position `step` (position 0
                holds the begin-of-sequence id); N is the cache's batch, or K
                times it for a beam search over the sources' shared cache.
            cache: the dict from `initial_cache` or from the previous step.
            step: int scalar, the position of `token_ids`.
            output_kernel, output_bias: see `decode`.
            search_options: optional `SearchOptions` (`step_function` passes
                the search's).

        Returns:
            `(logits, cache)`: float32 `(N, vocab_size)` logits of the next
            token, and the cache with position `step` written (grown if it must,
            see `initial_cache`).
        """
        token_ids = ops.expand_dims(ops.convert_to_tensor(token_ids, "int32"), 1)  # (N, 1)
        cache = decoder_cache.reserve(cache, step + 1)
        cache, self_attention_mask = decoder_cache.write_slots(cache, step, 1)
        layer_arguments = [
            dict(encoder_padding_mask=cache["encoder_padding_mask"],  # (B, S)
                 self_attention_cache=self_attention,
                 self_attention_cache_update_index=step,
                 self_attention_mask=self_attention_mask,  # (B, K, L * K) or None
                 cross_attention_cache=cross_attention,
                 search_options=search_options)
            for self_attention, cross_attention in zip(cache["self_attention"],
                                                       cache["cross_attention"])
        ]
        logits, outputs = self._decoder_pass(token_ids, step, None, layer_arguments,
                                             training=False, output_kernel=output_kernel,
                                             output_bias=output_bias)
        cache = dict(cache, self_attention=[self_attention for self_attention, _ in outputs])
        return logits[:, 0, :], cache  # (N, V)

    def step_function(self, use_cache=True, output_kernel=None, write_cache_in_place=False,
                      transposed_kernels=False, output_bias=None):
        """The step function that `decoding.beam_search` and `greedy_search`
        search over: `step_fn(ids (N, T), step, cache) -> (logits (N, V), cache)`.

        With `use_cache`, each step decodes one position with the cache of
        `initial_cache(source, max_output_length, beam_size)` (`decode_step`);
        without it (the slow twin that tests and benchmarks compare with), each
        step re-runs the decoder on the whole prefix `ids[:, :step + 1]` over the
        cross-attention cache of `initial_cache(source)` (`decode`).
        `output_kernel`, `output_bias`: see `decode`.

        The steps run with `SearchOptions` made here, once per search: integer
        transposes (no gradients flow through the steps); with
        `write_cache_in_place`, cache writes in place, only for a search that
        never reads a cache twice, as `decoding.beam_search` and `greedy_search`
        (it saves copying the whole cache every layer and step); with
        `transposed_kernels`, copies of the decoder's kernels transposed now,
        only for weights fixed during the search and on CPUs where it pays
        (`hardware.decoding_transposed_kernels`).

        A beam search over a cache with one entry per source passes
        `reorder_cache=model.reorder_cache`:

        >>> cache = model.initial_cache(source_ids, max_length, beam_size=4)
        >>> ids, scores = decoding.beam_search(
        ...     model.step_function(), start_ids, cache, beam_size=4,
        ...     reorder_cache=model.reorder_cache, ...)
        """
        options = SearchOptions(write_cache_in_place=write_cache_in_place,
                                transposed_kernels=self._transposed_kernels(transposed_kernels))
        if use_cache:
            def step_fn(ids, step, cache):
                return self.decode_step(ids[:, step], cache, step, output_kernel, output_bias,
                                        options)
        else:
            def step_fn(ids, step, cache):
                logits = self.decode(ids[:, : step + 1], cache, training=False,
                                     output_kernel=output_kernel, output_bias=output_bias,
                                     search_options=options)
                return logits[:, -1], cache  # (N, V)
        return step_fn

    def _transposed_kernels(self, transposed_kernels):
        """`SearchOptions.transposed_kernels`: with `transposed_kernels`, a copy of
        every decoder projection's kernel, transposed (the cross-attention's key and
        value copies go unused: graphs prune them); else none."""
        if not transposed_kernels:
            return {}
        return {
            layer.kernel.path: transposed_copy(layer.kernel, layer.contracted)
            for decoder_layer in self.decoder_layers
            for layer in decoder_layer._flatten_layers()
            if isinstance(layer, Projection)
        }

    # Shared pieces ---------------------------------------------------------

    def _embed(self, token_ids, position, dropout, start_index=0, training=None):
        # Sec. 3.4-3.5: scaled embeddings plus positional encodings, then dropout.
        x = self.embedding(token_ids)  # (B, T, d)
        x = ops.add(x, position(x, start_index=start_index))
        return dropout(x, training=training)

    def _decoder_pass(self, token_ids, start, encoder_outputs, layer_arguments, training=None,
                      output_kernel=None, output_bias=None):
        """The one decoder pass, of `decode` and `decode_step` (Sec. 3.1): the
        target ids `(B, T)` at positions `start ..`, embedded, through every
        decoder layer, then the logits. `layer_arguments`: each decoder layer's
        keyword arguments (masks, caches). Returns the logits `(B, T, V)` and,
        for each layer, a list of what it returned after its output."""
        x = self._embed(token_ids, self.decoder_position, self.decoder_dropout, start, training)
        outputs = []
        for layer, arguments in zip(self.decoder_layers, layer_arguments):
            x = layer(x, encoder_outputs, training=training, **arguments)
            x, *layer_outputs = x if isinstance(x, tuple) else (x,)
            outputs.append(layer_outputs)
        return self._logits(x, output_kernel, output_bias), outputs  # (B, T, V)

    def _encode(self, encoder_inputs, padding_mask, training=None, return_attention_scores=False):
        x = self._embed(encoder_inputs, self.encoder_position, self.encoder_dropout,
                        training=training)
        weights = []
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=padding_mask, training=training,
                      return_attention_scores=return_attention_scores)
            if return_attention_scores:
                x, layer_weights = x
                weights.append(layer_weights)
        x = x if self.encoder_norm is None else self.encoder_norm(x)
        return (x, weights) if return_attention_scores else x

    def _logits(self, x, output_kernel=None, output_bias=None):
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        if output_kernel is not None:  # a 2-D product, so that a bias fuses with it
            return ops.cast(dense(x, output_kernel, output_bias), "float32")
        return self.embedding(x, reverse=True)  # (B, T, V) float32

    @property
    def precision(self):
        """The name of the dtype policy its layers run under, e.g. "float32",
        "mixed_bfloat16" or "bfloat16"."""
        return self._policy.name

    def with_dtype(self, dtype):
        """This model's weights in a copy built under the dtype policy `dtype`, for
        inference: "bfloat16" or "float16" hold the weights and run the matrix
        multiplies in that type, while softmax, layer normalization and the
        logits stay float32 (so do the beam's scores); "float32" gives a float32
        copy of a mixed-precision model."""
        copy = Transformer(self.config, dtype=dtype, name=self.name)
        copy.set_weights(self.get_weights())
        return copy

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


def build_transformer(config):
    """Builds the functional Transformer for a `TransformerConfig`."""
    return Transformer(config)
