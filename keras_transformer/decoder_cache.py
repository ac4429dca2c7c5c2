"""The decoder's cache for incremental decoding: its structure, its buffers and
their bookkeeping (`Transformer.initial_cache`, `decode_step`, `reorder_cache`,
`select_examples`).

A cache is a dict, a nested structure of tensors that a search's `tf.while_loop`
carries from step to step:

- `"encoder_padding_mask"`: bool `(B, S)`, True at the sources' real tokens.
- `"cross_attention"`: a list, one `(keys (B, h, S, d_k), values (B, h, S, d_v))`
  per decoder layer: the encoder output's projections, computed once per source.
  The decoder's `B * K` rows (K hypotheses of each source, batch-major) read a
  source's entry in place.
- `"self_attention"` (absent for decoding that re-runs the whole prefix every
  step): a list, one `(keys (B, h, L * K, d_k), values (B, h, L * K, d_v))` per
  decoder layer: K slots of L positions per source, position-major (entry
  `t * K + k` holds position t of slot k; see `layers/kv_cache.py`). Each step
  writes its position into them.
- `"self_attention_slots"` (with K > 1): int32 `(B, K, L)`, the slot that holds
  each position of each hypothesis. Reordering the beams (`reorder`) gathers only
  this table: the keys and values stay where they were written.

B is the number of sources, S their padded length, h the heads, L the positions
the self-attention cache holds and K the hypotheses that share a source's cache
(the beam size; 1 for greedy search, or for a beam search that tiles and gathers
the whole cache).

A step's attention reads every position the cache holds, written or not, so in a
TensorFlow graph outside XLA the cache holds only the positions decoded so far,
rounded up to `GROWTH`: it starts at `initial_length` (a length axis of unknown
static size, which a `tf.while_loop` lets change) and `reserve` pads it, into new
buffers of its own, when a step writes past its end. A translation stops long
before its limit of source length + 50, so a search runs markedly faster (see
benchmarks/decode_throughput.py). Eagerly and under XLA (fixed shapes) the cache
holds every position from the start.
"""

import keras
from keras import ops

from keras_transformer.layers import kv_cache

# Positions the cache grows by (see above).
GROWTH = 16


def self_attention(config, batch_size, max_output_length, beam_size, dtype):
    """The self-attention entries of a new cache: `"self_attention"`, zeros of
    `initial_length(max_output_length)` positions for every decoder layer of a
    `TransformerConfig`, and with `beam_size` > 1 `"self_attention_slots"`."""
    length = initial_length(max_output_length)

    def zeros(head_dim):  # each cache in a buffer of its own, which a search may overwrite
        return kv_cache.zeros((batch_size, config.num_heads, length * beam_size, head_dim), dtype)

    entries = {
        "self_attention": [(zeros(config.d_k), zeros(config.d_v))
                           for _ in range(config.num_layers)],
    }
    if beam_size > 1:
        entries["self_attention_slots"] = ops.zeros((batch_size, beam_size, length), "int32")
    return entries


def initial_length(max_length):
    """The positions a new cache holds for a search of `max_length` (see above)."""
    if not kv_cache.in_graph_outside_xla():
        return max_length
    import tensorflow as tf

    length = tf.minimum(tf.cast(max_length, tf.int32), GROWTH)
    # Its value statically unknown, so that the cache's length axis is too.
    return tf.compat.v1.placeholder_with_default(length, [])


def reserve(cache, end):
    """`cache` with self-attention entries (and slot table) that hold positions
    `0 .. end - 1`: grown if their length is not fixed (see above)."""
    tensors = [tensor for pair in cache["self_attention"] for tensor in pair]
    slots = cache.get("self_attention_slots")  # (B, K, L)
    widths = [1 if slots is None else slots.shape[1]] * len(tensors)  # (B, h, L * K, d)
    if slots is not None:
        tensors.append(slots)
        widths.append(1)
    tensors = _grow(tensors, widths, end)
    pairs = tensors[: 2 * len(cache["self_attention"])]
    grown = dict(cache, self_attention=list(zip(pairs[0::2], pairs[1::2])))
    if slots is not None:
        grown["self_attention_slots"] = tensors[-1]
    return grown


def write_slots(cache, step, length):
    """Records in the slot table that each row's positions `step .. step + length -
    1` are in its own slot. Returns the cache and the self-attention mask
    `(B, K * length, L * K)`: row k of a source may read entry `t * K + k'` of its
    source's cache when its prefix's position t is in slot k'; the mask is None
    for a cache without a slot table."""
    slots = cache.get("self_attention_slots")  # (B, K, L)
    if slots is None:
        return cache, None
    sources, num_slots, max_length = ops.shape(slots)
    own = ops.arange(num_slots, dtype="int32")  # row b * K + k owns slot k
    # A select, not ops.slice_update: outside XLA, TensorFlow runs that through an XLA
    # kernel compiled on demand for each new shape.
    columns = ops.arange(max_length, dtype="int32")
    written = ops.logical_and(columns >= step, columns < step + length)  # (L,)
    slots = ops.where(written[None, None, :], own[None, :, None], slots)
    holds = ops.equal(ops.expand_dims(slots, 3), own)  # (B, K, L, K)
    # B static where the slot table's is: a while loop's state keeps its shapes.
    holds = ops.reshape(holds, (sources, num_slots, max_length * num_slots))  # (B, K, L * K)
    mask = ops.repeat(holds, length, axis=1)  # (B, K * length, L * K)
    return dict(cache, self_attention_slots=slots), mask


def reorder(cache, parents):
    """The cache after a beam search step whose surviving hypotheses extend
    `parents`, int32 `(B, K)`: they take their parents' rows of the slot table."""
    if "self_attention_slots" not in cache:
        return cache
    slots = cache["self_attention_slots"]  # (B, K, L)
    reordered = ops.take_along_axis(slots, ops.expand_dims(parents, -1), axis=1)
    return dict(cache, self_attention_slots=reordered)


def select_examples(cache, examples):
    """The entries of the sources `examples`, int32 `(B',)`, in that order (the
    K hypotheses of a source go with it)."""
    def take(tensor):
        return ops.take(tensor, examples, axis=0)

    return {name: keras.tree.map_structure(take, value) for name, value in cache.items()}


def _grow(tensors, widths, end):
    """`tensors` `(B, *, L * width, ...)`, each padded with zeros along axis 2,
    which holds `width` entries a position, to hold positions `0 .. end - 1`
    (rounded up to `GROWTH`) if they hold fewer; they all hold as many positions.
    Only tensors whose axis has an unknown static size grow, and only in a graph
    outside XLA (see above); the others are returned as they are."""
    if tensors[0].shape[2] is not None or not kv_cache.in_graph_outside_xla():
        return list(tensors)
    import tensorflow as tf

    length = tf.shape(tensors[0])[2] // widths[0]
    end = tf.cast(end, tf.int32)

    def grow():
        extra = (end + GROWTH - 1) // GROWTH * GROWTH - length
        return [tf.pad(tensor, [[0, extra * width if axis == 2 else 0]
                                for axis in range(tensor.shape.rank)])
                for tensor, width in zip(tensors, widths)]

    return tf.cond(end > length, grow, lambda: list(tensors))
