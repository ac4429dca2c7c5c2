"""Greedy and beam search over a step function, in pure TensorFlow.

Sec. 6.1: "we used beam search with a beam size of 4 and length penalty
alpha = 0.6 [...] We set the maximum output length during inference to input
length + 50, but terminate early when possible."

Both searches drive a step function, never a model:

    symbols_to_logits_fn(ids, step, cache) -> (logits, cache)

- `ids`: int32 `(N, max_output_length + 1)`, a fixed-size buffer of the hypotheses.
  Column 0 holds the start token, columns `1..step` the tokens decoded so far,
  later columns `padding_id`. `N` is `batch` for greedy search and
  `batch * beam_size` for beam search, batch-major: rows
  `b * beam_size .. b * beam_size + beam_size - 1` belong to example `b`.
- `step`: int32 scalar, the index of the last written column of `ids`. The
  function returns the logits for position `step + 1`. A model with a key/value
  cache reads only `ids[:, step]`; a model without one may read
  `ids[:, :step + 1]`.
- `cache`: a nested structure (dict, tuple, ...) of tensors, returned with
  the same structure and static shapes; outside XLA, a dimension whose static
  size is unknown may change from step to step (`Transformer` grows its
  self-attention cache so). By default every entry's leading dimension is
  `N`: the caller hands in caches with leading dimension `batch`, and beam
  search tiles every entry to `batch * beam_size` and, after every step,
  reorders it with `tf.gather` along the parent beams that survived. Given
  `reorder_cache`, beam search neither tiles nor gathers: the cache is the
  step function's own state for all `N` rows, in any layout, and
  `reorder_cache(cache, parents)` follows the beams (a model can then keep
  what is the same for every beam once per example, and write keys and values
  in place instead of copying them every step). Pass `{}` when there is no
  cache.
- `logits`: float `(N, vocab_size)`, any float dtype; the searches cast them to
  float32 before the log-softmax.

Shapes are static, so both searches compile with
`tf.function(jit_compile=True)`: the `tf.while_loop` state keeps one shape for
every step (the id buffers have `max_output_length + 1` columns from the start and
each step writes one column), so there is one program per batch size and
`max_output_length`, and the loop body is traced once. The searches are plain
functions: wrap them in `tf.function` (with or without `jit_compile`) for speed;
eagerly, the loop runs step by step in Python, which is what the tests use to
count calls to the step function.

Lengths: the length `|Y|` of a hypothesis is its number of generated tokens,
counting the end-of-sequence token when it has one and not counting the start
token. `max_output_length` and `max_output_lengths` bound `|Y|`: a hypothesis that reaches its
example's limit without an end-of-sequence token is finished there, as if one
followed, with `|Y|` equal to the limit.
Unless `allow_empty`, the end-of-sequence token never comes first: every
output has a token (at a limit of 1, that token alone).

Beam search's loop state, its step and the batch shrinking as examples finish
live in `keras_transformer.beam_steps`; this module holds the two searches'
contracts and loops.

Shape letters: B batch, K beam_size, C = 2K candidates per step, V vocab_size,
T max_output_length, N rows seen by the step function (B for greedy, B * K for beam).
"""

import collections

import tensorflow as tf

from keras_transformer import beam_candidates
from keras_transformer import beam_steps
from keras_transformer import search_arguments
from keras_transformer.decoding_config import PAPER_ALPHA
from keras_transformer.decoding_config import PAPER_BEAM_SIZE
from keras_transformer.decoding_config import positive_int
# Public here too: the score of a finished hypothesis is log P(Y) / lp(Y).
from keras_transformer.beam_steps import length_penalty  # noqa: F401


def greedy_search(
    symbols_to_logits_fn,
    initial_ids,
    initial_cache,
    *,
    max_output_length,
    eos_id,
    max_output_lengths=None,
    padding_id=0,
    no_repeat_ngram_size=0,
    block_adjacent_repeats=None,
    block_stutters=None,
    ignore_eos=False,
    allow_empty=False,
):
    """Decodes by taking the most likely token at every step.

    Args:
        symbols_to_logits_fn: `(ids, step, cache) -> (logits, cache)`, see the
            module docstring; here `ids` is `(B, T + 1)`.
        initial_ids: int tensor `(B,)`, the start token of every example.
        initial_cache: nested structure of tensors with leading dimension B
            (`{}` when there is none).
        max_output_length: int T, the most tokens to generate, end-of-sequence token
            included. It fixes the size of the output, so it must be a Python
            int (or a constant tensor) for XLA.
        eos_id: int, the end-of-sequence id.
        max_output_lengths: optional int tensor `(B,)`, a limit per example (e.g. its
            source length + 50), clipped to `[1, max_output_length]`; an example that
            reaches it without an end-of-sequence token stops there.
        padding_id: int written after the end of every sequence.
        no_repeat_ngram_size: int n; when > 0, no token is taken that would
            repeat an n-gram of the sequence (`beam_search`).
        block_adjacent_repeats: None, or bool `(V,)`, which tokens start a
            word: then no token is taken that repeats, right after itself, a
            run of tokens that starts a word (`beam_search`).
        block_stutters: None, or bool `(V,)`, pieces that may not come three
            times in a row (`beam_search`).
        ignore_eos: if True, the end-of-sequence token does not end a sequence
            (it is decoded like any other token) and the loop runs exactly
            `max_output_length` steps: for benchmarks with random weights.
        allow_empty: whether the end-of-sequence token may come first, giving
            an empty output (`beam_search`). False: the best other token comes
            first.

    Returns:
        ids: int32 `(B, T)`, the decoded tokens without the start token, the
            end-of-sequence token included, `padding_id` after it.
        scores: float32 `(B,)`, the log probability of each sequence (sum over
            its tokens, no length penalty).
    """
    max_output_length = search_arguments.static_max_output_length(max_output_length)
    no_repeat_ngram_size = search_arguments.ngram_size(no_repeat_ngram_size)
    initial_ids = search_arguments.check_initial_ids(initial_ids)
    batch_size = search_arguments.dim(initial_ids, 0)
    max_output_lengths = search_arguments.resolve_max_output_lengths(
        max_output_lengths, batch_size, max_output_length)
    initial_cache = {} if initial_cache is None else initial_cache
    columns = tf.range(max_output_length + 1)  # (T + 1,)
    word_starts = _optional_bools(block_adjacent_repeats)
    stutters = _optional_bools(block_stutters)

    state = _GreedyState(
        step=tf.constant(0),
        ids=search_arguments.start_buffer(
            initial_ids, max_output_length, padding_id),  # (B, T + 1)
        log_probs=tf.zeros([batch_size], tf.float32),  # (B,)
        finished=tf.zeros([batch_size], tf.bool),  # (B,)
        cache=initial_cache,
    )

    def condition(state):
        running = state.step < max_output_length
        if ignore_eos:
            return running
        return tf.logical_and(running, tf.logical_not(tf.reduce_all(state.finished)))

    def body(state):
        logits, cache = symbols_to_logits_fn(state.ids, state.step, state.cache)
        cache = search_arguments.same_shapes(cache, state.cache)
        log_probs = _log_probs(logits, vocab_size=None)  # (B, V)
        log_probs = beam_candidates.with_repeats_blocked(
            lambda mask: log_probs if mask is None else log_probs + mask,
            state.ids, state.step, log_probs.shape[-1], no_repeat_ngram_size, word_starts,
            stutters)
        if not (allow_empty or ignore_eos):
            is_eos = tf.range(tf.shape(log_probs)[-1]) == eos_id  # (V,)
            log_probs = tf.where(tf.logical_and(state.step == 0, is_eos), float("-inf"),
                                 log_probs)  # the best other token comes first
        tokens = tf.argmax(log_probs, axis=-1, output_type=tf.int32)  # (B,)
        token_log_probs = tf.gather(log_probs, tokens, batch_dims=1)  # (B,)

        # A finished sequence gets padding and keeps its log probability.
        tokens = tf.where(state.finished, padding_id, tokens)  # (B,)
        token_log_probs = tf.where(state.finished, 0.0, token_log_probs)  # (B,)

        length = state.step + 1  # of every live sequence after this step
        ids = tf.where(columns == length, tokens[:, tf.newaxis], state.ids)  # (B, T + 1)
        finished = tf.logical_or(state.finished, length >= max_output_lengths)  # (B,)
        if not ignore_eos:
            finished = tf.logical_or(finished, tf.equal(tokens, eos_id))
        return (state._replace(step=length, ids=ids, log_probs=state.log_probs + token_log_probs,
                               finished=finished, cache=cache),)

    (state,) = tf.while_loop(
        condition,
        body,
        loop_vars=(state,),
        shape_invariants=(search_arguments.shape_invariants(state),),
    )
    return state.ids[:, 1:], state.log_probs  # (B, T), (B,)


def beam_search(
    symbols_to_logits_fn,
    initial_ids,
    initial_cache,
    *,
    vocab_size,
    max_output_length,
    eos_id,
    beam_size=PAPER_BEAM_SIZE,
    alpha=PAPER_ALPHA,
    max_output_lengths=None,
    padding_id=0,
    no_repeat_ngram_size=0,
    block_adjacent_repeats=None,
    block_stutters=None,
    ignore_eos=False,
    allow_empty=False,
    reorder_cache=None,
    select_examples=None,
):
    """Beam search with the GNMT length penalty, returning the n-best list.

    Every step extends the K live ("alive") hypotheses of each example by every
    token and keeps the C = 2K most probable extensions. Among them, those
    ending in the end-of-sequence token that rank in the top K (where a beam of
    width K would have held them) are finished and compete, scored
    log P / lp(|Y|), with the finished hypotheses kept so far; the best K
    extensions that do not end there stay alive. With 2K candidates at least K
    of them are alive, since at most K end in the end-of-sequence token (one per
    beam). At its example's length limit every extension is finished. Taking
    finished hypotheses only from the top K makes `beam_size=1` with `alpha=0`
    exactly greedy search.

    The loop stops as soon as, for every example, no live hypothesis can still
    beat the worst of its K finished ones: a live hypothesis's log probability
    can only fall, so its best possible score is its log probability divided by
    the largest length penalty it can still get (at its example's length limit
    when alpha >= 0). This is the stopping rule of tf-models'
    `SequenceBeamSearch`, with the limit taken per example.

    Args:
        symbols_to_logits_fn: `(ids, step, cache) -> (logits, cache)`, see the
            module docstring; here `ids` is `(B * K, T + 1)`.
        initial_ids: int tensor `(B,)`, the start token of every example.
        initial_cache: nested structure of tensors with leading dimension B
            (`{}` when there is none); tiled to `B * K` rows, batch-major.
            With `reorder_cache`, the state of all `B * K` rows as the step
            function keeps it, used as given.
        vocab_size: int V, the last dimension of the logits.
        max_output_length: int T, the most tokens a hypothesis may have, end-of-sequence
            token included. It fixes the size of the output, so it must be a
            Python int (or a constant tensor) for XLA.
        eos_id: int, the end-of-sequence id.
        beam_size: int K (4 in the paper), also the size of the n-best list.
        alpha: float, the length penalty strength (0.6 in the paper).
        max_output_lengths: optional int tensor `(B,)`, a limit per example (the paper
            uses source length + 50), clipped to `[1, max_output_length]`.
        padding_id: int written after the end of every hypothesis.
        no_repeat_ngram_size: int n (or an int32 scalar tensor, a request's
            setting); when > 0, no hypothesis is extended by a token that would
            repeat one of its n-grams (of generated tokens;
            `beam_candidates.repeated_ngrams`): the remedy of CTranslate2
            and fairseq for a weak model's loops. 0 (the paper): none blocked.
        block_adjacent_repeats: None (the paper: none blocked), or bool `(V,)`,
            which tokens start a word: then no hypothesis is extended by a
            token that repeats, right after itself, a run of 1 to 8 of its
            tokens that starts a word ("panes panes", "fuera de fuera de";
            `beam_candidates.adjacent_repeats`).
        block_stutters: None (the paper), or bool `(V,)`, the pieces inside a
            word that no hypothesis takes a third time in a row
            ("Jerusalenenen"; `beam_candidates.stuttered_pieces`).
        ignore_eos: if True, the end-of-sequence token does not finish a
            hypothesis and the loop runs exactly `max_output_length` steps (no early
            stop): for benchmarks with random weights.
        allow_empty: whether the end-of-sequence token may come first, giving
            an empty output. False (fairseq's and CTranslate2's minimum length
            of 1): it is left out at the first step and the other tokens keep
            their probabilities, so a weak model that ranks it first for a
            short source still says something.
        reorder_cache: optional `(cache, parents) -> cache`, called after every
            step instead of the gather; `parents` is int32 `(B, K)`, the beam
            each surviving hypothesis extends (e.g. `Transformer.reorder_cache`).
        select_examples: optional `(cache, examples) -> cache`, the cache (as
            the step function keeps it) of the examples `examples`, int32
            `(B',)` indices into the batch of the step (e.g.
            `Transformer.select_examples`). With it, an example leaves the batch
            once its n-best list is final, and the steps after it run on the
            others only, as CTranslate2's do; examples leave together, when a
            quarter of those in the batch are done, so that the cache is copied
            a few times only. Not under XLA, whose shapes cannot change.

    Returns:
        ids: int32 `(B, K, T)`, the K best hypotheses of every example, best
            first, without the start token, the end-of-sequence token included
            and `padding_id` after it.
        scores: float32 `(B, K)`, log P / lp(|Y|), sorted in decreasing order.
            When an example has fewer than K distinct hypotheses (tiny
            vocabulary or limit), the missing rows have score -inf and only
            `padding_id`.
    """
    beam_size = positive_int("beam_size", beam_size, "beam_search")
    vocab_size = positive_int("vocab_size", vocab_size, "beam_search")
    max_output_length = search_arguments.static_max_output_length(max_output_length)
    no_repeat_ngram_size = search_arguments.ngram_size(no_repeat_ngram_size)
    initial_ids = search_arguments.check_initial_ids(initial_ids)
    batch_size = search_arguments.dim(initial_ids, 0)
    max_output_lengths = search_arguments.resolve_max_output_lengths(
        max_output_lengths, batch_size, max_output_length)
    initial_cache = {} if initial_cache is None else initial_cache
    num_candidates = min(2 * beam_size, beam_size * vocab_size)
    search = beam_steps.BeamSettings(
        vocab_size=vocab_size, beam_size=beam_size, num_candidates=num_candidates,
        block_size=beam_candidates.block_size(vocab_size, num_candidates),
        max_output_length=max_output_length, columns=tf.range(max_output_length + 1),
        eos_id=eos_id, alpha=alpha, no_repeat_ngram_size=no_repeat_ngram_size,
        word_starts=_optional_bools(block_adjacent_repeats),
        stutters=_optional_bools(block_stutters),
        ignore_eos=ignore_eos, allow_empty=allow_empty, reorder_cache=reorder_cache)
    state = beam_steps.initial_state(search, initial_ids, initial_cache, max_output_lengths,
                                     padding_id)
    # Finished examples leave the batch: a wrapper around the search's step.
    leaves = select_examples is not None and not ignore_eos

    def condition(state):
        running = state.step < max_output_length
        if ignore_eos:
            return running
        return tf.logical_and(running, tf.reduce_any(beam_steps.can_improve(state, alpha)))

    def body(state):
        state = beam_steps.extend(search, symbols_to_logits_fn, state)
        return (beam_steps.leave_batch(state, alpha, select_examples) if leaves else state,)

    (state,) = tf.while_loop(
        condition,
        body,
        loop_vars=(state,),
        shape_invariants=(search_arguments.shape_invariants(state, any_batch=leaves),),
    )
    return beam_steps.n_best(state, padding_id)


class _GreedyState(
    collections.namedtuple("_GreedyState", ["step", "ids", "log_probs", "finished", "cache"])
):
    """Loop state of greedy search.

    step: int32 scalar, the last written column of `ids`.
    ids: int32 (B, T + 1), start token, decoded tokens, padding.
    log_probs: float32 (B,), log probability of each sequence so far.
    finished: bool (B,), True once a sequence has ended or reached its limit.
    cache: the step function's cache, leading dimension B.
    """

    __slots__ = ()


def _optional_bools(values):
    """None, or `values` as a bool tensor (a blocking argument's mask)."""
    return None if values is None else tf.convert_to_tensor(values, tf.bool)


def _log_probs(logits, vocab_size):
    """Float32 log-softmax of `(N, V)` logits, checking V when it is known."""
    search_arguments.check_logits(logits, vocab_size)
    return tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
