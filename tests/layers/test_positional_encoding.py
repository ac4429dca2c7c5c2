import keras
import numpy as np
import pytest

from keras_transformer.layers import LearnedPositionalEmbedding
from keras_transformer.layers import SinusoidalPositionalEncoding
from tests import reference


@pytest.mark.parametrize("d_model", [16, 7])
@pytest.mark.parametrize("start", [0, 37])
def test_sinusoidal_equals_closed_form(d_model, start):
    x = np.zeros((2, 11, d_model), "float32")
    encoding = np.asarray(SinusoidalPositionalEncoding()(x, start_index=start))
    assert encoding.shape == (2, 11, d_model)
    expected = reference.positional_encoding(11, d_model, start)
    np.testing.assert_allclose(encoding[0], expected, atol=2e-5)
    np.testing.assert_array_equal(encoding[0], encoding[1])


def test_sinusoidal_is_float32_accurate_far_out_under_bfloat16():
    keras.config.set_dtype_policy("mixed_bfloat16")
    x = np.zeros((1, 4, 32), "float32")
    encoding = SinusoidalPositionalEncoding()(x, start_index=5000)
    assert encoding.dtype == "bfloat16"
    # Only the final cast rounds (bfloat16 keeps 8 bits: error < 2^-8).
    expected = reference.positional_encoding(4, 32, 5000)
    np.testing.assert_allclose(np.asarray(encoding, "float32")[0], expected, atol=2**-8)


def test_learned_embedding_slices_its_table_from_start_index():
    layer = LearnedPositionalEmbedding(max_positions=20)
    x = np.zeros((3, 5, 8), "float32")
    layer(x)
    table = np.asarray(layer.position_embeddings)
    assert table.shape == (20, 8)
    np.testing.assert_array_equal(layer(x, start_index=4)[1], table[4:9])
