"""The searches' argument checks, each error naming the argument and what was
received, their id buffers and the shapes of their loop states (`decoding`)."""

import tensorflow as tf


def static_max_output_length(max_output_length):
    """Returns `max_output_length` as a Python int when its value is known."""
    value = tf.get_static_value(max_output_length)
    if value is None:
        # Graph mode with a computed length: works, but XLA cannot compile it.
        return tf.cast(max_output_length, tf.int32)
    value = int(value)
    if value < 1:
        raise ValueError(
            f"max_output_length must be at least 1 (the most tokens to generate). "
            f"Received: max_output_length={value}"
        )
    return value


def ngram_size(no_repeat_ngram_size):
    """`no_repeat_ngram_size` as a Python int >= 0, or as an int32 scalar when
    it is a tensor (a request's setting, checked by the caller)."""
    if tf.is_tensor(no_repeat_ngram_size):
        return tf.cast(no_repeat_ngram_size, tf.int32)
    if isinstance(no_repeat_ngram_size, bool) or not isinstance(no_repeat_ngram_size, int) \
            or no_repeat_ngram_size < 0:
        raise ValueError(
            "no_repeat_ngram_size must be an int >= 0 (0 blocks nothing). "
            f"Received: no_repeat_ngram_size={no_repeat_ngram_size!r}")
    return no_repeat_ngram_size


def check_initial_ids(initial_ids):
    initial_ids = tf.convert_to_tensor(initial_ids)
    if initial_ids.shape.rank != 1:
        raise ValueError(
            "initial_ids must be a vector (batch,) of start tokens. "
            f"Received: initial_ids with shape {initial_ids.shape}"
        )
    return tf.cast(initial_ids, tf.int32)


def start_buffer(initial_ids, max_output_length, padding_id):
    """Id buffer `(B, T + 1)`: the start token, then padding."""
    batch_size = dim(initial_ids, 0)
    padding = tf.fill([batch_size, max_output_length], padding_id)  # (B, T)
    return tf.concat([initial_ids[:, tf.newaxis], padding], axis=1)  # (B, T + 1)


def dim(tensor, axis):
    """The size of `axis`: a Python int when static, else a scalar tensor."""
    size = tensor.shape[axis]
    return size if size is not None else tf.shape(tensor)[axis]


def resolve_max_output_lengths(max_output_lengths, batch_size, max_output_length):
    """Per-example limits `(B,)` int32, clipped to [1, max_output_length]."""
    if max_output_lengths is None:
        return tf.fill([batch_size], max_output_length)
    max_output_lengths = tf.cast(max_output_lengths, tf.int32)
    if max_output_lengths.shape.rank != 1:
        raise ValueError(
            "max_output_lengths must be a vector (batch,) of per-example limits. "
            f"Received: max_output_lengths with shape {max_output_lengths.shape}"
        )
    return tf.clip_by_value(max_output_lengths, 1, max_output_length)


def check_logits(logits, vocab_size):
    """Checks that logits are `(N, V)`, with the V given when it is known."""
    if logits.shape.rank != 2:
        raise ValueError(
            "symbols_to_logits_fn must return logits of shape (rows, vocab_size). "
            f"Received: logits with shape {logits.shape}"
        )
    if vocab_size is not None and logits.shape[-1] not in (None, vocab_size):
        raise ValueError(
            f"symbols_to_logits_fn returned logits for {logits.shape[-1]} tokens "
            f"but beam_search was given vocab_size={vocab_size}; they must agree."
        )


def same_shapes(new_cache, old_cache):
    """Checks that the step function kept the cache's structure and shapes.

    `tf.ensure_shape` also restores static shapes a step function may have
    lost (a reshape with -1), which the loop's fixed shape invariants need.
    """
    try:
        tf.nest.assert_same_structure(new_cache, old_cache)
    except (TypeError, ValueError) as error:
        raise ValueError(
            "symbols_to_logits_fn must return a cache with the structure it "
            f"received. Received: {shapes(new_cache)} for {shapes(old_cache)}"
        ) from error
    return tf.nest.map_structure(
        lambda new, old: tf.ensure_shape(new, old.shape), new_cache, old_cache
    )


def shapes(structure):
    return tf.nest.map_structure(lambda t: getattr(t, "shape", t), structure)


def shape_invariants(state, any_batch=False):
    """The loop state's own shapes: nothing grows inside the loop. With
    `any_batch`, the batch of the examples in it may shrink."""
    invariants = tf.nest.map_structure(lambda t: tf.TensorShape(t.shape), state)
    if not any_batch:
        return invariants
    whole_batch = ("step", "done_ids", "done_scores")
    return invariants._replace(**{
        name: tf.nest.map_structure(lambda shape: tf.TensorShape([None, *shape[1:]]),
                                    getattr(invariants, name))
        for name in invariants._fields if name not in whole_batch})
