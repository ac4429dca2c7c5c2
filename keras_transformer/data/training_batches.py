"""Endless training batches over a corpus tokenized once, that can start at any step.

A run of the paper's length (100k steps) is preempted and resumed. A stream that
must be read from its start to reach step s (`make_batches(...).repeat().skip(s)`)
tokenizes every pair the run has already seen: hours at that scale. Here the
corpus is tokenized once and kept in memory, and every epoch is planned from
`(seed, epoch)` alone:

1. the kept pairs are shuffled with a permutation seeded by `(seed, epoch)`;
2. each pair goes to its length bucket (as in `make_batches`), and each bucket's
   pairs are cut, in that shuffled order, into full batches of the bucket's size;
   the last, partial batch of each bucket sits this epoch out (the next epoch
   reshuffles, so it is not always the same pairs: a few percent of the bundled
   corpus an epoch);
3. the epoch's batches are shuffled.

So every epoch has the same number of batches, `batches_per_epoch` (the sum over
buckets of pairs // batch size), batch s of the run is batch s % B of epoch s // B,
and `dataset(start_step)` plans one epoch to start there: resuming at step 100000
costs what resuming at step 10 does, and gives exactly the batches the run would
have read without stopping. No batch has filler rows.

Each epoch may also draw, from `(seed, epoch)` too, a share of the pairs that lose
the punctuation ending both their sides (`unpunctuated_share`): a corpus whose
every line ends in punctuation, as the bundled Bible's, otherwise teaches the model
to end a translation only after one, and an input without it ("Jesus wept") runs
on in loops to the length limit.

A share of the pairs may also add their clauses as pairs of their own
(`clause_share`), drawn once from the seed: a corpus of long sentences, as the
bundled Bible's verses, otherwise never shows the model a short input, and one
("The Lord is my shepherd") runs on in loops too. A pair splits where both its
sides split into as many clauses (after `CLAUSE_END`) and each clause's share of
its side's characters is within a factor `CLAUSE_SHARE_RATIO` of the other
side's: "Jesus said to them, “Come after me, and I will make you into fishers
for men.”" and "Y les dijo Jesús: Venid en pos de mí, y haré que seáis
pescadores de hombres." give three clause pairs, "Jesus said to them," and "Y
les dijo Jesús:" the first.
"""

import unicodedata

import numpy as np
import tensorflow as tf

from keras_transformer.config import PAPER_MAX_SENTENCE_TOKENS
from keras_transformer.config import PAPER_TOKENS_PER_BATCH
from keras_transformer.data.batching import CHUNK_SIZE
from keras_transformer.data.batching import bucket_lengths
from keras_transformer.data.batching import fit_bucket_lengths
from keras_transformer.data.batching import pad_batch
from keras_transformer.data.batching import validate
from keras_transformer.data.batching import without_autotuning
from keras_transformer.token_ids import EOS_ID

# Where a side splits into clauses: after , ; : and a space, or after their
# full-width forms (Chinese and Japanese put no space after them).
CLAUSE_END = r"([,;:])\s+|([，；：])\s*"
# A pair's clauses align where each one's share of its side's characters is
# within this factor of the other side's (any language pair: a share, not a length).
CLAUSE_SHARE_RATIO = 1.6


class TrainingBatches:
    """Token-budget training batches, epoch after epoch, from any step.

    Build it outside `strategy.scope()`: it keeps the tokenized corpus in
    variables on the host's CPU.

    Args:
        pairs: `tf.data.Dataset` of `{"source": tf.string, "target": tf.string}`,
            read once.
        tokenizer: a `SubwordTokenizer`.
        tokens_per_batch: the token budget of one batch per replica, for source
            and target each, padding included (paper: 25000).
        max_sentence_tokens: the longest sequence kept; longer pairs are dropped
            and counted in `pairs_too_long`.
        seed: int, the seed of every epoch's shuffles.
        num_replicas: `strategy.num_replicas_in_sync`; a batch holds num_replicas x
            (tokens_per_batch // L) pairs.
        bucket_boundaries: the buckets' padded lengths; when None, the
            `num_buckets` lengths that pad this corpus least
            (`fit_bucket_lengths`), or with no `num_buckets` the fine buckets
            `bucket_lengths(max_sentence_tokens)`.
        num_buckets: see `bucket_boundaries`: on an accelerator, where XLA
            compiles the training step once per batch shape, a few (8).
        unpunctuated_share: the share of pairs, drawn afresh each epoch, whose
            trailing punctuation pieces are dropped from both sides, where both
            end in some and keep a word. 0: every pair as it is.
        clause_share: the share of pairs, drawn once from the seed, that add their
            aligned clauses (see the module's docstring) to the corpus as pairs
            of their own, beside the whole pair. 0: none.

    Attributes:
        pairs: int, the pairs kept (the clause pairs among them).
        clause_pairs: int, the clause pairs added, before the length limit.
        pairs_too_long: int, the pairs dropped for their length.
        punctuated: int, the kept pairs whose both sides end in punctuation: the
            ones that `unpunctuated_share` draws from.
        batches_per_epoch: int.
        bucket_boundaries: the buckets' padded lengths (list of ints).
        shapes: the `(rows, source length, target length)` of the batches
            `dataset` yields, one per bucket that fills a batch: the training
            step's shapes, each an XLA compilation.
        padding: `{"source": fraction, "target": fraction}`, the share of an
            epoch's batch tokens that are padding (the target counts its EOS).

    Example:
    ```python
    batches = TrainingBatches(pairs, tokenizer, 25000, 256, seed=1)
    model.fit(batches.dataset(), steps_per_epoch=1000, epochs=100, shuffle=False)
    # resumed at step 40000, after restoring the checkpoint:
    model.fit(batches.dataset(40000), steps_per_epoch=1000, initial_epoch=40, epochs=100,
              shuffle=False)
    ```
    """

    def __init__(self, pairs, tokenizer, tokens_per_batch=PAPER_TOKENS_PER_BATCH,
                 max_sentence_tokens=PAPER_MAX_SENTENCE_TOKENS, *,
                 seed, num_replicas=1, bucket_boundaries=None, num_buckets=None,
                 unpunctuated_share=0.0, clause_share=0.0):
        if max_sentence_tokens < 1:
            raise ValueError("max_sentence_tokens must be positive. "
                             f"Received: max_sentence_tokens={max_sentence_tokens}")
        if not 0 <= unpunctuated_share <= 1:
            raise ValueError("unpunctuated_share must be between 0 and 1. "
                             f"Received: unpunctuated_share={unpunctuated_share}")
        if not 0 <= clause_share <= 1:
            raise ValueError("clause_share must be between 0 and 1. "
                             f"Received: clause_share={clause_share}")
        self.seed = int(seed)
        self.unpunctuated_share = float(unpunctuated_share)
        self.clause_share = float(clause_share)
        source, target, self.clause_pairs = _tokenize(pairs, tokenizer, self.clause_share,
                                                      self.seed)
        trims = _final_punctuation(source, target, _punctuation_ids(tokenizer))
        source_lengths, target_lengths = np.diff(source[1]), np.diff(target[1])
        # The decoder reads BOS + target and predicts target + EOS: one token more.
        length = np.maximum(source_lengths, target_lengths + 1)
        keep = length <= max_sentence_tokens
        self.pairs_too_long = int((~keep).sum())
        self.pairs = int(keep.sum())
        self.punctuated = int((trims[0][keep] > 0).sum())
        if bucket_boundaries is None and num_buckets and self.pairs:
            bucket_boundaries = fit_bucket_lengths(length[keep], num_buckets,
                                                   max_sentence_tokens)
        boundaries = [int(length) for length in
                      bucket_boundaries or bucket_lengths(max_sentence_tokens)]
        validate(tokens_per_batch, max_sentence_tokens, num_replicas, boundaries,
                 shuffle=True, seed=seed, deterministic=True, shuffle_buffer_size=1)
        self.bucket_boundaries = boundaries
        bucket = np.searchsorted(boundaries, length[keep], side="left")
        sizes = np.array([num_replicas * (tokens_per_batch // size) for size in boundaries])
        counts = np.bincount(bucket, minlength=len(boundaries))
        self.batches_per_epoch = int((counts // sizes).sum())
        self.shapes = [(int(size), boundary, boundary) for size, boundary, count
                       in zip(sizes, boundaries, counts) if count >= size]
        # Every pair of a full batch is padded to its bucket's length (the partial
        # batches that sit an epoch out are too few to count).
        padded = np.asarray(boundaries)[bucket].sum()
        self.padding = {side: round(1 - float(real[keep].sum()) / max(float(padded), 1), 4)
                        for side, real in (("source", source_lengths),
                                           ("target", target_lengths + 1))}
        if not self.batches_per_epoch:
            raise ValueError(
                f"The training corpus fills no batch: its {self.pairs} pairs (of at most "
                f"{max_sentence_tokens} tokens) spread over {len(boundaries)} length buckets, "
                f"each short of a batch of tokens_per_batch={tokens_per_batch} x num_replicas="
                f"{num_replicas} tokens. Give a smaller tokens_per_batch or more data.")
        with tf.device("/CPU:0"):
            variables = dict(
                source_values=_kept_values(*source, keep), source_lengths=source_lengths[keep],
                target_values=_kept_values(*target, keep), target_lengths=target_lengths[keep],
                source_trim=trims[0][keep], target_trim=trims[1][keep],
                bucket=bucket.astype(np.int32))
            self._corpus = {name: tf.Variable(value, trainable=False, name=name)
                            for name, value in variables.items()}
        self._lengths = tf.constant(boundaries, tf.int64)
        self._sizes = tf.constant(sizes, tf.int64)
        self._counts = tf.constant(counts, tf.int64)

    def dataset(self, start_step=0, accumulate_steps=1):
        """The batches from step `start_step` on, endless: `(inputs, targets)` as
        `make_batches` gives them, every batch full.

        With `accumulate_steps` N > 1 a step is N batches (for an optimizer that
        makes one update from N, `AccumulatingAdam`): the stream starts at batch
        N x `start_step`, and each batch comes as `(inputs, targets, weights)`,
        where `weights` (B, L) is N x (its target tokens) / (its group's target
        tokens): `LabelSmoothedCrossEntropy` then averages the group's loss over
        the group's tokens, as one step on the N batches together would.
        """
        if accumulate_steps < 1:
            raise ValueError(
                f"accumulate_steps must be >= 1. Received: accumulate_steps={accumulate_steps}")
        start_epoch, offset = divmod(int(start_step) * accumulate_steps, self.batches_per_epoch)

        def batches_of(epoch):
            skip = tf.where(epoch == start_epoch, tf.constant(offset, tf.int64), 0)
            return self.epoch(epoch).skip(skip)

        dataset = tf.data.Dataset.range(start_epoch, np.iinfo(np.int64).max).flat_map(batches_of)
        if accumulate_steps > 1:
            dataset = dataset.window(accumulate_steps, drop_remainder=True).flat_map(
                lambda inputs, targets: _weigh_group(inputs, targets, accumulate_steps))
        dataset = without_autotuning(dataset, prefetch=2)
        options = tf.data.Options()
        options.deterministic = True
        # Every worker of a multi-worker run plans the same batches and keeps its
        # replicas' share of each.
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA)
        return dataset.with_options(options)

    def example_batch(self, shape, accumulate_steps=1):
        """A batch of `shape`, one of `shapes`, as `dataset(accumulate_steps=...)`
        gives them, every token EOS: for compiling the training step for that shape
        before the run (`training.compile_ahead`)."""
        rows, source_length, target_length = shape
        inputs = {"encoder_inputs": tf.fill([rows, source_length], EOS_ID),
                  "decoder_inputs": tf.fill([rows, target_length], EOS_ID)}
        targets = tf.fill([rows, target_length], EOS_ID)
        if accumulate_steps > 1:
            return inputs, targets, tf.ones([rows, target_length])
        return inputs, targets

    def epoch(self, epoch):
        """Epoch `epoch`'s `batches_per_epoch` batches, in order."""
        epoch = tf.cast(epoch, tf.int64)
        bucket = self._corpus["bucket"]
        seed = tf.stack([tf.constant(self.seed, tf.int64), epoch])
        order = tf.argsort(tf.random.stateless_uniform(tf.shape(bucket), seed=seed))
        # Grouped by bucket, in the shuffled order within each.
        order = tf.gather(order, tf.argsort(tf.gather(bucket, order), stable=True))
        sorted_bucket = tf.cast(tf.gather(bucket, order), tf.int64)  # (n,)
        position = tf.range(tf.size(order, out_type=tf.int64)) - tf.gather(
            tf.cumsum(self._counts, exclusive=True), sorted_bucket)  # within the bucket
        size = tf.gather(self._sizes, sorted_bucket)
        full = position < tf.gather(self._counts // self._sizes * self._sizes, sorted_bucket)
        order = tf.boolean_mask(order, full)  # (m,) pair indices, batch after batch
        starts = tf.where(tf.boolean_mask(position % size == 0, full))[:, 0]  # (B,)
        batch_bucket = tf.gather(tf.boolean_mask(sorted_bucket, full), starts)  # (B,)
        batch_seed = tf.stack([tf.constant(self.seed, tf.int64), -1 - epoch])
        permutation = tf.argsort(tf.random.stateless_uniform(tf.shape(starts), seed=batch_seed))
        trims = None
        if self.unpunctuated_share:  # this epoch's unpunctuated pairs
            drawn = tf.random.stateless_uniform(
                tf.shape(bucket), seed=tf.random.experimental.stateless_fold_in(seed, 1))
            trims = {side: tf.where(drawn < self.unpunctuated_share,
                                    self._corpus[f"{side}_trim"], 0)
                     for side in ("source", "target")}

        def rows(side, indices):
            ids = tf.gather(tf.RaggedTensor.from_row_lengths(
                self._corpus[f"{side}_values"], self._corpus[f"{side}_lengths"],
                validate=False), indices)
            if trims is None:
                return ids
            lengths = ids.row_lengths() - tf.cast(tf.gather(trims[side], indices), tf.int64)
            return tf.RaggedTensor.from_tensor(ids.to_tensor(), lengths=lengths)

        def pad(start, bucket):
            indices = order[start:start + self._sizes[bucket]]
            return pad_batch(rows("source", indices), rows("target", indices),
                             self._lengths[bucket], self._sizes[bucket])

        return tf.data.Dataset.from_tensor_slices(
            (tf.gather(starts, permutation), tf.gather(batch_bucket, permutation))
        ).map(pad, num_parallel_calls=tf.data.AUTOTUNE)


def _weigh_group(inputs, targets, size):
    """A window of `size` batches, each with its token weights (see `dataset`)."""
    tokens = targets.map(lambda batch: tf.math.count_nonzero(batch, dtype=tf.int64))
    total = tf.cast(tokens.reduce(tf.constant(0, tf.int64), lambda a, b: a + b), tf.float32)

    def weigh(inputs, targets):
        real = tf.cast(tf.not_equal(targets, 0), tf.float32)
        share = size * tf.reduce_sum(real) / tf.maximum(total, 1.0)
        return inputs, targets, real * share

    return tf.data.Dataset.zip((tf.data.Dataset.zip(inputs), targets)).map(weigh)


def _tokenize(pairs, tokenizer, clause_share=0.0, seed=0):
    """`((values, row_splits), (values, row_splits), clause_pairs)`: the source
    and target ids of every pair, as numpy, each chunk's pairs in order and then
    the clause pairs `clause_share` draws from them; and how many those are."""

    def tokenize(index, chunk):
        source, target = chunk["source"], chunk["target"]
        if clause_share:
            clauses = aligned_clauses(source, target)
            drawn = tf.random.stateless_uniform(
                [clauses.nrows()], seed=tf.stack([tf.constant(seed, tf.int64), index]))
            clauses = tf.ragged.boolean_mask(clauses, drawn < clause_share)
            source = tf.concat([source, clauses.flat_values[:, 0]], axis=0)
            target = tf.concat([target, clauses.flat_values[:, 1]], axis=0)
        added = tf.size(source) - tf.size(chunk["source"])
        return added, tuple(tf.cast(tokenizer.tokenize(side), tf.int32)
                            .with_row_splits_dtype(tf.int64) for side in (source, target))

    chunks = (pairs.batch(CHUNK_SIZE).enumerate()
              .map(tokenize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
              .prefetch(2))
    sides, added = ([], []), 0
    for count, chunk in chunks:
        added += int(count)
        for side, ids in zip(sides, chunk):
            side.append(ids)
    if not sides[0]:
        raise ValueError("The training corpus is empty.")
    return (*((ids.flat_values.numpy(), ids.row_splits.numpy())
              for ids in (tf.concat(side, axis=0) for side in sides)), added)


def aligned_clauses(source, target):
    """The aligned clauses of each pair (see the module's docstring):
    `tf.RaggedTensor` (pairs that split, clauses, 2) of `[source, target]`
    strings, one row per pair of `source` and `target` (1-D `tf.string`) that
    splits into two or more aligned clauses, in order."""

    def split(texts):
        marked = tf.strings.regex_replace(texts, CLAUSE_END, "\\1\\2\x1f")
        return tf.strings.split(marked, "\x1f")

    def shares(clauses):
        chars = tf.cast(tf.strings.length(clauses, unit="UTF8_CHAR"), tf.float32)
        return chars / tf.maximum(tf.reduce_sum(chars, axis=1, keepdims=True), 1.0)

    source, target = split(source), split(target)
    even = (source.row_lengths() > 1) & tf.equal(source.row_lengths(), target.row_lengths())
    source, target = tf.ragged.boolean_mask(source, even), tf.ragged.boolean_mask(target, even)
    ratio = shares(source) / tf.maximum(shares(target), 1e-9)
    aligned = tf.reduce_all((ratio >= 1 / CLAUSE_SHARE_RATIO) & (ratio <= CLAUSE_SHARE_RATIO),
                            axis=1)
    source, target = (tf.ragged.boolean_mask(side, aligned) for side in (source, target))
    return source.with_flat_values(tf.stack([source.flat_values, target.flat_values], axis=1))


def _kept_values(values, row_splits, keep):
    return values[np.repeat(keep, np.diff(row_splits))]


def _punctuation_ids(tokenizer):
    """A boolean array over the vocabulary: True for the pieces that are only
    punctuation (".", "?", ".”", "▁¿") or a word boundary ("▁", as before the
    "?" of "Quoi ?"): the pieces that may end a sentence after its last word."""
    pieces = tokenizer.id_to_token(tf.range(tokenizer.vocab_size)).numpy()
    return np.array([_is_punctuation(piece.decode("utf-8", "replace")) for piece in pieces])


def _is_punctuation(piece):
    text = piece.replace("▁", "")  # sentencepiece's word boundary
    return all(unicodedata.category(char).startswith("P") for char in text) and (
        bool(text) or piece == "▁")


def _final_punctuation(source, target, is_punctuation):
    """`(source_trim, target_trim)`, int32 arrays over the pairs: how many pieces
    of punctuation end each side, where both sides end in some and keep a piece
    that is not; else 0 on both."""
    sides = []
    for values, row_splits in (source, target):
        starts, ends = row_splits[:-1], row_splits[1:]
        # The last piece of each row that is not punctuation (-1: none).
        word = np.where(is_punctuation[values], -1, np.arange(values.size))
        last_word = np.full(starts.size, -1)
        filled = ends > starts
        if filled.any():
            last_word[filled] = np.maximum.reduceat(word, starts[filled])
        sides.append(np.where(last_word >= starts, ends - 1 - last_word, 0))
    both = (sides[0] > 0) & (sides[1] > 0)
    return tuple(np.where(both, side, 0).astype(np.int32) for side in sides)

