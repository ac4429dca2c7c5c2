"""The self-attention cache's buffers, its growth and its writes in place inside a
search.

Each decoding step writes the new positions' keys and values into the cache
`(B, h, L * G, d)` (G slots, position-major: a step's entries are contiguous).
`ops.slice_update` returns a new tensor, and outside XLA
TensorFlow copies the whole cache for it, every layer and every step, through an XLA
kernel compiled on demand for each new shape: for the base model with 32 sources,
beam 4 and 48 positions, 12 copies of 12.6 MB, 15 to 20 ms of a 140 ms step on a
2-core AVX2 CPU (XLA itself updates its buffer in place). A search that hands each
cache to the step function once and never reads it again may let the step overwrite
it: inside `writes_in_place()`, `write` in a TensorFlow graph outside XLA overwrites
the rows of the new positions with `InplaceUpdate` (3.3 ms for the same 12 writes).
`ops.slice_update` is its twin, and the one path everywhere else (eager, XLA, other
Keras backends).

Overwriting is safe only for buffers nothing else holds: `zeros` gives each cache
its own, from TensorFlow's stateful `Empty` op, which graph optimizations neither
merge with another (every layer's keys and values would share one buffer) nor fold
into a constant (every call would share it).

A step's attention reads every position the cache holds, written or not, so in a
graph outside XLA the cache holds only the positions decoded so far, rounded up to
`GROWTH`: it starts at `initial_length` (a length axis of unknown static size, which
a `tf.while_loop` lets change) and `reserve` pads it, into a new buffer of its own,
when a step writes past its end. A translation stops long before its limit of
source length + 50: a base-model search of 30 steps over 24-token sources, beam 4,
whose cache would hold 74 positions, takes 0.73x the time with 32 sources, 0.78x
with 8 and 0.9x with one (2-core AVX2 CPU). Eagerly and under XLA (fixed shapes)
the cache holds every position from the start. TensorFlow's private modules are
imported inside the functions that use them.
"""

import contextlib
import threading

import keras
from keras import ops

_state = threading.local()

# Positions the cache grows by (see above).
GROWTH = 16


@contextlib.contextmanager
def writes_in_place():
    """Within it, `write` may overwrite the cache it is given (see above)."""
    previous = getattr(_state, "in_place", False)
    _state.in_place = True
    try:
        yield
    finally:
        _state.in_place = previous


def zeros(shape, dtype):
    """A zero tensor of `shape` in a buffer of its own (see above)."""
    if not _in_graph_outside_xla():
        return ops.zeros(shape, dtype)
    import tensorflow as tf

    return tf.raw_ops.Empty(shape=tf.stack(shape), dtype=dtype, init=True)


def initial_length(max_length):
    """The positions a new cache holds for a search of `max_length` (see above)."""
    if not _in_graph_outside_xla():
        return max_length
    import tensorflow as tf

    length = tf.minimum(tf.cast(max_length, tf.int32), GROWTH)
    # Its value statically unknown, so that the cache's length axis is too.
    return tf.compat.v1.placeholder_with_default(length, [])


def reserve(tensors, axes, widths, end):
    """`tensors`, each padded with zeros along its axis in `axes`, which holds
    `widths` entries a position, to hold positions `0 .. end - 1` (rounded up to
    `GROWTH`) if it holds fewer; they all hold as many positions. Only tensors
    whose axis has an unknown static size grow, and
    only in a graph outside XLA (see above); the others are returned as they
    are."""
    if tensors[0].shape[axes[0]] is not None or not _in_graph_outside_xla():
        return list(tensors)
    import tensorflow as tf

    length = tf.shape(tensors[0])[axes[0]] // widths[0]
    end = tf.cast(end, tf.int32)

    def grow():
        extra = (end + GROWTH - 1) // GROWTH * GROWTH - length
        return [tf.pad(tensor, [[0, extra * width if axis == i else 0]
                                for i in range(tensor.shape.rank)])
                for tensor, axis, width in zip(tensors, axes, widths)]

    return tf.cond(end > length, grow, lambda: list(tensors))


def write(cache, updates, start):
    """The cache `(B, h, S, d)` with `updates` `(B, h, U, d)` written at entries
    `start .. start + U - 1`."""
    if not (getattr(_state, "in_place", False) and _in_graph_outside_xla()):
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


def _in_graph_outside_xla():
    """Whether this is being traced into a TensorFlow graph that XLA will not compile."""
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    return tf.inside_function() and not control_flow_util.GraphOrParentsInXlaContext(
        tf.compat.v1.get_default_graph())
