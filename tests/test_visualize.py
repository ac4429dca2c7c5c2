"""Tests for keras_transformer.visualize: cross-attention weights and heatmaps."""

import os

import numpy as np
import pytest
import tensorflow as tf

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


def test_weights_of_a_sentence_pair(tokenizer):
    model = make_model(tokenizer.vocab_size)
    attention = visualize.cross_attention_weights(
        model, tokenizer, SENTENCES[1], "La tierra estaba desordenada y vacía.", layer=0)
    h, t, s = attention.weights.shape
    assert h == model.config.num_heads
    assert len(attention.source_tokens) == s and len(attention.target_tokens) == t
    assert attention.target_tokens[-1] == "</s>" and attention.layer == 0
    with pytest.raises(ValueError, match="layer must be in"):
        visualize.cross_attention_weights(model, tokenizer, "a", "b", layer=5)


def test_heatmap_png(tokenizer, tmp_path):
    pytest.importorskip("matplotlib")
    model = make_model(tokenizer.vocab_size)
    attention = visualize.cross_attention_weights(
        model, tokenizer, SENTENCES[3], "Y vio Dios la luz.")
    path = visualize.plot_cross_attention(attention, str(tmp_path / "attention.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(path) > 10_000
