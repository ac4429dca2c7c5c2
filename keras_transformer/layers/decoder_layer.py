import keras

from keras_transformer.layers._sublayers import TransformerBlock
from keras_transformer.layers._sublayers import head_dims
from keras_transformer.layers._sublayers import norm_and_dropout
from keras_transformer.layers._sublayers import residual
from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.feed_forward import PositionwiseFeedForward


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerDecoderLayer(TransformerBlock):
    """One decoder layer (Sec. 3.1): masked self-attention, attention over the
    encoder output, then the feed-forward network.

    Each sub-layer is wrapped as `LayerNorm(x + Dropout(Sublayer(x)))` (post-norm,
    the paper's), or as `x + Dropout(Sublayer(LayerNorm(x)))` with
    `norm_first=True`.

    One `call` serves training and step-by-step decoding: given
    `self_attention_cache` and `self_attention_cache_update_index`, the new
    positions' keys and values are written into the fixed-size cache; given
    `cross_attention_cache` (see `MultiHeadAttention.project_key_value`), the
    encoder's keys and values are not recomputed.

    Args:
        num_heads: h.
        d_ff: inner size of the feed-forward network.
        key_dim: d_k; defaults to d_model / h.
        value_dim: d_v; defaults to d_model / h.
        dropout_rate: P_drop, on each sub-layer's output before the residual add.
        norm_first: pre-norm instead of the paper's post-norm.
        layer_norm_epsilon: epsilon of the layer normalizations.

    Call arguments:
        decoder_sequence: `(B, T, d_model)`.
        encoder_sequence: `(B, S, d_model)` encoder output; may be None when
            `cross_attention_cache` is given.
        decoder_padding_mask: optional boolean `(B, T)`, True for real tokens.
        encoder_padding_mask: optional boolean `(B, S)`, True for real tokens.
        self_attention_cache: optional `(keys (B, h, T_max * G, d_k),
            values (B, h, T_max * G, d_v))`, G slots per group of G rows
            (`decoder_sequence` has `B * G` rows; see `layers/kv_cache.py`).
        self_attention_mask: with a cache of G > 1 slots, boolean
            `(B, G * T, T_max * G)`: the slot that holds each position of each
            row's prefix (`decoder_cache.write_slots` builds it).
        self_attention_cache_update_index: int scalar, position of
            `decoder_sequence`'s first token.
        cross_attention_cache: optional `(keys (B, h, S, d_k),
            values (B, h, S, d_v))` of the encoder output; `decoder_sequence`
            may have `B * G` rows, G per source.
        return_attention_scores: also return a dict with the
            `"self_attention"` `(B, h, T, T)` and `"cross_attention"`
            `(B, h, T, S)` weights.
        training: whether dropout is active.
        search_options: optional `SearchOptions` of a search's steps, passed
            to the attention layers and the feed-forward network.

    Returns:
        `(B, T, d_model)`; with caches, a tuple `(outputs, self_attention_cache,
        cross_attention_cache)`; the attention-weights dict comes last if asked for.

    References:
        Vaswani et al., 2017, Sec. 3.1 and Figure 1.
    """

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None):
        encoder_sequence_shape = encoder_sequence_shape or decoder_sequence_shape
        d_model = decoder_sequence_shape[-1]
        key_dim, value_dim = head_dims(d_model, self.num_heads, self.key_dim, self.value_dim)

        def attention(name, value_shape):
            layer = MultiHeadAttention(
                self.num_heads, key_dim, value_dim, dtype=self.dtype_policy, name=name
            )
            layer.build(decoder_sequence_shape, value_shape)
            return layer

        self._self_attention = attention("self_attention", decoder_sequence_shape)
        self._cross_attention = attention("cross_attention", encoder_sequence_shape)
        self._feed_forward = PositionwiseFeedForward(
            self.d_ff, dtype=self.dtype_policy, name="feed_forward"
        )
        self._feed_forward.build(decoder_sequence_shape)
        self._self_attention_norm, self._self_attention_dropout = norm_and_dropout(
            self, "self_attention", decoder_sequence_shape
        )
        self._cross_attention_norm, self._cross_attention_dropout = norm_and_dropout(
            self, "cross_attention", decoder_sequence_shape
        )
        self._feed_forward_norm, self._feed_forward_dropout = norm_and_dropout(
            self, "feed_forward", decoder_sequence_shape
        )

    def project_encoder_sequence(self, encoder_sequence):
        """The cross-attention cache for an encoder output, computed once per source."""
        return self._cross_attention.project_key_value(encoder_sequence)

    def call(
        self,
        decoder_sequence,
        encoder_sequence=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        self_attention_mask=None,
        cross_attention_cache=None,
        return_attention_scores=False,
        training=None,
        search_options=None,
    ):
        use_cache = self_attention_cache is not None
        if use_cache and self_attention_cache_update_index is None:
            raise ValueError(
                "self_attention_cache_update_index is required with self_attention_cache"
            )
        if encoder_sequence is None and cross_attention_cache is None:
            raise ValueError("Pass encoder_sequence or cross_attention_cache.")

        def attend(attention, x, value, **arguments):
            outputs = attention(x, value, return_attention_scores=True, training=training,
                                search_options=search_options, **arguments)
            return outputs[0], outputs[1:]  # the output; the weights (and the cache)

        x, (self_weights, *new_self_cache) = residual(
            self, decoder_sequence,
            lambda y: attend(
                self._self_attention, y, y, use_causal_mask=True,
                # (B, T) padding keys, or (B, G * T, T_max * G) cache slots
                attention_mask=(
                    decoder_padding_mask if self_attention_mask is None else self_attention_mask
                ),
                cache=self_attention_cache, cache_update_index=self_attention_cache_update_index),
            self._self_attention_norm, self._self_attention_dropout, training,
        )
        x, (cross_weights, *_) = residual(
            self, x,
            lambda y: attend(self._cross_attention, y, encoder_sequence,
                             attention_mask=encoder_padding_mask,  # (B, S)
                             cache=cross_attention_cache),
            self._cross_attention_norm, self._cross_attention_dropout, training,
        )
        x, _ = residual(
            self, x, lambda y: (self._feed_forward(y, search_options=search_options), None),
            self._feed_forward_norm, self._feed_forward_dropout, training,
        )

        results = [x]
        if use_cache:
            if cross_attention_cache is None:
                cross_attention_cache = self.project_encoder_sequence(encoder_sequence)
            results += [new_self_cache[0], cross_attention_cache]
        if return_attention_scores:
            results.append({"self_attention": self_weights, "cross_attention": cross_weights})
        return results[0] if len(results) == 1 else tuple(results)

