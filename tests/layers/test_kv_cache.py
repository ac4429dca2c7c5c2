import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_transformer.layers import kv_cache

SHAPE = (3, 2, 28, 5)  # (B, h, L * G, d): 7 positions of 4 slots


def _op_types(function, *args):
    return {op.type for op in function.get_concrete_function(*args).graph.get_operations()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("length,index", [(1, 0), (4, 24), (12, 8)])
def test_write_in_place_equals_slice_update(dtype, length, index):
    rng = np.random.default_rng(0)
    cache = rng.standard_normal(SHAPE).astype("float32")
    updates = rng.standard_normal(SHAPE[:2] + (length,) + SHAPE[3:]).astype("float32")
    expected = cache.copy()
    expected[:, :, index:index + length] = updates

    @tf.function(autograph=False)
    def write(cache, updates, index):
        cache = tf.identity(tf.cast(cache, dtype))  # a buffer of the function's own
        return kv_cache.write(cache, tf.cast(updates, dtype), index, in_place=True)

    args = (cache, updates, tf.constant(index))
    assert "InplaceUpdate" in _op_types(write, *args)
    twin = ops.slice_update(tf.cast(cache, dtype), [0, 0, index, 0], tf.cast(updates, dtype))
    np.testing.assert_array_equal(ops.convert_to_numpy(ops.cast(write(*args), "float32")),
                                  ops.convert_to_numpy(ops.cast(twin, "float32")))
    np.testing.assert_allclose(ops.convert_to_numpy(ops.cast(twin, "float32")), expected,
                               rtol=1e-2, atol=1e-2)


def test_slice_update_unless_in_place_eagerly_and_under_xla():
    cache = np.zeros(SHAPE, "float32")
    updates = np.ones(SHAPE[:2] + (1,) + SHAPE[3:], "float32")

    def write(cache, updates):
        return kv_cache.write(cache, updates, 2, in_place=True)

    def write_outside(cache, updates):
        return cache, kv_cache.write(cache, updates, 2)

    eager = tf.constant(cache)
    assert ops.convert_to_numpy(write(eager, updates)).sum() == updates.size
    assert ops.convert_to_numpy(eager).sum() == 0  # an eager tensor is never overwritten
    xla = tf.function(write, autograph=False, jit_compile=True)
    assert ops.convert_to_numpy(xla(cache, updates)).sum() == updates.size
    outside = tf.function(write_outside, autograph=False)
    assert "InplaceUpdate" not in _op_types(outside, cache, updates)
    before, after = outside(cache, updates)
    assert ops.convert_to_numpy(before).sum() == 0
    assert ops.convert_to_numpy(after).sum() == updates.size


def test_each_zeros_is_a_buffer_of_its_own():
    """Two caches of the same shape: overwriting one leaves the other zero. With
    `ops.zeros` graph optimization makes both one buffer, and this fails."""
    @tf.function(autograph=False)
    def two_caches(batch):
        shape = (batch,) + SHAPE[1:]
        first, second = kv_cache.zeros(shape, "float32"), kv_cache.zeros(shape, "float32")
        first = kv_cache.write(first, tf.ones(SHAPE[:2] + (1,) + SHAPE[3:]), 0, in_place=True)
        return first, second

    for _ in range(2):  # and a second call starts from zeros again
        first, second = two_caches(tf.constant(SHAPE[0]))
        assert ops.convert_to_numpy(first).sum() == np.prod(SHAPE[:2]) * SHAPE[3]
        assert ops.convert_to_numpy(second).sum() == 0
