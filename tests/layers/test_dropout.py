import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers import Dropout
from keras_transformer.layers.dropout import random_bits
from tests import reference

RATE = 0.1
N = 1 << 20


def _six_sigma(p, n):
    return 6 * np.sqrt(p * (1 - p) / n)


def test_bits_equal_the_numpy_hash():
    for seed in ([0, 0], [1234, 7], [2**31 - 1, 2**31 - 5]):
        np.testing.assert_array_equal(
            random_bits((3, 50, 7), np.array(seed, "int64")), reference.random_bits((3, 50, 7), seed)
        )


def test_bits_under_xla_equal_eager():
    seed = tf.constant([5, 9], tf.int64)
    compiled = tf.function(lambda s: random_bits((64, 33), s), jit_compile=True)
    np.testing.assert_array_equal(compiled(seed), random_bits((64, 33), seed))


def test_bits_are_uniform_over_bytes():
    bits = np.asarray(random_bits((N,), np.array([3, 4])))
    # Chi-square of each byte's 256 values: df 255, mean 255, sd 22.6.
    for shift in (0, 8, 16, 24):
        counts = np.bincount((bits >> shift) & 0xFF, minlength=256)
        expected = N / 256
        chi_square = ((counts - expected) ** 2 / expected).sum()
        assert chi_square < 255 + 6 * 22.6, (shift, chi_square)


def test_drops_are_independent_of_neighbours_and_of_the_last_call():
    layer = Dropout(RATE, seed=0)
    x = np.ones((256, 64, 64), "float32")
    first = np.asarray(layer(x, training=True)).reshape(-1) == 0
    second = np.asarray(layer(x, training=True)).reshape(-1) == 0
    n = first.size
    assert abs(first.mean() - RATE) < _six_sigma(RATE, n)
    assert abs(second.mean() - RATE) < _six_sigma(RATE, n)
    both = RATE * RATE
    # The next element, the next row, the next batch entry, and the next call.
    for name, a, b in (
        ("element", first[:-1], first[1:]),
        ("row", first[:-64], first[64:]),
        ("batch", first[: -64 * 64], first[64 * 64 :]),
        ("call", first, second),
    ):
        assert abs((a & b).mean() - both) < _six_sigma(both, a.size), name


def test_kept_elements_are_scaled_and_the_mean_is_kept():
    x = np.random.RandomState(0).uniform(1, 2, (128, 128, 64)).astype("float32")
    y = np.asarray(Dropout(RATE, seed=1)(x, training=True))
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / (1 - RATE), rtol=1e-6)
    np.testing.assert_allclose(y.mean(), x.mean(), rtol=3e-3)


def test_identity_outside_training_and_at_rate_zero():
    x = np.random.RandomState(0).randn(4, 5).astype("float32")
    np.testing.assert_array_equal(Dropout(0.5)(x), x)
    np.testing.assert_array_equal(Dropout(0.5)(x, training=False), x)
    np.testing.assert_array_equal(Dropout(0.0)(x, training=True), x)


def test_seeds_reproduce_and_differ():
    x = np.ones((32, 32), "float32")
    a, b, c = Dropout(0.5, seed=7), Dropout(0.5, seed=7), Dropout(0.5, seed=8)
    np.testing.assert_array_equal(a(x, training=True), b(x, training=True))
    assert not np.array_equal(a(x, training=True), c(x, training=True))
    # Each call draws a new mask.
    assert not np.array_equal(a(x, training=True), a(x, training=True))


def test_keeps_the_dtype_and_has_gradients_through_kept_elements():
    x = tf.random.normal((8, 16), dtype=tf.bfloat16)
    assert Dropout(0.5, seed=2, dtype="mixed_bfloat16")(x, training=True).dtype == tf.bfloat16
    layer = Dropout(0.5, seed=2)
    x = tf.ones((8, 16))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
    gradient = tape.gradient(y, x)
    np.testing.assert_allclose(gradient, np.where(y.numpy() != 0, 2.0, 0.0))


def test_bad_rate():
    with pytest.raises(ValueError, match="rate must be in"):
        Dropout(1.0)


def test_config_round_trips():
    layer = Dropout(0.25, seed=3, name="drop")
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(clone) is Dropout and clone.get_config() == layer.get_config()
