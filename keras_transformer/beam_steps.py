"""The pieces of beam search (`keras_transformer.decoding.beam_search`): its loop
state, one step of the search (`extend`), examples leaving the batch as their
n-best lists become final (`leave_batch`), and the n-best lists at the end.

The search itself is `extend` in a `tf.while_loop`; `leave_batch`, which only
shrinks the state, wraps it when the caller can select examples of its cache
(not under XLA, whose shapes cannot change). Shape letters as in `decoding`.
"""

import collections

import tensorflow as tf

from keras_transformer import beam_candidates
from keras_transformer import search_arguments

# Log probability of a slot holding no hypothesis: an unused beam, an unfilled
# finished slot, a candidate that is masked out. Masks are applied with
# `tf.where`, never by multiplication, so -inf never meets a zero, and it stays
# -inf under every addition and division the search does; a large finite number
# would not: -1e9 plus a few log probabilities drifts away from -1e9 and can
# pass for a real, very unlikely hypothesis when the beam is wider than the
# number of live candidates.
NO_HYPOTHESIS = float("-inf")


def length_penalty(length, alpha):
    """The GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016).

    A finished hypothesis Y is scored log P(Y) / lp(Y). With alpha = 0 the score
    is the plain log probability; larger alpha favours longer outputs.

    Args:
        length: int or float tensor (any shape), the length |Y| of the
            hypothesis in generated tokens (end-of-sequence token included).
        alpha: float, the strength of the penalty (0.6 in the paper).

    Returns:
        float32 tensor with the shape of `length`.
    """
    length = tf.cast(length, tf.float32)
    return tf.pow((5.0 + length) / 6.0, alpha)


class BeamSettings(collections.namedtuple("BeamSettings", [
        "vocab_size", "beam_size", "num_candidates", "block_size", "max_output_length",
        "columns", "eos_id", "alpha", "no_repeat_ngram_size", "word_starts", "stutters",
        "ignore_eos", "allow_empty", "reorder_cache"])):
    """What every step of a beam search uses: V, K, C, the block size of
    `beam_candidates.best_extensions`, T, the columns `(T + 1,)` of the id
    buffers, and `beam_search`'s other arguments."""

    __slots__ = ()


class BeamState(
    collections.namedtuple(
        "BeamState",
        [
            "step",
            "alive_ids",
            "alive_log_probs",
            "alive_cache",
            "finished_ids",
            "finished_scores",
            "examples",
            "limits",
            "done_ids",
            "done_scores",
        ],
    )
):
    """Loop state of beam search.

    step: int32 scalar, the last written column of the id buffers; every live
        hypothesis has `step` tokens.
    alive_ids: int32 (B, K, T + 1), the live hypotheses (not ended).
    alive_log_probs: float32 (B, K), their log probabilities, best first;
        -inf where a beam holds no hypothesis.
    alive_cache: the step function's cache for the live hypotheses, leading
        dimension B * K, batch-major (any layout with `reorder_cache`).
    finished_ids: int32 (B, K, T + 1), the best finished hypotheses so far.
    finished_scores: float32 (B, K), their scores log P / lp(|Y|), best first;
        -inf for slots not filled yet.
    examples: int32 (B,), the index of each example in the whole batch (they
        leave it with `select_examples`).
    limits: int32 (B,), each example's output limit.
    done_ids, done_scores: `finished_*` of the whole batch, as they were when
        examples left it.
    """

    __slots__ = ()


def initial_state(search, initial_ids, initial_cache, max_output_lengths, padding_id):
    """The loop state before the first step: one live hypothesis (the start
    token) per example, no finished one."""
    batch_size = search_arguments.dim(initial_ids, 0)
    beam_size, max_output_length = search.beam_size, search.max_output_length
    start_ids = search_arguments.start_buffer(
        initial_ids, max_output_length, padding_id)  # (B, T + 1)
    # Only beam 0 holds a hypothesis at first: K copies of the start token
    # would fill the beam with K copies of every continuation.
    alive_log_probs = tf.concat(
        [
            tf.zeros([batch_size, 1], tf.float32),
            tf.fill([batch_size, beam_size - 1], NO_HYPOTHESIS),
        ],
        axis=1,
    )  # (B, K)
    finished_ids = tf.fill([batch_size, beam_size, max_output_length + 1], padding_id)
    finished_scores = tf.fill([batch_size, beam_size], NO_HYPOTHESIS)  # (B, K)
    return BeamState(
        step=tf.constant(0),
        alive_ids=tf.repeat(start_ids[:, tf.newaxis], beam_size, axis=1),  # (B, K, T + 1)
        alive_log_probs=alive_log_probs,
        alive_cache=initial_cache if search.reorder_cache else tf.nest.map_structure(
            lambda t: tf.repeat(t, beam_size, axis=0), initial_cache
        ),  # leading dimension B * K
        finished_ids=finished_ids,
        finished_scores=finished_scores,
        examples=tf.range(batch_size),
        limits=max_output_lengths,
        done_ids=finished_ids,
        done_scores=finished_scores,
    )


def can_improve(state, alpha):
    """(B,): whether a live hypothesis of each example can still enter its n-best list."""
    # Both sides are sorted best first by top_k.
    best_alive = state.alive_log_probs[:, 0]  # (B,)
    # The largest length penalty each example can still reach: at its limit
    # when alpha >= 0, else now.
    largest_penalty = tf.maximum(
        length_penalty(state.step + 1, alpha), length_penalty(state.limits, alpha))
    return best_alive / largest_penalty > state.finished_scores[:, -1]


def extend(search, symbols_to_logits_fn, state):
    """One step of the search: every live hypothesis extended by one token; the
    best K that do not end stay alive (the cache follows them), and those that
    end join the finished ones."""
    vocab_size, beam_size = search.vocab_size, search.beam_size
    flat_ids = tf.reshape(state.alive_ids, [-1, search.max_output_length + 1])  # (B * K, T + 1)
    logits, cache = symbols_to_logits_fn(flat_ids, state.step, state.alive_cache)
    cache = search_arguments.same_shapes(cache, state.alive_cache)
    search_arguments.check_logits(logits, vocab_size)
    logits = tf.cast(logits, tf.float32)
    size = search.no_repeat_ngram_size

    def candidates(mask=None):  # the C best extensions over all beams and tokens
        return beam_candidates.best_extensions(
            logits, state.alive_log_probs, search.num_candidates, search.block_size, mask)

    candidate_log_probs, flat_indices = beam_candidates.with_repeats_blocked(
        candidates, flat_ids, state.step, vocab_size, size, search.word_starts,
        search.stutters)  # (B, C), (B, C)
    parents = flat_indices // vocab_size  # (B, C) beam each extends
    tokens = flat_indices % vocab_size  # (B, C)
    length = state.step + 1  # of every candidate
    candidate_ids = tf.gather(state.alive_ids, parents, batch_dims=1)  # (B, C, T + 1)
    candidate_ids = tf.where(
        search.columns == length, tokens[:, :, tf.newaxis], candidate_ids
    )  # (B, C, T + 1)

    at_limit = (length >= state.limits)[:, tf.newaxis]  # (B, 1)
    if search.ignore_eos:
        ends = tf.zeros_like(tokens, tf.bool)  # (B, C)
    else:
        ends = tf.equal(tokens, search.eos_id)  # (B, C)
    in_beam = tf.range(search.num_candidates) < beam_size  # (C,); top_k sorts
    finishes = tf.logical_or(tf.logical_and(ends, in_beam), at_limit)  # (B, C)
    if not search.allow_empty:
        # The end-of-sequence token first, an empty output, is dropped: neither
        # finished nor kept, as if its probability were 0 and the others kept
        # theirs. Dropping it from the C = 2K candidates of the one live beam
        # leaves the K best of the others, as masking it before the choice would.
        finishes = tf.logical_and(finishes, tf.logical_not(tf.logical_and(ends, length == 1)))
    stays_alive = tf.logical_not(tf.logical_or(ends, at_limit))  # (B, C)

    # Alive: the best K candidates that do not end; the cache follows them.
    alive_log_probs, alive_indices = tf.nn.top_k(
        tf.where(stays_alive, candidate_log_probs, NO_HYPOTHESIS), k=beam_size
    )  # (B, K), (B, K) indices into C
    alive_ids = tf.gather(candidate_ids, alive_indices, batch_dims=1)  # (B, K, T + 1)
    alive_parents = tf.gather(parents, alive_indices, batch_dims=1)  # (B, K)
    cache = follow_parents(search, cache, alive_parents)

    # Finished: the best K of those kept so far and those that end now.
    candidate_scores = tf.where(
        finishes, candidate_log_probs / length_penalty(length, search.alpha), NO_HYPOTHESIS
    )  # (B, C)
    finished_scores, finished_indices = tf.nn.top_k(
        tf.concat([state.finished_scores, candidate_scores], axis=1), k=beam_size
    )  # (B, K), (B, K) indices into K + C
    finished_ids = tf.gather(
        tf.concat([state.finished_ids, candidate_ids], axis=1),  # (B, K + C, T + 1)
        finished_indices,
        batch_dims=1,
    )  # (B, K, T + 1)
    return state._replace(
        step=length,
        alive_ids=alive_ids,
        alive_log_probs=alive_log_probs,
        alive_cache=cache,
        finished_ids=finished_ids,
        finished_scores=finished_scores,
    )


def follow_parents(search, cache, parents):
    """The cache of the hypotheses that extend `parents`, int32 `(B, K)`: the
    caller's `reorder_cache`, or a gather of the rows of a tiled cache."""
    if search.reorder_cache:
        return search.reorder_cache(cache, parents)
    rows = tf.range(tf.shape(parents)[0])[:, tf.newaxis]  # (B, 1)
    flat_parents = tf.reshape(parents + search.beam_size * rows, [-1])  # (B * K,)
    return tf.nest.map_structure(lambda t: tf.gather(t, flat_parents), cache)


def leave_batch(state, alpha, select_examples):
    """`state` without the examples whose n-best lists are final, once they are a
    quarter of the batch (so that the cache is copied a few times only); their
    lists go to `done_*`. `select_examples(cache, examples)` keeps the cache of
    `examples`, int32 `(B',)` indices into the batch of the step."""
    improvable = can_improve(state, alpha)  # (B,)
    active = tf.size(improvable)
    done = active - tf.reduce_sum(tf.cast(improvable, tf.int32))
    rows = state.examples[:, tf.newaxis]  # (B, 1) of the whole batch

    def compacted():
        keep = tf.cast(tf.where(improvable)[:, 0], tf.int32)  # (B',)
        kept = {name: tf.gather(getattr(state, name), keep) for name in (
            "alive_ids", "alive_log_probs", "finished_ids", "finished_scores", "examples",
            "limits")}
        return state._replace(
            **kept, alive_cache=select_examples(state.alive_cache, keep),
            done_ids=tf.tensor_scatter_nd_update(state.done_ids, rows, state.finished_ids),
            done_scores=tf.tensor_scatter_nd_update(
                state.done_scores, rows, state.finished_scores))

    return tf.cond(tf.logical_and(4 * done >= active, done < active), compacted,
                   lambda: state)


def n_best(state, padding_id):
    """The search's result from its final state: ids `(B, K, T)` and scores `(B, K)`."""
    # Every hypothesis alive at the last step reached max_output_length and was
    # finished, and an early stop leaves no live hypothesis that could enter
    # the n-best list, so the finished slots are the answer.
    # A slot without a hypothesis (score -inf) gets only padding. top_k keeps
    # the first of equal scores, which leaves the initial padding there, but a
    # backend breaking ties otherwise would bring in a dead beam's ids.
    rows = state.examples[:, tf.newaxis]  # the examples still in the batch
    scores = tf.tensor_scatter_nd_update(state.done_scores, rows, state.finished_scores)
    ids = tf.tensor_scatter_nd_update(state.done_ids, rows, state.finished_ids)
    ids = tf.where((scores > NO_HYPOTHESIS)[:, :, tf.newaxis], ids, padding_id)  # (B, K, T + 1)
    return ids[:, :, 1:], scores  # (B, K, T), (B, K)
