"""The self-attention cache's layout, its buffers and its writes (in place inside a
search).

A self-attention cache is a pair `(keys (B, h, L * G, d_k), values (B, h, L * G,
d_v))`, heads first (the layout the attention's matmuls read): G slots of L
positions for each group of G query rows (the query has `B * G` rows,
batch-major), position-major: entry `t * G + g` holds position t of slot g. Row
`b * G + g` writes its positions into slot g of group b (`update`). With `G = 1`
that is the usual cache, one per query row; with `G > 1`, the K hypotheses of a
beam search share their source's group (`decoder_cache.py` keeps the table of
which slot holds each hypothesis's positions). A step's entries are contiguous, so
a step writes them with one slice update and its attention reads the cache as it
is: under XLA, a reshape between the two made each step copy the whole cache twice.

`ops.slice_update` returns a new tensor, and outside XLA TensorFlow copies the
whole cache for it, every layer and every step, through an XLA kernel compiled on
demand for each new shape (XLA itself updates its buffer in place). A search that
hands each cache to the step function once and never reads it again may let the
step overwrite it: `write(..., in_place=True)` in a TensorFlow graph outside XLA
overwrites the rows of the new positions with `InplaceUpdate`, a fraction of the
copy's cost (see benchmarks/decode_throughput.py). `ops.slice_update` is its twin,
and the one path everywhere else (eager, XLA, other Keras backends).

Overwriting is safe only for buffers nothing else holds: `zeros` gives each cache
its own, from TensorFlow's stateful `Empty` op, which graph optimizations neither
merge with another (every layer's keys and values would share one buffer) nor fold
into a constant (every call would share it). TensorFlow's private modules are
imported inside the functions that use them.
"""

import keras
from keras import ops

from keras_transformer.layers.matmul import transpose


def zeros(shape, dtype):
    """A zero tensor of `shape` in a buffer of its own (see above)."""
    if not in_graph_outside_xla():
        return ops.zeros(shape, dtype)
    import tensorflow as tf

    return tf.raw_ops.Empty(shape=tf.stack(shape), dtype=dtype, init=True)


def update(cache, keys, values, index, in_place=False, integer_transposes=False):
    """The cache `(key_cache, value_cache)` with the new keys `(N, h, T, d_k)` and
    values `(N, h, T, d_v)` of `N = B * G` query rows written at positions
    `index .. index + T - 1` of each row's slot (see above); G is N over the
    cache's B. `in_place` and `integer_transposes`: see `SearchOptions`."""
    key_cache, value_cache = cache
    slots = ops.shape(keys)[0] // ops.shape(key_cache)[0]  # G
    start = index * slots

    def write_slots(cache, states):
        return write(cache, _into_slots(states, slots, integer_transposes), start, in_place)

    return write_slots(key_cache, keys), write_slots(value_cache, values)


def write(cache, updates, start, in_place=False):
    """The cache `(B, h, S, d)` with `updates` `(B, h, U, d)` written at entries
    `start .. start + U - 1`; with `in_place`, in a TensorFlow graph outside XLA,
    into the cache's own buffer (see above)."""
    if not (in_place and in_graph_outside_xla()):
        return ops.slice_update(cache, [0, 0, start, 0], updates)
    import tensorflow as tf

    shape = tf.shape(cache)
    length, depth = shape[2], shape[3]
    updates_shape = tf.shape(updates)
    sequences = updates_shape[0] * updates_shape[1]  # B * h
    rows = (tf.range(sequences)[:, None] * length + tf.cast(start, tf.int32)
            + tf.range(updates_shape[2])[None, :])  # (B * h, U), rows of (B * h * S, d)
    written = tf.raw_ops.InplaceUpdate(
        x=tf.reshape(cache, [-1, depth]),
        i=tf.reshape(rows, [-1]),
        v=tf.reshape(tf.cast(updates, cache.dtype), [-1, depth]),
    )
    return tf.reshape(written, shape)


def in_graph_outside_xla():
    """Whether this is being traced into a TensorFlow graph that XLA will not compile."""
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    return tf.inside_function() and not control_flow_util.GraphOrParentsInXlaContext(
        tf.compat.v1.get_default_graph())


def _into_slots(states, slots, integer_transposes):
    """New keys or values `(N, h, T, d)` of `N = B * G` rows -> `(B, h, T * G, d)`,
    position-major."""
    _, heads, length, depth = ops.shape(states)
    grouped = ops.reshape(states, (-1, slots, heads, length, depth))
    positions_first = transpose(grouped, (0, 2, 3, 1, 4), integer_transposes)  # (B, h, T, G, d)
    return ops.reshape(positions_first, (-1, heads, length * slots, depth))
