"""Tests for keras_transformer.visualize: attention weights and heatmaps."""

import os

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import serving
from keras_transformer import visualize
from keras_transformer.data import BOS_ID
from tests.translation_fixtures import SENTENCES
from tests.translation_fixtures import make_model


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_pass_reproduces_the_models_logits(tokenizer, norm_first):
    """The layer-by-layer pass that collects the weights is the model's own."""
    model = make_model(tokenizer.vocab_size, norm_first=norm_first)
    source = tokenizer.tokenize(tf.constant(SENTENCES[:2])).to_tensor()
    target = tf.concat([tf.fill([2, 1], BOS_ID), source[:, :5]], axis=1)
    logits, layers = visualize.decoder_attention(model, source, target)
    expected = model({"encoder_inputs": source, "decoder_inputs": target})
    np.testing.assert_allclose(logits, expected, atol=1e-5)
    assert len(layers) == model.config.num_layers
    cross = layers[0]["cross_attention"].numpy()
    assert cross.shape == (2, model.config.num_heads, 6, source.shape[1])
    np.testing.assert_allclose(cross.sum(-1), 1.0, atol=1e-5)
    # Padded source positions get no attention.
    padding = source.numpy() == 0
    assert np.all(cross.transpose(0, 2, 1, 3)[padding[:, None, None, :].repeat(6, 1)
                                              .repeat(model.config.num_heads, 2)] < 1e-6)


def test_cross_attention_equals_numpy_from_the_layers_kernels(tokenizer):
    """The last decoder layer's cross-attention weights are
    softmax((x W_q + b_q)(e W_k + b_k)^T / sqrt(d_k)) over the source's tokens,
    computed in NumPy from the layer's kernels, the encoder output e and the
    input x that reached the layer (recorded), not by the decoder pass itself."""
    model = make_model(tokenizer.vocab_size, key_dim=6, value_dim=10)
    source = tokenizer.tokenize(tf.constant(SENTENCES[:2])).to_tensor()
    target = tf.concat([tf.fill([2, 1], BOS_ID), source[:, :5]], axis=1)
    attention = model.decoder_layers[-1]._cross_attention
    inputs, call = [], attention.call

    def recording(query, *args, **kwargs):
        inputs.append(np.asarray(query))
        return call(query, *args, **kwargs)

    attention.call = recording
    try:
        _, layers = visualize.decoder_attention(model, source, target)
    finally:
        del attention.call
    [x] = inputs  # (B, T, d_model)
    e = np.asarray(model.encode(source))  # (B, S, d_model)
    kernels = {"/".join(w.path.split("/")[-2:]): w.numpy() for w in attention.weights}
    q = np.einsum("btd,dhk->bhtk", x, kernels["query/kernel"]) + kernels["query/bias"][:, None]
    k = np.einsum("bsd,dhk->bhsk", e, kernels["key/kernel"]) + kernels["key/bias"][:, None]
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(6)  # (B, h, T, S)
    scores = np.where(source.numpy()[:, None, None, :] == 0, -np.inf, scores)
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    assert (source.numpy() == 0).any()  # some padding to mask
    # Weights in [0, 1] from float32 sums in another order: within 64 u (2^-24).
    np.testing.assert_allclose(layers[-1]["cross_attention"].numpy(), expected, rtol=0,
                               atol=64 * 2.0 ** -24)


def test_weights_of_a_sentence_pair(tokenizer):
    model = make_model(tokenizer.vocab_size)
    attention = visualize.cross_attention_weights(
        model, tokenizer, SENTENCES[1], "La tierra estaba desordenada y vacía.", layer=0)
    h, t, s = attention.weights.shape
    assert h == model.config.num_heads
    assert len(attention.key_tokens) == s and len(attention.query_tokens) == t
    assert attention.query_tokens[-1] == "</s>" and attention.layer == 0
    with pytest.raises(ValueError, match="layer must be in"):
        visualize.cross_attention_weights(model, tokenizer, "a", "b", layer=5)


def test_without_a_target_the_weights_are_of_the_translation_of_what_the_translator_read(
        tokenizer):
    """The translator's translation, teacher-forced over the source it read: its
    first max_input_length tokens, not the model's max_positions."""
    model = make_model(tokenizer.vocab_size)
    translator = serving.Translator(model, tokenizer, beam_size=1, beam_sizes=(1,),
                                    max_input_length=4, extra_length=4)
    source = SENTENCES[0]
    assert tokenizer.tokenize(tf.constant([source])).row_lengths()[0] > 4
    attention = visualize.cross_attention_weights(model, tokenizer, source, translator=translator)
    translation = translator.translate(tf.constant([source]))["translation"][0]
    assert len(attention.key_tokens) == 4
    assert len(attention.query_tokens) == tokenizer.tokenize(
        translation[tf.newaxis]).row_lengths()[0] + 1  # and </s>


def test_heatmap_png(tokenizer, tmp_path):
    model = make_model(tokenizer.vocab_size)
    attention = visualize.cross_attention_weights(
        model, tokenizer, SENTENCES[3], "Y vio Dios la luz.")
    for weights in (attention, visualize.encoder_self_attention_weights(
            model, tokenizer, SENTENCES[3], layer=0)):
        path = visualize.plot_attention(weights, str(tmp_path / f"{weights.kind}.png"))
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(path) > 10_000


def test_encoder_self_attention_is_softmax_of_the_layers_queries_and_keys(tokenizer):
    """Layer 0's weights against numpy from its own kernels: softmax(q k^T / sqrt(d_k))
    over the embedded source (a post-norm layer attends to its input as it is)."""
    model = make_model(tokenizer.vocab_size, dropout_rate=0.0)
    attention = visualize.encoder_self_attention_weights(model, tokenizer, SENTENCES[0],
                                                         layer=0)
    ids = tokenizer.tokenize(tf.constant([SENTENCES[0]])).to_tensor()
    x = model._embed(ids, model.encoder_position, model.encoder_dropout).numpy()[0]  # (S, d)
    heads = model.encoder_layers[0]._self_attention
    query = np.einsum("sd,dhk->shk", x, heads._query_dense.kernel.numpy()) + \
        heads._query_dense.bias.numpy()
    key = np.einsum("sd,dhk->shk", x, heads._key_dense.kernel.numpy()) + \
        heads._key_dense.bias.numpy()
    logits = np.einsum("qhk,shk->hqs", query, key) / np.sqrt(query.shape[-1])
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(attention.weights, expected, atol=1e-5)
    assert attention.query_tokens == attention.key_tokens and len(attention.key_tokens) == len(x)
    assert attention.kind == "encoder self-attention"
    # Asking for the weights leaves the encoder's output as it was.
    outputs, weights = model.encode(ids, return_attention_scores=True)
    np.testing.assert_allclose(outputs, model.encode(ids), atol=1e-6)
    assert len(weights) == model.config.num_layers
    with pytest.raises(ValueError, match="layer must be in"):
        visualize.encoder_self_attention_weights(model, tokenizer, "a", layer=9)
