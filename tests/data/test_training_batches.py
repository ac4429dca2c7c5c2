import collections
import re
import unicodedata

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from keras_transformer import data
from tests.data.test_batching import BUDGET, MAX_LENGTH, read_batches, reference_pairs


@pytest.fixture(scope="module")
def reference(dev_pairs, tokenizer):
    return reference_pairs(dev_pairs, tokenizer, MAX_LENGTH)


@pytest.fixture(scope="module")
def batches(dev_pairs, tokenizer):
    return data.TrainingBatches(dev_pairs, tokenizer, BUDGET, MAX_LENGTH, seed=5)


def expected_batches_per_epoch(kept, num_replicas=1):
    """Per bucket, the full batches its pairs make: the closed form of an epoch."""
    lengths = data.bucket_lengths(MAX_LENGTH)
    counts = collections.Counter(
        min(l for l in lengths if l >= max(len(source), len(target) + 1))
        for source, target in kept)
    return sum(count // (num_replicas * (BUDGET // length)) for length, count in counts.items())


def test_an_epoch_is_full_batches_of_distinct_pairs(batches, reference):
    kept, too_long = reference
    assert (batches.pairs, batches.pairs_too_long) == (len(kept), too_long)
    assert batches.batches_per_epoch == expected_batches_per_epoch(kept)
    epoch = read_batches(batches.dataset().take(batches.batches_per_epoch))
    lengths = data.bucket_lengths(MAX_LENGTH)
    rows = []
    for (batch_size, length), pairs in epoch:
        assert len(pairs) == batch_size == BUDGET // length  # full: no filler rows
        for source, target in pairs:  # each pair in the smallest bucket that holds it
            assert length == min(l for l in lengths if l >= max(len(source), len(target) + 1))
        rows += pairs
    # Each pair at most once; what sits out is less than a batch per bucket.
    assert not collections.Counter(rows) - collections.Counter(kept)
    assert len(kept) - len(rows) < sum(BUDGET // length for length in lengths)
    # The batches are shuffled, not bucket by bucket.
    shapes = [shape for shape, _ in epoch]
    assert shapes != sorted(shapes)


def test_starting_at_a_step_gives_the_batches_of_an_uninterrupted_run(batches):
    per_epoch = batches.batches_per_epoch
    run = [targets for _, targets in batches.dataset().take(2 * per_epoch + 3)]
    for step in (1, per_epoch - 1, per_epoch, per_epoch + 7, 2 * per_epoch + 2):
        _, targets = next(iter(batches.dataset(step)))
        np.testing.assert_array_equal(targets, run[step])
    # Far away, one epoch is planned: the batch at step E*B + k is batch k of epoch E.
    far_epoch = 10**9
    _, targets = next(iter(batches.dataset(far_epoch * per_epoch + 3)))
    _, expected = next(iter(batches.epoch(far_epoch).skip(3)))
    np.testing.assert_array_equal(targets, expected)
    # Each epoch reshuffles.
    assert [t.shape for t in run[:per_epoch]] != [t.shape for t in run[per_epoch:2 * per_epoch]]


def test_same_seed_same_batches_other_seed_others(dev_pairs, tokenizer, batches):
    def first(seed):
        again = data.TrainingBatches(dev_pairs.take(600), tokenizer, BUDGET, MAX_LENGTH, seed=seed)
        return [targets.numpy() for _, targets in again.dataset().take(5)]

    same, other = first(5), first(6)
    assert all(np.array_equal(a, b) for a, b in zip(same, first(5)))
    assert not all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(same, other))


def test_budget_is_per_replica(dev_pairs, tokenizer, reference):
    batches = data.TrainingBatches(dev_pairs, tokenizer, BUDGET, MAX_LENGTH, seed=0,
                                   num_replicas=2)
    assert batches.batches_per_epoch == expected_batches_per_epoch(reference[0], 2)
    for (batch_size, length), pairs in read_batches(batches.dataset().take(20)):
        assert len(pairs) == batch_size == 2 * (BUDGET // length)


def test_a_corpus_too_small_for_a_batch_is_refused(dev_pairs, tokenizer):
    with pytest.raises(ValueError, match="fills no batch.*smaller tokens_per_batch"):
        data.TrainingBatches(dev_pairs.take(3), tokenizer, BUDGET, MAX_LENGTH, seed=0)
    with pytest.raises(ValueError, match="The training corpus is empty"):
        data.TrainingBatches(dev_pairs.take(0), tokenizer, BUDGET, MAX_LENGTH, seed=0)
    with pytest.raises(ValueError, match="tokens_per_batch must be at least"):
        data.TrainingBatches(dev_pairs, tokenizer, 32, MAX_LENGTH, seed=0)


def test_fit_bucket_lengths_pads_least_of_every_choice():
    """Against the obvious twin: every set of at most K multiples of 8 that ends
    with a bucket holding the longest length, tried one by one."""
    import itertools

    rng = np.random.RandomState(3)
    for trial in range(6):
        lengths = np.minimum(rng.lognormal(2.8, 0.6, 300).astype(int) + 1, 56)
        longest = -(-int(lengths.max()) // 8) * 8
        candidates = list(range(8, longest, 8))
        for k in (1, 2, 3, 4):
            best = min(
                (sum(min(b for b in (*chosen, longest) if b >= n) for n in lengths),
                 (*chosen, longest))
                for r in range(k) for chosen in itertools.combinations(candidates, r))
            fitted = data.fit_bucket_lengths(lengths, k, max_sentence_tokens=64)
            assert fitted[-1] == 64 and len(fitted) <= k + 1
            holding = [b for b in fitted if b <= longest]
            cost = sum(min(b for b in fitted if b >= n) for n in lengths)
            assert cost == best[0], (trial, k, fitted, best)
            assert len(holding) <= k
    with pytest.raises(ValueError, match="lengths that are not empty and <= max_sentence"):
        data.fit_bucket_lengths([70], 4, max_sentence_tokens=64)


def test_the_listed_shapes_are_the_batch_shapes(dev_pairs, tokenizer, reference):
    """`shapes` lists exactly the shapes an epoch yields, one per bucket, and
    `padding` is the share of padding in the batches."""
    kept, _ = reference
    fine = data.TrainingBatches(dev_pairs, tokenizer, BUDGET, MAX_LENGTH, seed=5)
    few = data.TrainingBatches(dev_pairs, tokenizer, BUDGET, MAX_LENGTH, seed=5, num_buckets=3)
    assert len(fine.shapes) > len(few.shapes) == 3
    lengths = [max(len(source), len(target) + 1) for source, target in kept]
    assert few.bucket_boundaries == data.fit_bucket_lengths(lengths, 3, MAX_LENGTH)
    for batches in (fine, few):
        epoch = read_batches(batches.dataset().take(batches.batches_per_epoch))
        seen = {(rows, length, length) for (rows, length), _ in epoch}
        assert seen == set(batches.shapes)
        padded = sum(rows * length for (rows, length), _ in epoch)
        real_source = sum(len(source) for _, pairs in epoch for source, _ in pairs)
        real_target = sum(len(target) + 1 for _, pairs in epoch for _, target in pairs)
        # Measured over every pair kept; the partial batches that sit out differ a little.
        assert batches.padding["source"] == pytest.approx(1 - real_source / padded, abs=0.02)
        assert batches.padding["target"] == pytest.approx(1 - real_target / padded, abs=0.02)
    assert few.padding["source"] > fine.padding["source"]


def without_final_punctuation(text):
    """The slow twin of the unpunctuated pairs: the text without the punctuation
    and spaces that end it, cut character by character."""
    end = len(text)
    while end and (unicodedata.category(text[end - 1]).startswith("P") or text[end - 1].isspace()):
        end -= 1
    return text[:end]


@pytest.fixture(scope="module")
def unpunctuated_reference(dev_pairs, tokenizer):
    """`[(pair's ids, its ids without final punctuation)]` for the kept pairs whose
    both sides end in punctuation, tokenized by sentencepiece's Python API."""
    processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model_proto)
    result = []
    for pair in dev_pairs.as_numpy_iterator():
        texts = [pair[side].decode("utf-8") for side in ("source", "target")]
        cut = [without_final_punctuation(text) for text in texts]
        ids = tuple(tuple(processor.encode(text)) for text in texts)
        if max(len(ids[0]), len(ids[1]) + 1) > MAX_LENGTH:
            continue
        if all(c and c != text for c, text in zip(cut, texts)):
            result.append((ids, tuple(tuple(processor.encode(text)) for text in cut)))
    return result


def test_unpunctuated_pairs_lose_the_punctuation_that_ends_both_sides(
        dev_pairs, tokenizer, reference, unpunctuated_reference):
    kept = reference[0]
    assert 0.9 * len(kept) < len(unpunctuated_reference) < len(kept)  # the Bible's verses
    every = data.TrainingBatches(dev_pairs, tokenizer, BUDGET, MAX_LENGTH, seed=5,
                                 unpunctuated_share=1.0)
    assert every.punctuated == len(unpunctuated_reference)
    rows = [row for _, pairs in read_batches(every.dataset().take(every.batches_per_epoch))
            for row in pairs]
    cut = dict(unpunctuated_reference)
    expected = collections.Counter(cut.get(pair, pair) for pair in kept)
    assert not collections.Counter(rows) - expected
    stripped = set(cut.values())
    assert sum(row in stripped for row in rows) > 0.9 * len(rows)


def test_a_share_of_pairs_is_drawn_afresh_each_epoch(dev_pairs, tokenizer, reference,
                                                     unpunctuated_reference):
    half = data.TrainingBatches(dev_pairs, tokenizer, BUDGET, MAX_LENGTH, seed=5,
                                unpunctuated_share=0.5)
    stripped = {cut for _, cut in unpunctuated_reference}

    def drawn(epoch):
        rows = [row for _, pairs in read_batches(half.epoch(epoch)) for row in pairs]
        return {row for row in rows if row in stripped}, len(rows)

    first, rows = drawn(0)
    # Binomial: n punctuated pairs, p = 0.5; 5 standard deviations either side.
    n = rows * len(unpunctuated_reference) / len(reference[0])
    assert abs(len(first) - n / 2) < 5 * (n / 4) ** 0.5
    assert drawn(0)[0] == first  # planned from (seed, epoch): a resume reads the same
    assert drawn(1)[0] != first
    with pytest.raises(ValueError, match="unpunctuated_share must be between 0 and 1"):
        data.TrainingBatches(dev_pairs, tokenizer, BUDGET, MAX_LENGTH, seed=5,
                             unpunctuated_share=1.5)


def clauses_of(source, target):
    """The slow twin of `aligned_clauses` for one pair: Python's `re` splits each
    side after a clause mark; the pair splits where both sides give as many
    clauses (two or more) and each clause's share of its side's characters is
    within `CLAUSE_SHARE_RATIO` of the other side's."""
    sides = [re.split(r"(?<=[,;:])\s+|(?<=[，；：])\s*", text) for text in (source, target)]
    if not 1 < len(sides[0]) == len(sides[1]):
        return []
    totals = [sum(map(len, clauses)) for clauses in sides]
    ratio = data.training_batches.CLAUSE_SHARE_RATIO
    for a, b in zip(*sides):
        if not (b and 1 / ratio <= (len(a) / totals[0]) / (len(b) / totals[1]) <= ratio):
            return []
    return list(zip(*sides))


def test_aligned_clauses_split_both_sides_alike():
    texts = [
        ("So he said, “Come, see.”", "Y él dijo: Venid, y ved."),  # 3 clauses each
        ("Abraham said, “I will swear.”", "Y dijo Abraham: Yo juraré."),
        ("He said to them, go, and they went.", "Y les dijo: Id."),  # 3 against 2
        ("a, b", "a very long clause that is not the translation of a, b"),  # shares differ
        ("我说，你好。", "I said, hello."),  # full width, no space after it
        ("No clause here.", "Ninguna."),
    ]
    source, target = (tf.constant(list(side)) for side in zip(*texts))
    clauses = data.training_batches.aligned_clauses(source, target)
    got = [[tuple(x.decode() for x in pair) for pair in row] for row in clauses.to_list()]
    expected = [clauses_of(*pair) for pair in texts]
    assert got == [row for row in expected if row]
    assert got == [
        [("So he said,", "Y él dijo:"), ("“Come,", "Venid,"), ("see.”", "y ved.")],
        [("Abraham said,", "Y dijo Abraham:"), ("“I will swear.”", "Yo juraré.")],
        [("我说，", "I said,"), ("你好。", "hello.")],
    ]


@pytest.fixture(scope="module")
def clause_reference(dev_pairs, tokenizer):
    """`[clause pairs' ids]` of each dev pair that splits (`clauses_of`),
    tokenized by sentencepiece's Python API."""
    processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model_proto)
    result = []
    for pair in dev_pairs.as_numpy_iterator():
        clauses = clauses_of(*(pair[side].decode("utf-8") for side in ("source", "target")))
        if clauses:
            result.append([tuple(tuple(processor.encode(text)) for text in clause)
                           for clause in clauses])
    return result


def test_clause_pairs_join_the_corpus(dev_pairs, tokenizer, reference, clause_reference):
    kept = reference[0]
    clauses = [clause for pair in clause_reference for clause in pair
               if max(len(clause[0]), len(clause[1]) + 1) <= MAX_LENGTH]
    assert 0.2 * len(kept) < len(clause_reference) < 0.6 * len(kept)  # the Bible's verses
    every = data.TrainingBatches(dev_pairs, tokenizer, BUDGET, MAX_LENGTH, seed=5,
                                 clause_share=1.0)
    assert every.clause_pairs == sum(map(len, clause_reference))
    assert every.pairs == len(kept) + len(clauses)
    rows = [row for _, pairs in read_batches(every.dataset().take(every.batches_per_epoch))
            for row in pairs]
    expected = collections.Counter(kept) + collections.Counter(clauses)
    assert not collections.Counter(rows) - expected
    assert sum(row in set(clauses) for row in rows) > 0.9 * len(clauses)


def test_a_share_of_pairs_add_their_clauses_drawn_from_the_seed(dev_pairs, tokenizer, reference,
                                                               clause_reference):
    whole = set(reference[0])
    every = {clause for pair in clause_reference for clause in pair} - whole

    def drawn(seed):
        batches = data.TrainingBatches(dev_pairs, tokenizer, BUDGET, MAX_LENGTH, seed=seed,
                                       clause_share=0.5)
        rows = collections.Counter(row for _, pairs in read_batches(batches.epoch(0))
                                   for row in pairs)
        return batches.clause_pairs, {row for row in rows if row in every}

    count, clauses = drawn(5)
    # Each pair that splits adds its k clauses with p = 0.5: 5 standard deviations.
    sizes = [len(pair) for pair in clause_reference]
    assert abs(count - sum(sizes) / 2) < 5 * (sum(k * k for k in sizes) / 4) ** 0.5
    assert drawn(5) == (count, clauses)  # drawn once from the seed: a resume reads the same
    other = drawn(6)[1]
    assert len(clauses ^ other) > 0.4 * len(clauses)  # another seed, other pairs
    with pytest.raises(ValueError, match="clause_share must be between 0 and 1"):
        data.TrainingBatches(dev_pairs, tokenizer, BUDGET, MAX_LENGTH, seed=5, clause_share=-1)
