"""The encoder-decoder Transformer as a functional `keras.Model` (Sec. 3)."""

import contextlib

import keras
from keras import ops

from keras_transformer.config import TransformerConfig
from keras_transformer.distributed import MultiWorkerModel
from keras_transformer.layers import _cache
from keras_transformer.layers import _matmul
from keras_transformer.layers import Dropout
from keras_transformer.layers import LearnedPositionalEmbedding
from keras_transformer.layers import Projection
from keras_transformer.layers import SharedEmbedding
from keras_transformer.layers import SinusoidalPositionalEncoding
from keras_transformer.layers import TransformerDecoderLayer
from keras_transformer.layers import TransformerEncoderLayer
from keras_transformer.token_ids import PAD_ID


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(MultiWorkerModel):
    """The Transformer encoder-decoder, a functional model.

    Inputs are a dict of two int32 tensors, `encoder_inputs` `(B, S)` (source ids)
    and `decoder_inputs` `(B, T)` (target ids shifted right, starting with the
    begin-of-sequence id), padded with id 0; the padding and causal masks are
    derived inside. The output is float32 logits `(B, T, vocab_size)`.

    Beyond `model(inputs)`: `encode` runs the encoder; `decode` is the one
    decoder pass, which the functional graph, step-by-step decoding and the
    attention heat maps all run; `initial_cache` runs the encoder once per source
    and every decoder layer's cross-attention projections once; `decode_step`
    decodes one position with the self-attention cache; and
    `step_function` is what `decoding.beam_search` searches over.

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
                LearnedPositionalEmbedding(config.max_positions, dtype=policy, name=name)
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

        # === Config ===
        self.config = config
        self._policy = policy

    # Encoder and decoder passes ---------------------------------------------

    def encode(self, encoder_inputs, training=False, return_attention_scores=False):
        """Encoder output `(B, S, d_model)` for source ids `(B, S)`; with
        `return_attention_scores`, `(outputs, weights)`, the weights a list of
        every encoder layer's self-attention `(B, h, S, S)`."""
        encoder_inputs = ops.convert_to_tensor(encoder_inputs, "int32")
        padding_mask = ops.not_equal(encoder_inputs, PAD_ID)
        return self._encode(encoder_inputs, padding_mask, training=training,
                            return_attention_scores=return_attention_scores)

    def decode(self, decoder_inputs, memory, *, step=None, return_attention_scores=False,
               training=None, output_kernel=None):
        """The decoder pass (Sec. 3.1): embeddings plus positions, the decoder
        stack, then logits over the shared embedding (after a final layer norm
        in a pre-norm model).

        Args:
            decoder_inputs: int32 `(B, T)` target ids, padded with 0; with
                `step`, the ids of positions `step .. step + T - 1`.
            memory: the encoder side, a dict: `"encoder_padding_mask"` `(B, S)`
                and either `"encoder_outputs"` `(B, S, d_model)` or
                `"cross_attention"` (each layer's keys and values, from
                `initial_cache`); with `step`, also `"self_attention"` (and
                `"self_attention_slots"`), the self-attention cache of
                `initial_cache`. `decoder_inputs` may have K rows per source.
            step: None to decode a whole prefix (causal mask, padded positions
                masked); an int scalar to write the positions into the
                self-attention cache at `step` and attend over the cache.
            return_attention_scores: also return every decoder layer's weights.
            training: whether dropout is active.
            output_kernel: optional `(d_model, vocab_size)`: the shared
                embedding transposed, for the logits. A matmul reads that
                layout about 1.7x faster than the `(vocab_size, d_model)`
                table (37000 x 512 on a CPU: 14 ms against 24 ms for 128
                rows), so a search reuses one copy every step (`Translator`
                keeps one).

        Returns:
            float32 logits `(B, T, vocab_size)`; with `step`, `(logits, memory)`
            with the cache written; with `return_attention_scores`, then a list
            (a dict per layer) of `"self_attention"` `(B, h, T, T')` and
            `"cross_attention"` `(B, h, T, S)` weights.
        """
        x = self._embed(decoder_inputs, self.decoder_position, self.decoder_dropout,
                        0 if step is None else step, training)
        options = dict(encoder_padding_mask=memory["encoder_padding_mask"],
                       return_attention_scores=return_attention_scores, training=training)
        if step is None:
            options["decoder_padding_mask"] = ops.not_equal(decoder_inputs, PAD_ID)  # (B, T)
        else:
            options["self_attention_cache_update_index"] = step
            memory = _reserve_positions(memory, step + ops.shape(decoder_inputs)[1])
            slots = memory.get("self_attention_slots")
            if slots is not None:
                slots, options["self_attention_mask"] = _write_slots(
                    slots, step, ops.shape(decoder_inputs)[1])
        self_caches, weights = [], []
        for index, layer in enumerate(self.decoder_layers):
            if "cross_attention" in memory:
                options["cross_attention_cache"] = memory["cross_attention"][index]
            if step is not None:
                options["self_attention_cache"] = memory["self_attention"][index]
            outputs = layer(x, memory.get("encoder_outputs"), **options)
            if not isinstance(outputs, tuple):
                outputs = (outputs,)
            x = outputs[0]
            if step is not None:
                self_caches.append(outputs[1])
            if return_attention_scores:
                weights.append(outputs[-1])
        results = [self._logits(x, output_kernel)]  # (B, T, V)
        if step is not None:
            memory = dict(memory, self_attention=self_caches)
            if slots is not None:
                memory["self_attention_slots"] = slots
            results.append(memory)
        if return_attention_scores:
            results.append(weights)
        return results[0] if len(results) == 1 else tuple(results)

    # Incremental decoding --------------------------------------------------

    def initial_cache(self, encoder_inputs, max_output_length=None, beam_size=1):
        """The decoding state for source ids `(B, S)`, before the first step.

        Runs the encoder once and every decoder layer's cross-attention key and
        value projections once. The cross-attention entries stay one per
        source: the decoder's `B * K` rows (K hypotheses of each source,
        batch-major) read them in place.

        With `beam_size=1` every entry has the batch as its first axis, so a
        search may tile and reorder the whole cache with `tf.gather` (greedy
        search, and `decoding.beam_search`'s default). With `beam_size=K`, the
        state of a beam search whose `reorder_cache` is `self.reorder_cache`:
        the self-attention cache keeps K slots per source that are written in
        place and never gathered, and `"self_attention_slots"` records which
        slot holds each position of each hypothesis; reordering the beams
        gathers only that table.

        Args:
            encoder_inputs: int32 `(B, S)` source ids, padded with 0.
            max_output_length: the number of decoder positions the
                self-attention cache holds (the begin-of-sequence token
                included); None for no self-attention cache (decoding that
                re-runs the whole prefix every step).
            beam_size: K, the hypotheses per source that share the cache.

        Returns:
            A dict: `"cross_attention"`, a list (one entry per decoder layer) of
            `(keys (B, h, S, d_k), values (B, h, S, d_v))`;
            `"encoder_padding_mask"`, boolean `(B, S)`; and unless
            `max_output_length` is None, `"self_attention"`, a list of zero
            `(keys (B, h, L * K, d_k), values (B, h, L * K, d_v))` (entry
            `t * K + k` holds position t of slot k), and with K > 1,
            `"self_attention_slots"`, int32 `(B, K, L)`. Eagerly and
            under XLA, `L = max_output_length`. In a TensorFlow graph outside
            XLA, L is at most 16 at first, with an unknown static size, and
            `decode_step` grows the cache by 16 positions when a step writes
            past its end: a step reads every position the cache holds, and a
            translation stops long before its limit (see `layers/_cache.py`).
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
        if max_output_length is None:
            return cache
        batch_size = ops.shape(encoder_inputs)[0]
        config = self.config
        dtype = self._policy.compute_dtype

        length = _cache.initial_length(max_output_length)

        def zeros(head_dim):  # each cache in a buffer of its own, which a search may overwrite
            return _cache.zeros(
                (batch_size, config.num_heads, length * beam_size, head_dim), dtype)

        cache["self_attention"] = [
            (zeros(config.d_k), zeros(config.d_v)) for _ in self.decoder_layers
        ]
        if beam_size > 1:
            cache["self_attention_slots"] = ops.zeros((batch_size, beam_size, length), "int32")
        return cache

    @staticmethod
    def reorder_cache(cache, parents):
        """`decoding.beam_search`'s `reorder_cache` for a cache of
        `initial_cache(..., beam_size=K)`: the surviving hypotheses take their
        parents' rows of the slot table; the keys and values stay where they
        were written.

        Args:
            cache: the dict the step function returned.
            parents: int32 `(B, K)`, the beam each surviving hypothesis extends.
        """
        if "self_attention_slots" not in cache:
            return cache
        slots = cache["self_attention_slots"]  # (B, K, L)
        reordered = ops.take_along_axis(slots, ops.expand_dims(parents, -1), axis=1)
        return dict(cache, self_attention_slots=reordered)

    @staticmethod
    def select_examples(cache, examples):
        """`decoding.beam_search`'s `select_examples` for a cache of
        `initial_cache(..., beam_size=K)`: the entries of the sources
        `examples`, int32 `(B',)`, in that order (the K hypotheses of a source
        go with it)."""
        def take(tensor):
            return ops.take(tensor, examples, axis=0)

        return {name: keras.tree.map_structure(take, value) for name, value in cache.items()}

    def decode_step(self, token_ids, cache, step, output_kernel=None):
        """Logits for the position after `step`, and the updated cache.

        Args:
            token_ids: int32 `(N,)`, the tokens at position `step` (position 0
                holds the begin-of-sequence id); N is the cache's batch, or K
                times it for a beam search over the sources' shared cache.
            cache: the dict from `initial_cache` or from the previous step.
            step: int scalar, the position of `token_ids`.
            output_kernel: see `decode`.

        Returns:
            `(logits, cache)`: float32 `(N, vocab_size)` logits of the next
            token, and the cache with position `step` written (grown first if
            it has no room for it and its length's static size is unknown, see
            `initial_cache`).
        """
        token_ids = ops.expand_dims(ops.convert_to_tensor(token_ids, "int32"), 1)  # (B, 1)
        logits, cache = self.decode(token_ids, cache, step=step, training=False,
                                    output_kernel=output_kernel)
        return logits[:, 0, :], cache  # (N, V)

    def step_function(self, use_cache=True, output_kernel=None, write_cache_in_place=False,
                      transposed_kernels=False):
        """The step function that `decoding.beam_search` and `greedy_search`
        search over: `step_fn(ids (N, T), step, cache) -> (logits (N, V), cache)`.

        With `use_cache`, each step decodes one position with the cache of
        `initial_cache(source, max_output_length, beam_size)`; without it (the
        slow twin that tests and benchmarks compare with), each step re-runs
        the decoder on the whole prefix `ids[:, :step + 1]` over the
        cross-attention cache of `initial_cache(source)`. `output_kernel`: see
        `decode`.

        With `write_cache_in_place`, each step writes its positions into the
        self-attention cache it is given instead of a copy (in a TensorFlow
        graph outside XLA; elsewhere the flag changes nothing). Only for a
        search that hands each cache to one step and never reads it again, over
        a cache of `initial_cache`, as `decoding.beam_search` and
        `greedy_search` do: it saves copying the whole cache every layer and
        every step (base model, 32 sources, beam 4: 15 to 20 ms of a 140 ms step
        on a 2-core CPU).

        The step is for searches only: no gradients flow through it, and the
        attention's transposes run on TensorFlow's integer kernel in a graph
        outside XLA (see `layers/_matmul.py`). With `transposed_kernels`, the
        decoder's projections multiply by copies of their kernels transposed
        when `step_function` is called, once per search (outside XLA). Only for
        weights that do not change during the search, and only on CPUs where
        it pays (`hardware.decoding_transposed_kernels`): a base-model search
        with 32 sources, beam 4, then takes 0.88x the time on a 2-core AVX2 CPU,
        but 1.2x in float32 on a 2-core AVX-512 one.

        A beam search over a cache with one entry per source passes
        `reorder_cache=model.reorder_cache`:

        >>> cache = model.initial_cache(source_ids, max_length, beam_size=4)
        >>> ids, scores = decoding.beam_search(
        ...     model.step_function(), start_ids, cache, beam_size=4,
        ...     reorder_cache=model.reorder_cache, ...)
        """
        copies = {}
        if transposed_kernels:
            copies = {
                id(layer.kernel): _matmul.transposed_copy(layer.kernel, layer.contracted)
                for decoder_layer in self.decoder_layers
                for layer in decoder_layer._flatten_layers()
                if isinstance(layer, Projection)
            }  # the cross-attention's key and value copies go unused: graphs prune them
        if use_cache:
            writes = _cache.writes_in_place if write_cache_in_place else contextlib.nullcontext

            def step_fn(ids, step, cache):
                with writes(), _matmul.searching(copies):
                    return self.decode_step(ids[:, step], cache, step, output_kernel)
        else:
            def step_fn(ids, step, cache):
                with _matmul.searching(copies):
                    logits = self.decode(ids[:, : step + 1], cache, training=False,
                                         output_kernel=output_kernel)
                return logits[:, -1], cache  # (N, V)
        return step_fn

    # Shared pieces ---------------------------------------------------------

    def _embed(self, token_ids, position, dropout, start_index=0, training=None):
        # Sec. 3.4-3.5: scaled embeddings plus positional encodings, then dropout.
        x = self.embedding(token_ids)  # (B, T, d)
        x = ops.add(x, position(x, start_index=start_index))
        return dropout(x, training=training)

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

    def _logits(self, x, output_kernel=None):
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        if output_kernel is not None:
            return ops.cast(ops.matmul(x, ops.cast(output_kernel, x.dtype)), "float32")
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


def _reserve_positions(memory, end):
    """`memory` with self-attention caches (and slot table) that hold positions
    `0 .. end - 1`: grown if their length is not fixed (see `initial_cache`)."""
    caches = [tensor for pair in memory["self_attention"] for tensor in pair]
    slots = memory.get("self_attention_slots")  # (B, G, L)
    axes, widths = [2] * len(caches), [1 if slots is None else slots.shape[1]] * len(caches)
    if slots is not None:  # (B, h, L * G, d)
        caches.append(slots)
        axes.append(2)
        widths.append(1)
    caches = _cache.reserve(caches, axes, widths, end)
    layers = len(memory["self_attention"])
    grown = dict(memory, self_attention=[
        (caches[2 * index], caches[2 * index + 1]) for index in range(layers)])
    if "self_attention_slots" in memory:
        grown["self_attention_slots"] = caches[-1]
    return grown


def _write_slots(slots, step, length):
    """Records that each row's positions `step .. step + length - 1` are in its
    own slot, and returns the slot table `(B, G, L)` with the self-attention
    mask `(B, G * length, L * G)`: row g of a group may read entry `t * G + g'`
    of its group's cache when its prefix's position t is in slot g'."""
    sources, num_slots, max_length = ops.shape(slots)
    own = ops.arange(num_slots, dtype="int32")  # row b * G + g owns slot g
    # A select, not ops.slice_update: outside XLA, TensorFlow runs that through an XLA
    # kernel compiled on demand for each new shape (0.16 ms a step at one sentence).
    columns = ops.arange(max_length, dtype="int32")
    written = ops.logical_and(columns >= step, columns < step + length)  # (L,)
    slots = ops.where(written[None, None, :], own[None, :, None], slots)
    holds = ops.equal(ops.expand_dims(slots, 3), own)  # (B, G, L, G)
    # B static where the slot table's is: a while loop's state keeps its shapes.
    holds = ops.reshape(holds, (sources, num_slots, max_length * num_slots))  # (B, G, L * G)
    return slots, ops.repeat(holds, length, axis=1)  # (B, G * length, L * G)
