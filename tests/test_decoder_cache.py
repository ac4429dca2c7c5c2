"""The decoder cache's bookkeeping against closed forms: the slot table and its
mask, beam reordering, sources leaving the batch, new buffers. Cached decoding
against full decoding, and the cache's growth in a graph: tests/test_model.py."""

import keras
import numpy as np

from keras_transformer import decoder_cache
from keras_transformer.config import TransformerConfig


def _cache(batch=3, beam=2, length=4):
    rng = np.random.default_rng(0)
    pair = (rng.standard_normal((batch, 2, length * beam, 3)).astype("float32"),) * 2
    return {
        "cross_attention": [(rng.standard_normal((batch, 2, 5, 3)).astype("float32"),) * 2],
        "encoder_padding_mask": np.ones((batch, 5), bool),
        "self_attention": [pair],
        "self_attention_slots": rng.integers(0, beam, (batch, beam, length)).astype("int32"),
    }


def test_new_buffers_have_the_documented_shapes():
    config = TransformerConfig.tiny(40, d_model=32, d_ff=64, key_dim=4, value_dim=12)
    entries = decoder_cache.self_attention(config, 3, 7, 2, "float32")
    assert [(np.shape(k), np.shape(v)) for k, v in entries["self_attention"]] == [
        ((3, config.num_heads, 14, 4), (3, config.num_heads, 14, 12))] * config.num_layers
    assert np.shape(entries["self_attention_slots"]) == (3, 2, 7)
    assert not np.any(entries["self_attention_slots"])
    assert "self_attention_slots" not in decoder_cache.self_attention(config, 3, 7, 1, "float32")


def test_write_slots_records_each_rows_own_slot_and_masks_by_the_table():
    cache = _cache()
    slots = cache["self_attention_slots"]
    written, mask = decoder_cache.write_slots(cache, 2, 1)
    expected = slots.copy()
    expected[:, :, 2] = np.arange(2)[None, :]  # row k writes position 2 into slot k
    np.testing.assert_array_equal(written["self_attention_slots"], expected)
    # Row k may read entry t * K + k' when its position t is in slot k'.
    expected_mask = expected[:, :, :, None] == np.arange(2)  # (B, K, L, K)
    np.testing.assert_array_equal(mask, expected_mask.reshape(3, 2, 8))
    assert written["self_attention"] is cache["self_attention"]


def test_write_slots_without_a_table_has_no_mask():
    cache = _cache()
    del cache["self_attention_slots"]
    assert decoder_cache.write_slots(cache, 0, 1) == (cache, None)


def test_reorder_gathers_only_the_slot_table():
    cache = _cache()
    parents = np.array([[1, 1], [0, 1], [1, 0]], "int32")
    reordered = decoder_cache.reorder(cache, parents)
    expected = np.take_along_axis(cache["self_attention_slots"], parents[:, :, None], axis=1)
    np.testing.assert_array_equal(reordered["self_attention_slots"], expected)
    assert reordered["self_attention"] is cache["self_attention"]
    del cache["self_attention_slots"]
    assert decoder_cache.reorder(cache, parents) is cache


def test_select_examples_takes_every_entry_of_the_sources():
    cache = _cache()
    examples = np.array([2, 0], "int32")
    selected = decoder_cache.select_examples(cache, examples)
    assert keras.tree.assert_same_structure(selected, cache) is None
    for ours, theirs in zip(keras.tree.flatten(selected), keras.tree.flatten(cache)):
        np.testing.assert_array_equal(ours, theirs[examples])
