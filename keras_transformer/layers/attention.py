import math

import keras
from keras import ops

from keras_transformer.layers import kv_cache
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.dropout import check_rate
from keras_transformer.layers.matmul import transpose
from keras_transformer.layers.projection import Projection
from keras_transformer.layers.search_options import NO_SEARCH

# Sec. 3.2.3: illegal connections are set to -inf before the softmax. The
# softmax runs in float32 (also under mixed precision), so a large finite
# number is safe: it never overflows a float16/bfloat16 tensor.
MASK_VALUE = -1e9


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head scaled dot-product attention (Sec. 3.2), with a KV cache.

    `MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O` where
    `head_i = softmax(Q W_i^Q (K W_i^K)^T / sqrt(d_k)) V W_i^V`.

    The weights have the layout of `keras.layers.MultiHeadAttention` (query,
    key, value and output `EinsumDense` kernels of shapes `(d_model, h, d_k)`,
    `(d_model, h, d_k)`, `(d_model, h, d_v)` and `(h, d_v, d_model)`, each with a
    bias), so weights load one-to-one from and into it. The four projections are
    `Projection` layers.

    For step-by-step decoding the layer takes a cache `(key_cache, value_cache)`,
    heads first, as keras-hub's `CachedMultiHeadAttention` does. With
    `cache_update_index` (self-attention) it is the fixed-size cache of
    `layers/kv_cache.py`, `(B, h, L * G, d)`: the query's `B * G` rows write their
    keys and values at that position of their slots, attend over all `L * G`
    entries of their group, and `attention_mask` `(B, G * T, L * G)` says which
    slot holds which position of each row's prefix (with `G = 1` the causal mask
    suffices). Without it (cross-attention), the precomputed keys `(B, h, S, d_k)`
    and values `(B, h, S, d_v)` of `project_key_value`, which the G query rows of
    source b read once for all of them; `value` and `key` are ignored.

    Args:
        num_heads: h, the number of attention heads.
        key_dim: d_k, the size of each head's queries and keys.
        value_dim: d_v, the size of each head's values; defaults to `key_dim`.
        dropout: dropout rate on the attention weights (not in the paper;
            0 by default).
        use_bias: whether the projections have biases.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases.

    Call arguments:
        query: `(B, T, d_model)` queries.
        value: `(B, S, d)` values; keys too when `key` is None.
        key: optional `(B, S, d)` keys.
        attention_mask: optional boolean mask broadcastable to `(B, T, S)`,
            True where a query may attend to a key (e.g. `(B, 1, S)` for key
            padding); with grouped rows, `(B, G * T, S)` over the group's
            queries.
        use_causal_mask: mask keys after the query's position (decoder
            self-attention).
        cache: optional `(key_cache, value_cache)` tuple, see above.
        cache_update_index: int scalar, the position of `query`'s first
            token in the cache.
        return_attention_scores: also return the attention weights
            `(B, h, T, S)` (float32; `S` is `L * G` with a grouped cache).
        training: whether dropout is active.
        search_options: optional `SearchOptions`, in a search's steps: how the
            projections multiply, how transposes run and whether the cache is
            written in place.

    Returns:
        `(B, T, d_model)` attention output; then the attention weights if
        `return_attention_scores`; then the updated cache if a cache was
        given (a tuple when more than the output is returned).

    Example:
    >>> layer = MultiHeadAttention(num_heads=8, key_dim=64)
    >>> x = keras.random.normal((2, 10, 512))
    >>> layer(x, x, use_causal_mask=True).shape
    (2, 10, 512)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, Sec. 3.2.
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if num_heads < 1:
            raise ValueError(f"num_heads must be >= 1. Received: num_heads={num_heads}")
        if key_dim < 1:
            raise ValueError(f"key_dim must be >= 1. Received: key_dim={key_dim}")
        if value_dim is not None and value_dim < 1:
            raise ValueError(f"value_dim must be >= 1. Received: value_dim={value_dim}")
        check_rate(dropout, "dropout")
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim or key_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = value_shape or query_shape
        key_shape = key_shape or value_shape
        output_dim = query_shape[-1]

        def projection(name, units, input_shape, contracted=1):
            layer = Projection(
                units,
                contracted=contracted,
                use_bias=self.use_bias,
                kernel_initializer=self.kernel_initializer,
                bias_initializer=self.bias_initializer,
                dtype=self.dtype_policy,
                name=name,
            )
            layer.build(input_shape)
            return layer

        # The kernels and biases of keras.layers.MultiHeadAttention's "abc,cde->abde"
        # and "abcd,cde->abe" EinsumDense layers, hence the same weights.
        self._query_dense = projection("query", (self.num_heads, self.key_dim), query_shape)
        self._key_dense = projection("key", (self.num_heads, self.key_dim), key_shape)
        self._value_dense = projection("value", (self.num_heads, self.value_dim), value_shape)
        self._output_dense = projection(
            "attention_output",
            output_dim,
            (None, None, self.num_heads, self.value_dim),
            contracted=2,
        )
        self._dropout_layer = Dropout(self.dropout, dtype=self.dtype_policy)

    def project_key_value(self, value, key=None, search_options=None):
        """Keys `(B, h, S, d_k)` and values `(B, h, S, d_v)` of a sequence,
        heads first.

        Used once per source to fill the cross-attention cache.
        """
        key = value if key is None else key
        options = search_options or NO_SEARCH
        keys = self._key_dense(key, search_options=options)  # (B, S, h, d_k)
        values = self._value_dense(value, search_options=options)  # (B, S, h, d_v)
        return _heads_first(keys, options), _heads_first(values, options)

    def call(
        self,
        query,
        value=None,
        key=None,
        attention_mask=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
        return_attention_scores=False,
        training=None,
        search_options=None,
    ):
        options = search_options or NO_SEARCH
        query_states = self._query_dense(query, search_options=options)  # (N, T, h, d_k), N = B * G
        writes_cache = cache is not None and cache_update_index is not None
        if cache is not None and not writes_cache:  # cross-attention: precomputed keys, values
            key_states, value_states = cache  # (B, h, S, d_k), (B, h, S, d_v)
        else:
            key_states, value_states = self.project_key_value(value, key, options)  # (N, h, T, d)
        if writes_cache:  # self-attention: the new positions join the cache
            cache = key_states, value_states = kv_cache.update(  # (B, h, L * G, d)
                cache, key_states, value_states, cache_update_index,
                options.write_cache_in_place, options.integer_transposes)

        batch = ops.shape(key_states)[0]
        groups = ops.shape(query_states)[0] // batch  # G
        query_length = ops.shape(query_states)[1]
        mask = self._combine_masks(
            attention_mask,
            use_causal_mask,
            query_length=query_length,
            key_length=ops.shape(key_states)[2],
            query_offset=0 if cache_update_index is None else cache_update_index,
            groups=groups,
            slots=groups if writes_cache else None,
        )
        # The G rows of a group become G * T queries over the group's keys.
        grouped_query = _heads_first(
            ops.reshape(query_states, (batch, -1, self.num_heads, self.key_dim)), options)
        outputs, weights = self._attend(grouped_query, key_states, value_states, mask, training)
        outputs = ops.reshape(_heads_first(outputs, options),  # back to (N, T, h, d_v)
                              (-1, query_length, self.num_heads, self.value_dim))
        outputs = self._output_dense(outputs, search_options=options)  # (N, T, d_model)

        results = [outputs]
        if return_attention_scores:
            results.append(_split_groups(weights, query_length))  # (N, h, T, S)
        if cache is not None:
            results.append(cache)
        return results[0] if len(results) == 1 else tuple(results)

    def _attend(self, query, key, value, mask, training):
        """Sec. 3.2.1, scaled dot-product attention, heads first: query
        `(B, h, Q, d_k)`, key `(B, h, S, d_k)`, value `(B, h, S, d_v)`; returns
        `(B, h, Q, d_v)` and the float32 weights `(B, h, Q, S)`."""
        query = ops.multiply(query, ops.cast(1.0 / math.sqrt(self.key_dim), query.dtype))
        scores = ops.einsum("bnqd,bnsd->bnqs", query, key)  # (B, h, Q, S)
        # Softmax in float32, also under mixed precision.
        scores = ops.cast(scores, "float32")
        if mask is not None:
            scores = ops.where(ops.expand_dims(mask, axis=1), scores, MASK_VALUE)
        weights = ops.softmax(scores, axis=-1)  # (B, h, Q, S)
        dropped = self._dropout_layer(ops.cast(weights, self.compute_dtype), training=training)
        return ops.einsum("bnqs,bnsd->bnqd", dropped, value), weights  # (B, h, Q, d_v)

    @staticmethod
    def _combine_masks(attention_mask, use_causal_mask, query_length, key_length, query_offset,
                       groups=1, slots=None):
        """A boolean `(B or 1, G * T, S)` mask, or None when nothing is masked.

        The causal mask compares positions: query `q` of a group is at
        `query_offset + q % T`, key `s` at `s // slots` (at `s` without slots).
        """
        mask = None
        if attention_mask is not None:
            mask = ops.cast(attention_mask, "bool")
            if len(mask.shape) == 2:  # (B, S) key padding
                mask = ops.expand_dims(mask, axis=1)
        if use_causal_mask:
            query_positions = ops.arange(groups * query_length) % query_length + query_offset
            key_positions = ops.arange(key_length)  # (S,)
            if slots is not None:
                key_positions = key_positions // slots
            causal = ops.expand_dims(query_positions, -1) >= ops.expand_dims(key_positions, 0)
            causal = ops.expand_dims(causal, axis=0)  # (1, G * T, S)
            mask = causal if mask is None else ops.logical_and(mask, causal)
        return mask

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config


def _heads_first(states, options):
    """`(B, T, h, d)` -> `(B, h, T, d)` (and back)."""
    return transpose(states, (0, 2, 1, 3), options.integer_transposes)


def _split_groups(weights, query_length):
    """Grouped weights `(B, h, G * T, S)` -> `(N, h, T, S)`, a row per query row."""
    batch, heads, _, keys = ops.shape(weights)
    weights = ops.reshape(weights, (batch, heads, -1, query_length, keys))
    return ops.reshape(ops.transpose(weights, (0, 2, 1, 3, 4)), (-1, heads, query_length, keys))
