import numpy as np
import pytest

from keras_transformer.layers import TransformerDecoderLayer
from keras_transformer.layers import TransformerEncoderLayer
from tests import reference

B, S, T, D, H, FF = 2, 6, 5, 16, 4, 32
EPSILON = 1e-6


def _randomize(layer):
    """Random weights everywhere, biases and layer-norm parameters included."""
    layer.set_weights([np.random.randn(*w.shape).astype("float32") * 0.5
                       for w in layer.get_weights()])


def _sublayer(x, fn, gamma, beta, norm_first):
    if norm_first:
        return x + fn(reference.layer_norm(x, gamma, beta, EPSILON))
    return reference.layer_norm(x + fn(x), gamma, beta, EPSILON)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_equals_numpy_twin(norm_first):
    layer = TransformerEncoderLayer(H, FF, dropout_rate=0.1, norm_first=norm_first,
                                    layer_norm_epsilon=EPSILON)
    x = np.random.randn(B, S, D).astype("float32")
    padding = np.arange(S)[None] < np.array([[6], [3]])  # (B, S)
    layer(x, padding_mask=padding)
    _randomize(layer)
    w = layer.get_weights()
    attention_w, ffn_w = w[0:8], w[8:12]
    (g1, b1), (g2, b2) = (w[12:14], w[14:16])
    mask = np.broadcast_to(padding[:, None, :], (B, S, S))

    expected = _sublayer(x, lambda y: reference.attention(y, y, attention_w, mask), g1, b1,
                         norm_first)
    expected = _sublayer(expected, lambda y: reference.feed_forward(y, *ffn_w), g2, b2,
                         norm_first)
    # training=False: dropout is off.
    actual = layer(x, padding_mask=padding, training=False)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_equals_numpy_twin(norm_first):
    layer = TransformerDecoderLayer(H, FF, norm_first=norm_first, layer_norm_epsilon=EPSILON)
    x = np.random.randn(B, T, D).astype("float32")
    memory = np.random.randn(B, S, D).astype("float32")
    source_padding = np.arange(S)[None] < np.array([[6], [2]])
    target_padding = np.arange(T)[None] < np.array([[5], [3]])
    layer(x, memory, decoder_padding_mask=target_padding, encoder_padding_mask=source_padding)
    _randomize(layer)
    w = layer.get_weights()
    self_w, cross_w, ffn_w = w[0:8], w[8:16], w[16:20]
    (g1, b1), (g2, b2), (g3, b3) = w[20:22], w[22:24], w[24:26]
    self_mask = reference.causal_mask(T) & target_padding[:, None, :]
    cross_mask = np.broadcast_to(source_padding[:, None, :], (B, T, S))

    expected = _sublayer(x, lambda y: reference.attention(y, y, self_w, self_mask), g1, b1,
                         norm_first)
    expected = _sublayer(expected, lambda y: reference.attention(y, memory, cross_w, cross_mask),
                         g2, b2, norm_first)
    expected = _sublayer(expected, lambda y: reference.feed_forward(y, *ffn_w), g3, b3,
                         norm_first)
    actual = layer(x, memory, decoder_padding_mask=target_padding,
                   encoder_padding_mask=source_padding)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


def test_decoder_layer_cached_steps_equal_full_pass():
    layer = TransformerDecoderLayer(H, FF, dropout_rate=0.0)
    x = np.random.randn(B, T, D).astype("float32")
    memory = np.random.randn(B, S, D).astype("float32")
    source_padding = np.arange(S)[None] < np.array([[6], [4]])
    full = np.asarray(layer(x, memory, encoder_padding_mask=source_padding))
    self_cache = (np.zeros((B, H, T, D // H), "float32"),) * 2
    cross_cache = layer.project_encoder_sequence(memory)
    for t in range(T):
        step, self_cache, cross_cache = layer(
            x[:, t : t + 1], encoder_padding_mask=source_padding,
            self_attention_cache=self_cache, self_attention_cache_update_index=t,
            cross_attention_cache=cross_cache,
        )
        np.testing.assert_allclose(step[:, 0], full[:, t], rtol=1e-5, atol=1e-5)


def test_dropout_is_active_only_in_training():
    layer = TransformerEncoderLayer(H, FF, dropout_rate=0.5)
    x = np.random.randn(B, S, D).astype("float32")
    inference = [np.asarray(layer(x, training=False)) for _ in range(2)]
    np.testing.assert_array_equal(*inference)
    assert not np.allclose(layer(x, training=True), inference[0])


def test_decoder_layer_returns_attention_weights():
    layer = TransformerDecoderLayer(H, FF)
    x, memory = np.random.randn(B, T, D), np.random.randn(B, S, D)
    _, weights = layer(x, memory, return_attention_scores=True)
    assert weights["self_attention"].shape == (B, H, T, T)
    assert weights["cross_attention"].shape == (B, H, T, S)
    # Causal: no weight on later positions.
    assert np.all(np.triu(np.asarray(weights["self_attention"])[0, 0], k=1) == 0)
