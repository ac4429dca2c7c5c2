"""The beam's candidates each step: the best one-token extensions of the live
hypotheses, chosen without sorting the whole `(B, K * V)` table (see
`best_extensions`), and the tokens that would repeat an n-gram
(`repeated_ngrams`), a run of words right after itself
(`adjacent_repeats`) or a piece inside a word a third time
(`stuttered_pieces`), masked in one scatter (`blocked_mask`). `decoding`'s
searches call them; pure TensorFlow.
"""

import numpy as np
import tensorflow as tf


def block_size(vocab_size, num_candidates):
    """A block length near 128 that divides V into at least `num_candidates`
    blocks, for `best_extensions`; None when there is none (then it sorts
    the whole table)."""
    sizes = sorted(range(32, 257), key=lambda size: abs(size - 128))
    return next((size for size in sizes
                 if vocab_size % size == 0 and vocab_size // size >= num_candidates), None)


def repeated_ngrams(ids, step, size):
    """The next tokens that would repeat an n-gram of `size` tokens: `(tokens
    (N, T + 1), blocked (N, T + 1))` for `blocked_mask`.

    The next token completes the n-gram whose other `size - 1` tokens end the
    hypothesis; it is blocked when those tokens came before, followed by it
    (CTranslate2's `no_repeat_ngram_size`, fairseq's `--no-repeat-ngram-size`).
    Only generated tokens count (columns `1..step`), not the start token. One
    comparison of the buffer per token of the n-gram, and one scatter in
    `blocked_mask`: no `(N, T, V)` table, and static shapes for XLA.

    Args:
        ids: int32 `(N, T + 1)`, the hypotheses' id buffers (start token,
            `step` generated tokens, padding).
        step: int32 scalar, the last written column.
        size: int or int32 scalar >= 1, the n-gram length (1 blocks every
            token already generated).
    """
    width = tf.shape(ids)[1]
    columns = tf.range(width)  # (T + 1,)
    # Column p ends an earlier copy of the n-gram's first size - 1 tokens
    # when ids[p - i] == ids[step - i] for i < size - 1; that copy starts at
    # column p - size + 2 >= 1 and is followed by ids[p + 1], p + 1 <= step.
    ends = tf.broadcast_to(tf.logical_and(columns >= size - 1, columns < step),
                           tf.shape(ids))  # (N, T + 1)

    def compare(offset, ends):
        back = tf.gather(ids, tf.maximum(columns - offset, 0), axis=1)  # ids[:, p - offset]
        last = tf.gather(ids, tf.maximum(step - offset, 0), axis=1)  # (N,)
        return offset + 1, tf.logical_and(ends, tf.equal(back, last[:, tf.newaxis]))

    _, ends = tf.while_loop(lambda offset, _: offset < size - 1, compare,
                            (tf.constant(0), ends))
    followers = tf.gather(ids, tf.minimum(columns + 1, width - 1), axis=1)  # ids[:, p + 1]
    return followers, ends


def blocked_mask(vocab_size, *blocked):
    """The mask `(N, V)` float32 to add to log probabilities of the tokens that
    `blocked` pairs `(tokens (N, n), blocked (N, n))` block
    (`repeated_ngrams`, `adjacent_repeats`, `stuttered_pieces`): -inf for
    those, 0 for the others, in one scatter."""
    rows = tf.shape(blocked[0][0])[0]
    indices, updates = [], []
    for tokens, blocks in blocked:
        row = tf.broadcast_to(tf.range(rows)[:, tf.newaxis], tf.shape(tokens))
        indices.append(tf.stack([tf.reshape(row, [-1]), tf.reshape(tokens, [-1])], axis=1))
        # min with +inf leaves an entry as it is, with -inf blocks it.
        updates.append(tf.where(tf.reshape(blocks, [-1]), float("-inf"), float("inf")))
    return tf.tensor_scatter_nd_min(tf.zeros([rows, vocab_size]), tf.concat(indices, 0),
                                    tf.concat(updates, 0))  # (N, V)


# The longest run of pieces `adjacent_repeats` looks back for: 8 pieces, a
# few words (the n-gram mask blocks longer repeats wherever they come).
ADJACENT_REPEAT_PIECES = 8


def adjacent_repeats(ids, step, word_starts, longest=ADJACENT_REPEAT_PIECES):
    """The next tokens that would repeat, right after itself, a run of 1 to
    `longest` tokens that starts a word: `(tokens (N, longest), blocked (N,
    longest))` for `blocked_mask`.

    A briefly trained model stammers: "panes panes panes", "fuera de fuera de",
    "la ley de la ley de"; a translation of the bundled corpus's test pairs
    has such a run in 7 to 15% of them, their references in none. The next
    token (column `step + 1`) completes a second copy of the m tokens before it
    when `ids[step + 1 - m]` is that token, the m - 1 tokens before it match
    the m - 1 before those, and the first copy (from column `step + 2 - 2m`,
    at least 1: generated tokens only) starts a word. Runs inside a word
    ("Ra-me-ses-es") are not blocked: a name may repeat a piece.

    Args:
        ids: int32 `(N, T + 1)`, the hypotheses' id buffers (start token,
            `step` generated tokens, padding).
        step: int32 scalar, the last written column.
        word_starts: bool `(V,)`, which tokens start a word (the tokenizer's
            pieces that begin with "▁").
        longest: int, the longest run looked for.
    """
    width = tf.shape(ids)[1]
    # The last 2 * longest - 1 columns, up to `step`: window position j is column
    # step - 2 * longest + 2 + j (clipped into the buffer; such runs are not valid).
    size = 2 * longest - 1
    window = tf.gather(ids, tf.clip_by_value(step - size + 1 + tf.range(size), 0, width - 1),
                       axis=1)  # (N, 2L - 1)
    # Run of m: its first copy from position 2L - 2m, its second from 2L - m (the
    # token to come last); the pairs of their first m - 1 tokens, compared at once.
    spans = np.arange(1, longest + 1)
    pairs = [(2 * longest - m + i, 2 * longest - 2 * m + i, m - 1)
             for m in spans for i in range(m - 1)]
    later, earlier, owner = (list(column) for column in zip(*pairs))
    differ = tf.cast(tf.not_equal(tf.gather(window, later, axis=1),
                                  tf.gather(window, earlier, axis=1)), tf.float32)  # (N, P)
    owners = np.eye(longest, dtype=np.float32)[owner]  # (P, L): the run each pair is of
    same = tf.equal(tf.linalg.matmul(differ, owners), 0.0)  # (N, L)
    starts = tf.gather(word_starts, tf.gather(window, 2 * longest - 2 * spans, axis=1))
    written = tf.constant(2 * spans, tf.int32) <= step + 1  # (L,): only generated tokens
    blocked = tf.logical_and(tf.logical_and(same, starts), written)  # (N, L)
    tokens = tf.gather(window, 2 * longest - spans - 1, axis=1)  # (N, L): ids[step + 1 - m]
    return tokens, blocked


# A piece inside a word is not taken a third time in a row: "Jerusalenenen".
STUTTER_COPIES = 3


def stuttered_pieces(ids, step, stutters, copies=STUTTER_COPIES):
    """The next tokens that would make a piece inside a word come `copies`
    times in a row: `(tokens (N, 1), blocked (N, 1))` for `blocked_mask`.

    A briefly trained model stutters inside a word too: "Jeru-sa-len-en-en",
    "her-es-es-es", which `adjacent_repeats` leaves alone (a run that does not
    start a word may be a name's). The next token (column `step + 1`) is
    blocked when it is the last token, the `copies - 2` tokens before that
    are it too, all of them generated (columns >= 1), and it is one of
    `stutters`: the pieces of letters only, no "▁" (names repeat a piece
    twice, "Ra-me-ses-es", rarely three times).

    Args:
        ids: int32 `(N, T + 1)`, the hypotheses' id buffers (start token,
            `step` generated tokens, padding).
        step: int32 scalar, the last written column.
        stutters: bool `(V,)`, which tokens may not come `copies` times in a row.
        copies: int >= 2, how many in a row are blocked.
    """
    width = tf.shape(ids)[1]
    back = tf.gather(ids, tf.clip_by_value(step - tf.range(copies - 1), 0, width - 1),
                     axis=1)  # (N, copies - 1): ids[step], ids[step - 1], ...
    last = back[:, :1]  # (N, 1)
    same = tf.reduce_all(tf.equal(back, last), axis=1, keepdims=True)  # (N, 1)
    written = step - copies + 2 >= 1  # the copies so far are generated tokens
    return last, tf.logical_and(tf.logical_and(same, written), tf.gather(stutters, last))


def if_blocking(size, blocking, plain):
    """`blocking()` when n-grams of `size` are blocked (size > 0), else
    `plain()`: in Python for an int, with `tf.cond` for a tensor (a request's
    setting), so that a search that blocks nothing does none of the work."""
    if isinstance(size, int):
        return blocking() if size > 0 else plain()
    return tf.cond(size > 0, blocking, plain)


def with_repeats_blocked(use_mask, ids, step, vocab_size, size, word_starts, stutters=None):
    """`use_mask(mask)` with the mask `(N, V)` of the tokens that would repeat
    an n-gram of `size` (when > 0), a run of words right after itself (when
    `word_starts` is given) or a piece inside a word a third time in a row
    (when `stutters` is given), in one scatter; `use_mask(None)` when none
    blocks. `size` may be a request's tensor (`if_blocking`)."""
    # The tokens that would repeat a run of words right after itself, or
    # stutter, if blocked.
    adjacent = [] if word_starts is None else [adjacent_repeats(ids, step, word_starts)]
    if stutters is not None:
        adjacent.append(stuttered_pieces(ids, step, stutters))

    def blocking():  # and those that would repeat an n-gram
        return use_mask(blocked_mask(vocab_size, repeated_ngrams(ids, step, size), *adjacent))

    def plain():
        return use_mask(blocked_mask(vocab_size, *adjacent) if adjacent else None)

    return if_blocking(size, blocking, plain)


def best_extensions(logits, alive_log_probs, k, block_size, mask=None):
    """The k best one-token extensions of the live hypotheses of each example.

    Exactly `tf.nn.top_k` over the `(B, K * V)` table
    `alive_log_probs + log_softmax(logits)` (ties go to the lower index), but
    without writing that table, and selecting in two small passes: the best k
    blocks of `block_size` tokens by their maxima, then the best k entries of
    those blocks, in index order. The best k entries lie in those blocks: a
    block left out has k blocks ranked before it, each with an entry that
    ranks before every entry of its own. On a CPU the full `top_k` over the
    K * V entries of a row dominates a beam-search step's selection
    (`benchmarks/decode_throughput.py` measures the search).

    Args:
        logits: float32 `(B * K, V)`.
        alive_log_probs: float32 `(B, K)`, -inf for beams without a hypothesis.
        k: how many extensions to keep.
        block_size: a divisor of V with V / block_size >= k, or None to run
            `top_k` over the whole table.
        mask: optional float32 `(B * K, V)`, -inf for tokens no hypothesis
            may take (`blocked_mask`), added after the log-softmax:
            the other tokens keep their probabilities, as in CTranslate2 and
            fairseq.

    Returns:
        values `(B, k)`: log P(hypothesis + token), best first; indices
        `(B, k)`: `beam * V + token`.
    """
    beam_size = alive_log_probs.shape[1]
    vocab_size = logits.shape[-1]
    if block_size is None:
        # log P(hypothesis + token) = logit + shift: log P(hypothesis) - log Z.
        shift = alive_log_probs - tf.reshape(tf.reduce_logsumexp(logits, axis=-1), [-1, beam_size])
        if mask is not None:
            logits = logits + mask
        table = tf.reshape(logits, [-1, beam_size, vocab_size]) + shift[:, :, tf.newaxis]
        return tf.nn.top_k(tf.reshape(table, [-1, beam_size * vocab_size]), k=k)
    blocks_per_beam = vocab_size // block_size
    row_blocks = tf.reshape(logits, [-1, blocks_per_beam, block_size])  # (B * K, V/b, b)
    row_block_maxima = tf.reduce_max(row_blocks, axis=-1)  # (B * K, V/b)
    shift = alive_log_probs - tf.reshape(
        _log_normalizers(logits, row_blocks, row_block_maxima), [-1, beam_size])  # (B, K)
    if mask is not None:
        logits = logits + mask
        row_block_maxima = tf.reduce_max(
            tf.reshape(logits, [-1, blocks_per_beam, block_size]), axis=-1)  # (B * K, V/b)
    blocks = tf.reshape(logits, [-1, beam_size * blocks_per_beam, block_size])  # (B, K*V/b, b)
    block_maxima = (tf.reshape(row_block_maxima, [-1, beam_size * blocks_per_beam])
                    + tf.repeat(shift, blocks_per_beam, axis=1))
    _, best_blocks = tf.nn.top_k(block_maxima, k=k)  # (B, k)
    best_blocks = tf.sort(best_blocks, axis=-1)  # index order, for ties
    candidates = tf.gather(blocks, best_blocks, batch_dims=1) + tf.gather(
        shift, best_blocks // blocks_per_beam, batch_dims=1)[:, :, tf.newaxis]  # (B, k, b)
    values, positions = tf.nn.top_k(tf.reshape(candidates, [-1, k * block_size]), k=k)
    block_index = tf.gather(best_blocks, positions // block_size, batch_dims=1)  # (B, k)
    return values, block_index * block_size + positions % block_size


def _log_normalizers(logits, blocks, block_maxima):
    """log Z = log sum exp(logits) of each row of `logits` `(N, V)`, given its
    `blocks` `(N, V/b, b)` and their maxima `(N, V/b)`.

    Z = exp(m) / softmax(logits)[argmax], m the largest logit: its probability
    is at least 1/V, so its log never underflows (that of another entry may),
    and the error is softmax's, about 1e-7. One softmax (oneDNN's, when it is
    on) and two small argmaxes over the maxima and the best block instead of
    `reduce_logsumexp`'s four passes over the logits, which is faster on a CPU
    (`benchmarks/decode_throughput.py`).
    """
    block_size = blocks.shape[-1]
    best_block = tf.argmax(block_maxima, axis=-1, output_type=tf.int32)  # (N,)
    within = tf.argmax(tf.gather(blocks, best_block, batch_dims=1), axis=-1,
                       output_type=tf.int32)  # (N,)
    largest = tf.gather(block_maxima, best_block, batch_dims=1)  # (N,)
    probability = tf.gather(tf.nn.softmax(logits), best_block * block_size + within,
                            batch_dims=1)  # (N,)
    return largest - tf.math.log(probability)
