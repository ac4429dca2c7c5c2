"""Token-budget batches of sentence pairs, bucketed by length, ready for `model.fit`.

Sec. 5.1: "Sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately 25000
source tokens and 25000 target tokens."

Each pair goes to the bucket of the smallest padded length L that holds both its
source and its target (with BOS or EOS added); a bucket's batches hold
tokens_per_batch // L pairs, so batch x L <= tokens_per_batch on each side. Every
batch is padded to its bucket's L, so a jit-compiled model sees at most one shape
per bucket (two without `static_batch_size`).

How: pairs are shuffled, then tokenized and grouped a chunk of 8192 at a time with
vectorized ops. A `scan` keeps the pairs that do not yet fill a batch of their
bucket and adds them to the next chunk; a last, empty chunk cuts what is left.
tf.data's cost is mostly per function call, so no function runs per pair
(`group_by_window` calls one per pair; benchmarks/input_pipeline.py).
"""

import math

import tensorflow as tf

from keras_transformer.config import PAPER_MAX_SENTENCE_TOKENS
from keras_transformer.config import PAPER_TOKENS_PER_BATCH
from keras_transformer.token_ids import BOS_ID, EOS_ID, PAD_ID

# Pairs tokenized and grouped per step: tf.data's cost is per call, not per pair.
CHUNK_SIZE = 8192


def bucket_lengths(max_sentence_tokens, granularity=8, growth=1.1):
    """Padded lengths of the buckets: multiples of `granularity` that grow by about
    `growth` each, ending with `max_sentence_tokens`.

    Example: `bucket_lengths(64)` is `[8, 16, 24, 32, 40, 48, 56, 64]`;
    `bucket_lengths(256)` has 20 buckets, from 8 to 256.
    """
    if max_sentence_tokens < 1 or granularity < 1 or growth < 1:
        raise ValueError(
            "bucket_lengths needs max_sentence_tokens >= 1, granularity >= 1 and growth >= 1. "
            f"Received: max_sentence_tokens={max_sentence_tokens}, granularity={granularity}, "
            f"growth={growth}"
        )
    lengths = []
    length = granularity
    while length < max_sentence_tokens:
        lengths.append(length)
        length = max(
            length + granularity,
            math.ceil(length * growth / granularity) * granularity,
        )
    lengths.append(max_sentence_tokens)
    return lengths


def fit_bucket_lengths(lengths, num_buckets, max_sentence_tokens, granularity=8):
    """The `num_buckets` padded lengths (multiples of `granularity`, the last one
    holding the longest of `lengths`) that pad `lengths` least, and
    `max_sentence_tokens` after them when the longest is shorter (a bucket that
    holds none of `lengths`, so gives no batch shape).

    Each length goes to the smallest bucket length that holds it, and costs that
    many tokens; the choice minimizing their sum is exact, by dynamic programming
    over the multiples of `granularity` up to the longest length (O(num_buckets
    x M^2) for M multiples). On an accelerator every bucket is one XLA
    compilation of the training step, so a few well-placed buckets beat many.

    Args:
        lengths: int array, each pair's padded length need (the longer of its
            source and its target + 1), all <= max_sentence_tokens.
        num_buckets: the most buckets (fewer when fewer multiples are needed).
        max_sentence_tokens: the longest length allowed; the last bucket.
        granularity: every bucket length is a multiple of it, or max_sentence_tokens.

    Returns:
        A list of increasing ints, ending with max_sentence_tokens.
    """
    import numpy as np

    lengths = np.asarray(lengths, np.int64)
    if num_buckets < 1 or not lengths.size or lengths.max() > max_sentence_tokens:
        raise ValueError(
            "fit_bucket_lengths needs num_buckets >= 1 and lengths that are not empty and "
            f"<= max_sentence_tokens. Received: num_buckets={num_buckets}, "
            f"{lengths.size} lengths, longest {lengths.max() if lengths.size else None}, "
            f"max_sentence_tokens={max_sentence_tokens}")
    longest = min(-(-int(lengths.max()) // granularity) * granularity, max_sentence_tokens)
    candidates = sorted({*range(granularity, longest, granularity), longest})
    # counts[j]: lengths whose smallest candidate is candidates[j].
    counts = np.bincount(np.searchsorted(candidates, lengths, side="left"),
                         minlength=len(candidates))
    prefix = np.concatenate([[0], np.cumsum(counts)])
    m = len(candidates)
    # cost[k][j]: the least tokens for the lengths up to candidates[j] with k + 1
    # buckets, the last at candidates[j]; choice[k][j]: the bucket before it.
    cost = np.full((num_buckets, m), np.inf)
    choice = np.full((num_buckets, m), -1)
    cost[0] = [candidates[j] * prefix[j + 1] for j in range(m)]
    for k in range(1, num_buckets):
        for j in range(m):
            for i in range(j):
                total = cost[k - 1][i] + candidates[j] * (prefix[j + 1] - prefix[i + 1])
                if total < cost[k][j]:
                    cost[k][j], choice[k][j] = total, i
    k = int(np.argmin(cost[:, m - 1]))  # fewer buckets if more do not pad less
    chosen, j = [], m - 1
    while j >= 0:
        chosen.append(candidates[j])
        j, k = choice[k][j], k - 1
    return sorted({*chosen, max_sentence_tokens})


class BatchStats:
    """Counters that `make_batches` updates while its dataset is read.

    The counts cover what the pipeline has read so far (prefetching reads ahead);
    they are exact once the dataset is exhausted, and they add up over epochs.

    Attributes:
        pairs_read: int64 `tf.Variable`, the pairs that entered `make_batches`.
        pairs_too_long: int64 `tf.Variable`, those dropped for exceeding max_sentence_tokens.
    """

    def __init__(self):
        # On the host, beside the input pipeline, whatever accelerators exist.
        with tf.device("/CPU:0"):
            self.pairs_read = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.pairs_too_long = tf.Variable(0, dtype=tf.int64, trainable=False)

    def result(self):
        """`{"pairs_read", "pairs_too_long", "pairs_batched"}` as Python ints."""
        read, too_long = int(self.pairs_read.numpy()), int(self.pairs_too_long.numpy())
        return {"pairs_read": read, "pairs_too_long": too_long, "pairs_batched": read - too_long}

    def reset(self):
        self.pairs_read.assign(0)
        self.pairs_too_long.assign(0)


def make_batches(
    pairs,
    tokenizer,
    tokens_per_batch=PAPER_TOKENS_PER_BATCH,
    max_sentence_tokens=PAPER_MAX_SENTENCE_TOKENS,
    *,
    num_replicas=1,
    shuffle=True,
    seed=None,
    shuffle_buffer_size=100_000,
    deterministic=False,
    bucket_boundaries=None,
    static_batch_size=True,
    stats=None,
):
    """Tokenizes sentence pairs and groups them into token-budget batches.

    Args:
        pairs: `tf.data.Dataset` of `{"source": tf.string, "target": tf.string}`
            (as `load_parallel` returns).
        tokenizer: a `SubwordTokenizer` (anything with `tokenize(strings)` giving
            int32 ragged ids works).
        tokens_per_batch: int, the token budget of one batch per replica, for
            source and for target each, padding included (paper: 25000).
        max_sentence_tokens: int, the longest sequence kept, in tokens; a pair whose source
            has more tokens, or whose target has more with BOS (or EOS) added, is
            dropped and counted in `stats.pairs_too_long`.
        num_replicas: int, the replicas the batches are split across
            (`strategy.num_replicas_in_sync`). The budget is per replica: a batch
            holds num_replicas x (tokens_per_batch // L) pairs, which
            `strategy.experimental_distribute_dataset` splits evenly.
        shuffle: whether to shuffle the pairs before batching, and the batches of
            each chunk (which are otherwise cut bucket by bucket, shortest first).
        seed: int or None, the shuffle seed.
        shuffle_buffer_size: int, pairs held by the shuffle buffer.
        deterministic: bool; True gives the same batches in the same order on every
            run (with shuffle, a seed is required), False lets parallel
            tokenization deliver out of order for speed.
        bucket_boundaries: list of padded lengths, increasing, the last being
            max_sentence_tokens; `bucket_lengths(max_sentence_tokens)` when None.
        static_batch_size: bool; True fills the last, partial batch of each bucket
            with rows of padding (ids 0, no target tokens) so that every batch of a
            bucket has the same shape and a jit-compiled model compiles one
            program per bucket. A loss that masks padding targets ignores them.
        stats: a `BatchStats` to count pairs read and dropped; optional.

    Returns:
        A `tf.data.Dataset` of `(inputs, targets)` where
        `inputs = {"encoder_inputs": (B, L), "decoder_inputs": (B, L)}` and
        `targets` is (B, L), all int32, padded with 0: encoder inputs are the
        source ids (no BOS or EOS), decoder inputs are BOS followed by the target
        ids, targets are the target ids followed by EOS.

    Example:
    ```python
    stats = BatchStats()
    batches = make_batches(pairs, tokenizer, 25000, 256, seed=1, stats=stats)
    model.fit(batches.repeat(), steps_per_epoch=1000, shuffle=False, ...)
    stats.result()  # {"pairs_read": ..., "pairs_too_long": ..., "pairs_batched": ...}
    ```
    """
    if max_sentence_tokens < 1:
        raise ValueError("max_sentence_tokens must be positive. "
                         f"Received: max_sentence_tokens={max_sentence_tokens}")
    if bucket_boundaries is None:
        bucket_boundaries = bucket_lengths(max_sentence_tokens)
    bucket_boundaries = [int(length) for length in bucket_boundaries]
    validate(
        tokens_per_batch, max_sentence_tokens, num_replicas, bucket_boundaries, shuffle, seed,
        deterministic, shuffle_buffer_size,
    )
    # Per bucket: padded length L and global batch size, num_replicas x the pairs
    # of length L that fit one replica's budget.
    lengths = tf.constant(bucket_boundaries, tf.int64)
    batch_sizes = tf.constant(
        [num_replicas * (tokens_per_batch // length) for length in bucket_boundaries],
        tf.int64,
    )
    stats = stats if stats is not None else BatchStats()

    def pad(source, target, bucket):
        num_rows = batch_sizes[bucket] if static_batch_size else source.nrows()
        return pad_batch(source, target, lengths[bucket], num_rows)

    shuffle_seed = tf.constant(0 if seed is None else seed, tf.int64)
    if shuffle and seed is None:
        shuffle_seed = tf.random.uniform([], maxval=2**62, dtype=tf.int64)
    empty = tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int32), tf.zeros([0], tf.int64))
    initial_state = (
        tf.zeros([0], tf.int32), tf.zeros([0], tf.int64),
        tf.zeros([0], tf.int32), tf.zeros([0], tf.int64),
        tf.constant(0, tf.int64),
    )
    dataset = pairs
    if shuffle:
        dataset = dataset.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True)
    # Everything below works on whole chunks or whole batches: tf.data pays for
    # each function call, so none is made per pair.
    dataset = (
        dataset.batch(CHUNK_SIZE)
        .map(lambda chunk: _tokenize(chunk, tokenizer, max_sentence_tokens, stats),
             num_parallel_calls=tf.data.AUTOTUNE)
        # A last, empty chunk flushes the pairs still waiting.
        .concatenate(tf.data.Dataset.from_tensors((empty, empty, tf.constant(True))))
        .scan(initial_state, lambda state, chunk: _group(
            state, chunk, lengths, batch_sizes, shuffle_seed if shuffle else None))
        .unbatch()
        .map(pad, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )
    options = tf.data.Options()
    options.deterministic = deterministic
    # Under MultiWorkerMirroredStrategy every worker runs this pipeline and keeps its
    # replicas' share of each global batch, so the workers together train on the
    # batches one device would (sharding by file would give each its own stream).
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def _tokenize(chunk, tokenizer, max_sentence_tokens, stats):
    """A chunk of pairs as ragged source and target ids `(n, None)`, those too long
    dropped (and counted in `stats`), and False: not the flushing chunk."""
    source = tokenizer.tokenize(chunk["source"])  # (n, None)
    target = tokenizer.tokenize(chunk["target"])  # (n, None)
    source = tf.cast(source, tf.int32).with_row_splits_dtype(tf.int64)
    target = tf.cast(target, tf.int32).with_row_splits_dtype(tf.int64)
    # The decoder sees BOS + target and predicts target + EOS: one more token.
    keep = tf.logical_and(
        source.row_lengths() <= max_sentence_tokens,
        target.row_lengths() + 1 <= max_sentence_tokens,
    )  # (n,)
    num_dropped = tf.reduce_sum(tf.cast(tf.logical_not(keep), tf.int64))
    with tf.control_dependencies([
        stats.pairs_read.assign_add(tf.size(keep, out_type=tf.int64)),
        stats.pairs_too_long.assign_add(num_dropped),
    ]):
        return (
            tf.ragged.boolean_mask(source, keep),
            tf.ragged.boolean_mask(target, keep),
            tf.constant(False),
        )


def _group(state, chunk, lengths, batch_sizes, shuffle_seed):
    """Adds a chunk of pairs to those waiting and cuts every full batch.

    The waiting pairs are the state: a bucket's pairs wait until they fill a
    batch, or until the end of the data (`flush`) cuts the rest as they are.
    `lengths` and `batch_sizes` `(K,)`: each bucket's padded length and batch
    size; with a `shuffle_seed`, the batches leave in an order drawn from it and
    the chunk's number.
    """
    source_values, source_lengths, target_values, target_lengths, step = state
    chunk_source, chunk_target, flush = chunk
    source = tf.concat([
        tf.RaggedTensor.from_row_lengths(source_values, source_lengths), chunk_source,
    ], axis=0)  # (n, None)
    target = tf.concat([
        tf.RaggedTensor.from_row_lengths(target_values, target_lengths), chunk_target,
    ], axis=0)  # (n, None)
    length = tf.maximum(source.row_lengths(), target.row_lengths() + 1)  # (n,)
    # The first bucket whose padded length holds the pair.
    bucket = tf.searchsorted(lengths, length, side="left", out_type=tf.int64)  # (n,)
    # Pairs sorted by bucket, in arrival order within a bucket.
    order = tf.argsort(bucket, stable=True)  # (n,)
    sorted_bucket = tf.gather(bucket, order)  # (n,)
    num_buckets = lengths.shape[0]
    count = tf.math.bincount(
        tf.cast(bucket, tf.int32), minlength=num_buckets, maxlength=num_buckets,
        dtype=tf.int64,
    )  # (K,)
    position = tf.range(tf.size(bucket, out_type=tf.int64)) - tf.gather(
        tf.cumsum(count, exclusive=True), sorted_bucket
    )  # (n,) position of each sorted pair within its bucket
    size = tf.gather(batch_sizes, sorted_bucket)  # (n,)
    in_full_batch = position < tf.gather(count // batch_sizes * batch_sizes, sorted_bucket)
    cut = tf.logical_or(in_full_batch, flush)  # (n,)
    cut_order = tf.boolean_mask(order, cut)  # (m,)
    wait_order = tf.boolean_mask(order, tf.logical_not(cut))
    batch_starts = tf.where(tf.boolean_mask(position % size == 0, cut))[:, 0]  # (b,)
    batches = (
        tf.RaggedTensor.from_row_starts(tf.gather(source, cut_order), batch_starts),
        tf.RaggedTensor.from_row_starts(tf.gather(target, cut_order), batch_starts),
        tf.gather(tf.boolean_mask(sorted_bucket, cut), batch_starts),
    )  # (b, None, None), (b, None, None), (b,)
    if shuffle_seed is not None:
        # Batches leave in random order, not bucket by bucket.
        noise = tf.random.stateless_uniform(
            tf.shape(batches[2]), seed=tf.stack([shuffle_seed, step]))
        permutation = tf.argsort(noise)
        batches = tuple(tf.gather(part, permutation) for part in batches)
    waiting_source = tf.gather(source, wait_order)
    waiting_target = tf.gather(target, wait_order)
    state = (
        waiting_source.flat_values, waiting_source.row_lengths(),
        waiting_target.flat_values, waiting_target.row_lengths(),
        step + 1,
    )
    return state, batches


def pad_batch(source, target, length, num_rows):
    """`(inputs, targets)` of one batch: ragged source and target ids (n, None)
    padded to (num_rows, length); rows past n are all padding."""
    bos = tf.fill(tf.stack([source.nrows(), 1]), BOS_ID)
    eos = tf.fill(tf.stack([source.nrows(), 1]), EOS_ID)
    shape = tf.stack([num_rows, length])
    encoder_inputs = source.to_tensor(PAD_ID, shape=shape)  # (B, L)
    decoder_inputs = tf.concat([bos, target], axis=1).to_tensor(PAD_ID, shape=shape)
    targets = tf.concat([target, eos], axis=1).to_tensor(PAD_ID, shape=shape)
    return {"encoder_inputs": encoder_inputs, "decoder_inputs": decoder_inputs}, targets


def validate(
    tokens_per_batch, max_sentence_tokens, num_replicas, boundaries, shuffle, seed,
    deterministic, shuffle_buffer_size,
):
    if tokens_per_batch < max_sentence_tokens:
        raise ValueError(
            f"tokens_per_batch must be at least max_sentence_tokens, or a pair of the longest "
            f"length would not fit a batch. Received: tokens_per_batch="
            f"{tokens_per_batch}, max_sentence_tokens={max_sentence_tokens}"
        )
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be positive. Received: num_replicas={num_replicas}")
    if (
        not boundaries
        or boundaries != sorted(set(boundaries))
        or boundaries[0] < 1
        or boundaries[-1] != max_sentence_tokens
    ):
        raise ValueError(
            "bucket_boundaries must be increasing positive lengths ending with "
            f"max_sentence_tokens={max_sentence_tokens}. Received: bucket_boundaries={boundaries}"
        )
    if shuffle and deterministic and seed is None:
        raise ValueError(
            "deterministic=True with shuffle=True needs a seed, or every run "
            "shuffles differently. Received: seed=None"
        )
    if shuffle and shuffle_buffer_size < 1:
        raise ValueError(
            f"shuffle_buffer_size must be positive. Received: {shuffle_buffer_size}"
        )


def with_known_length(dataset):
    """A finite `dataset` with its number of batches known to tf.data, counted in one
    pass where it is not.

    Keras's `fit(validation_data=...)` and `evaluate` run a dataset of unknown
    length until it ends, and Keras 3.15 then warns "Your input ran out of data;
    interrupting training" at each pass. Known, the pass ends at its last batch.
    """
    if dataset.cardinality() >= 0:
        return dataset
    if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
        raise ValueError("The dataset is infinite (repeated); validation needs one that ends.")
    count = int(dataset.reduce(tf.constant(0, tf.int64), lambda count, _: count + 1))
    return dataset.apply(tf.data.experimental.assert_cardinality(count))


def without_autotuning(dataset, prefetch=None):
    """`dataset` without tf.data's autotuning thread (and with `prefetch` batches
    read ahead, if given).

    `fit` keeps a pass's iterator until the next `fit` call, and deleting it then
    waits for that iterator's autotuning thread to wake from its sleep, which
    grows to a minute between rounds: a budgeted run on one core sat idle for
    145 of its 363 seconds (`keras-transformer train` prints where its time
    went). Batches that are already in memory need no tuning.
    """
    if prefetch:
        dataset = dataset.prefetch(prefetch)
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)
