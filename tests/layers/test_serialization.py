import keras
import numpy as np
import pytest

from keras_transformer import layers

D = 8
SEQUENCE = np.random.RandomState(0).randn(2, 5, D).astype("float32")
IDS = np.array([[1, 2, 3, 0, 0], [4, 5, 6, 7, 0]])

# (layer, call arguments)
CASES = {
    "attention": (lambda: layers.MultiHeadAttention(2, 3, value_dim=5, dropout=0.1),
                  (SEQUENCE, SEQUENCE)),
    "shared_embedding": (lambda: layers.SharedEmbedding(10, D), (IDS,)),
    "sinusoidal": (lambda: layers.SinusoidalPositionalEncoding(max_wavelength=500), (SEQUENCE,)),
    "learned": (lambda: layers.LearnedPositionalEmbedding(9), (SEQUENCE,)),
    "feed_forward": (lambda: layers.PositionwiseFeedForward(12, activation="gelu"), (SEQUENCE,)),
    "projection": (lambda: layers.Projection((2, 3), contracted=2, use_bias=False), (SEQUENCE,)),
    "encoder": (lambda: layers.TransformerEncoderLayer(2, 12, key_dim=3, norm_first=True),
                (SEQUENCE,)),
    "decoder": (lambda: layers.TransformerDecoderLayer(2, 12, value_dim=5, dropout_rate=0.2),
                (SEQUENCE, SEQUENCE)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_config_round_trips_and_weights_reproduce_outputs(name):
    make, args = CASES[name]
    layer = make()
    expected = layer(*args)
    config = layer.get_config()
    # Through Keras's own registry, as a .keras file does it.
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(clone) is type(layer)
    assert clone.get_config() == config
    clone(*args)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(clone(*args), expected, atol=1e-6)
