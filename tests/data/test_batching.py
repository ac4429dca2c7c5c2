import collections
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import sentencepiece

from keras_transformer import data

BUDGET = 1000
MAX_LENGTH = 64


def reference_pairs(pairs, tokenizer, max_sentence_tokens):
    """The slow, obvious twin: (source ids, target ids) kept, and the number dropped.

    It tokenizes with sentencepiece's own Python API, not with TensorFlow.
    """
    processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model_proto)
    kept, too_long = [], 0
    for pair in pairs.as_numpy_iterator():
        source = processor.encode(pair["source"].decode("utf-8"))
        target = processor.encode(pair["target"].decode("utf-8"))
        if len(source) > max_sentence_tokens or len(target) + 1 > max_sentence_tokens:
            too_long += 1
        else:
            kept.append((tuple(source), tuple(target)))
    return kept, too_long


def unpad(row):
    row = row.tolist()
    while row and row[-1] == 0:
        row.pop()
    return row


def read_batches(batches):
    """Every batch as numpy, and the pairs of its rows that are not all padding."""
    result = []
    for inputs, targets in batches.as_numpy_iterator():
        encoder, decoder = inputs["encoder_inputs"], inputs["decoder_inputs"]
        assert encoder.dtype == decoder.dtype == targets.dtype == np.int32
        assert encoder.shape == decoder.shape == targets.shape
        rows = []
        for source, decoder_row, target_row in zip(encoder, decoder, targets):
            if not target_row.any():  # a row that fills the last batch of a bucket
                assert not source.any() and not decoder_row.any()
                continue
            target = unpad(target_row)
            assert target[-1] == data.EOS_ID
            assert unpad(decoder_row) == [data.BOS_ID] + target[:-1]
            rows.append((tuple(unpad(source)), tuple(target[:-1])))
        result.append((targets.shape, rows))
    return result


@pytest.fixture(scope="module")
def reference(dev_pairs, tokenizer):
    return reference_pairs(dev_pairs, tokenizer, MAX_LENGTH)


def test_bucket_lengths():
    assert data.bucket_lengths(64) == [8, 16, 24, 32, 40, 48, 56, 64]
    assert data.bucket_lengths(256) == [
        8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 104, 120, 136, 152, 168, 192, 216, 240, 256,
    ]
    assert data.bucket_lengths(20) == [8, 16, 20]
    assert data.bucket_lengths(100, granularity=16, growth=2) == [16, 32, 64, 100]
    with pytest.raises(ValueError, match="Received: max_sentence_tokens=0"):
        data.bucket_lengths(0)


def test_budget_buckets_and_no_pair_lost(dev_pairs, tokenizer, reference):
    stats = data.BatchStats()
    batches = data.make_batches(
        dev_pairs, tokenizer, BUDGET, MAX_LENGTH, seed=1, deterministic=True, stats=stats
    )
    read = read_batches(batches)
    kept, too_long = reference
    lengths = data.bucket_lengths(MAX_LENGTH)
    shapes = set()
    batched = []
    for (batch_size, length), rows in read:
        shapes.add((batch_size, length))
        assert length in lengths
        assert batch_size == BUDGET // length  # static: the last batches are filled
        assert batch_size * length <= BUDGET  # source, decoder inputs and targets alike
        for source, target in rows:
            # Each pair sits in the smallest bucket that holds it.
            needed = max(len(source), len(target) + 1)
            assert length == min(l for l in lengths if l >= needed)
        batched += rows
    assert len(shapes) <= len(lengths)
    assert collections.Counter(batched) == collections.Counter(kept)
    assert stats.result() == {
        "pairs_read": 1583,
        "pairs_too_long": too_long,
        "pairs_batched": len(kept),
    }
    assert too_long > 0 and len(kept) + too_long == 1583


def test_dynamic_batch_size_has_no_filler_rows(dev_pairs, tokenizer, reference):
    batches = data.make_batches(
        dev_pairs, tokenizer, BUDGET, MAX_LENGTH, shuffle=False, static_batch_size=False,
        deterministic=True,
    )
    read = read_batches(batches)
    for (batch_size, length), rows in read:
        assert len(rows) == batch_size <= BUDGET // length
    assert sum(len(rows) for _, rows in read) == len(reference[0])
    # Unshuffled (and the dev split fits one chunk), the full batches come bucket by
    # bucket, then the rest of each bucket, cut at the end of the data.
    full = [length for (size, length), _ in read if size == BUDGET // length]
    rest = [length for (size, length), _ in read if size < BUDGET // length]
    assert [length for (_, length), _ in read] == full + rest
    assert full == sorted(full) and rest == sorted(set(rest))


def test_budget_is_per_replica(dev_pairs, tokenizer, reference):
    batches = data.make_batches(
        dev_pairs, tokenizer, BUDGET, MAX_LENGTH, num_replicas=2, seed=3, deterministic=True
    )
    read = read_batches(batches)
    for (batch_size, length), _ in read:
        assert batch_size == 2 * (BUDGET // length)
        assert (batch_size // 2) * length <= BUDGET
    assert collections.Counter(r for _, rows in read for r in rows) == collections.Counter(reference[0])


def arrays(batches):
    return [
        np.stack([inputs["encoder_inputs"], inputs["decoder_inputs"], targets])
        for inputs, targets in batches.as_numpy_iterator()
    ]


def same(first, second):
    return len(first) == len(second) and all(
        a.shape == b.shape and (a == b).all() for a, b in zip(first, second)
    )


def test_deterministic_runs_repeat_and_epochs_reshuffle(dev_pairs, tokenizer):
    def build(seed):
        return data.make_batches(
            dev_pairs.take(500), tokenizer, BUDGET, MAX_LENGTH, seed=seed, deterministic=True
        )

    batches = build(7)
    epoch_one, epoch_two = arrays(batches), arrays(batches)
    assert same(arrays(build(7)), epoch_one)  # a second run, built anew
    assert not same(epoch_two, epoch_one)  # each epoch reshuffles


def test_custom_bucket_boundaries(dev_pairs, tokenizer, reference):
    batches = data.make_batches(
        dev_pairs, tokenizer, BUDGET, MAX_LENGTH, bucket_boundaries=[32, 64], seed=0
    )
    read = read_batches(batches)
    assert {shape for shape, _ in read} == {(31, 32), (15, 64)}
    assert sum(len(rows) for _, rows in read) == len(reference[0])


def test_batches_feed_model_fit(dev_pairs, tokenizer):
    import keras

    encoder_inputs = keras.Input((None,), dtype="int32", name="encoder_inputs")
    decoder_inputs = keras.Input((None,), dtype="int32", name="decoder_inputs")
    embedding = keras.layers.Embedding(tokenizer.vocab_size, 8)
    context = keras.ops.mean(embedding(encoder_inputs), axis=1, keepdims=True)  # (B, 1, 8)
    logits = keras.layers.Dense(tokenizer.vocab_size)(embedding(decoder_inputs) + context)
    model = keras.Model({"encoder_inputs": encoder_inputs, "decoder_inputs": decoder_inputs}, logits)
    model.compile(
        "adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)
    )
    batches = data.make_batches(dev_pairs, tokenizer, BUDGET, MAX_LENGTH, seed=0)
    history = model.fit(batches.take(3).repeat(), steps_per_epoch=3, epochs=1, verbose=0,
                        shuffle=False)
    assert np.isfinite(history.history["loss"][0])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tokens_per_batch": 32}, "tokens_per_batch must be at least max_sentence_tokens"),
        ({"max_sentence_tokens": 0}, "max_sentence_tokens must be positive"),
        ({"num_replicas": 0}, "num_replicas must be positive"),
        ({"deterministic": True}, "deterministic=True with shuffle=True needs a seed"),
        ({"bucket_boundaries": [16, 8, 64]}, "bucket_boundaries must be increasing"),
        ({"bucket_boundaries": [8, 32]}, "ending with max_sentence_tokens=64"),
        ({"shuffle_buffer_size": 0}, "shuffle_buffer_size must be positive"),
    ],
)
def test_arguments_are_checked(dev_pairs, tokenizer, kwargs, message):
    arguments = {"tokens_per_batch": BUDGET, "max_sentence_tokens": MAX_LENGTH, **kwargs}
    with pytest.raises(ValueError, match=message):
        data.make_batches(dev_pairs, tokenizer, **arguments)


@pytest.mark.slow
def test_mirrored_strategy_splits_batches_evenly(tmp_path, tokenizer):
    # Logical devices must be set before TensorFlow starts, hence a fresh process.
    tokenizer.save(str(tmp_path / "vocab"))
    script = textwrap.dedent(f"""
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        from keras_transformer import data
        tokenizer = data.SubwordTokenizer.load({str(tmp_path / "vocab")!r})
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        stats = data.BatchStats()
        batches = data.make_batches(
            data.load_parallel("bundled", "dev"), tokenizer, {BUDGET}, {MAX_LENGTH},
            num_replicas=strategy.num_replicas_in_sync, seed=0, stats=stats)
        rows = 0
        for inputs, targets in strategy.experimental_distribute_dataset(batches):
            parts = strategy.experimental_local_results(targets)
            assert len(parts) == 2 and parts[0].shape == parts[1].shape, parts
            assert parts[0].shape[0] * parts[0].shape[1] <= {BUDGET}
            rows += sum(int(tf.reduce_sum(tf.cast(tf.reduce_any(p != 0, axis=1), tf.int32))) for p in parts)
        assert rows == stats.result()["pairs_batched"], (rows, stats.result())
        print("ok", rows)
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ok ")
