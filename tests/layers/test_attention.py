import collections

import keras
import numpy as np
import pytest

from keras_transformer.layers import MultiHeadAttention
from keras_transformer.layers import SearchOptions

B, T, S, D, H, DK = 2, 5, 7, 16, 4, 4


def _pair(key_dim=DK, value_dim=None):
    """Our layer and keras's, holding the same weights."""
    reference = keras.layers.MultiHeadAttention(H, key_dim, value_dim=value_dim)
    ours = MultiHeadAttention(H, key_dim, value_dim=value_dim)
    query, value = np.random.randn(B, T, D), np.random.randn(B, S, D)
    reference(query, value)
    ours(query, value)
    ours.set_weights(reference.get_weights())
    return ours, reference


def _padding_mask(lengths, length):
    return np.arange(length)[None, :] < np.array(lengths)[:, None]  # (B, L)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("value_dim", [None, 6])
def test_cross_attention_equals_keras(masked, value_dim):
    ours, reference = _pair(value_dim=value_dim)
    query = np.random.randn(B, T, D).astype("float32")
    value = np.random.randn(B, S, D).astype("float32")
    mask = None
    if masked:
        mask = np.broadcast_to(_padding_mask([7, 3], S)[:, None, :], (B, T, S))
    expected, expected_scores = reference(
        query, value, attention_mask=mask, return_attention_scores=True
    )
    actual, scores = ours(query, value, attention_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(actual, expected, atol=1e-5)
    np.testing.assert_allclose(scores, expected_scores, atol=1e-5)


def test_causal_self_attention_with_padding_equals_keras():
    ours, reference = _pair()
    x = np.random.randn(B, T, D).astype("float32")
    padding = _padding_mask([5, 2], T)
    expected = reference(
        x, x, attention_mask=np.broadcast_to(padding[:, None, :], (B, T, T)), use_causal_mask=True
    )
    # Ours takes a (B, S) key-padding mask directly.
    actual = ours(x, x, attention_mask=padding, use_causal_mask=True)
    np.testing.assert_allclose(actual, expected, atol=1e-5)


def test_separate_key_input_equals_keras():
    ours, reference = _pair()
    query, key, value = (np.random.randn(B, L, D).astype("float32") for L in (T, S, S))
    np.testing.assert_allclose(
        ours(query, value, key=key), reference(query, value, key=key), atol=1e-5
    )


def test_masked_keys_get_zero_weight():
    ours, _ = _pair()
    query, value = np.random.randn(B, T, D), np.random.randn(B, S, D)
    _, scores = ours(query, value, attention_mask=_padding_mask([4, 1], S),
                     return_attention_scores=True)
    scores = np.asarray(scores)  # (B, H, T, S)
    assert np.all(scores[0, :, :, 4:] == 0) and np.all(scores[1, :, :, 1:] == 0)
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-6)


def test_self_attention_cache_equals_full_causal_pass():
    ours, _ = _pair()
    x = np.random.randn(B, T, D).astype("float32")
    full = np.asarray(ours(x, x, use_causal_mask=True))
    max_length = T + 3  # unwritten cache slots must be masked too
    cache = (np.zeros((B, H, max_length, DK), "float32"),) * 2
    for t in range(T):
        step, cache = ours(
            x[:, t : t + 1], x[:, t : t + 1], use_causal_mask=True, cache=cache,
            cache_update_index=t,
        )
        np.testing.assert_allclose(step[:, 0], full[:, t], atol=1e-5)
    # The cache holds the projections of every position written so far, heads first.
    keys, values = ours.project_key_value(x)  # (B, H, T, DK)
    np.testing.assert_allclose(cache[0][:, :, :T], keys, atol=1e-6)
    np.testing.assert_allclose(cache[1][:, :, :T], values, atol=1e-6)
    assert not np.any(cache[0][:, :, T:])


def test_grouped_self_attention_cache_reads_the_slots_the_mask_names():
    """Rows b * G + g share group b's cache of G slots; the mask says which
    slot holds each position of a row's prefix. Twin: a cache per row that
    holds exactly those keys and values."""
    ours, _ = _pair()
    G, L = 3, T + 2
    x = np.random.randn(B * G, T, D).astype("float32")
    cache = (np.zeros((B, H, L * G, DK), "float32"),) * 2  # entry t * G + g: slot g's t
    # Row 0 of each group reads its own slot at even positions and slot 2 at odd ones.
    holder = np.tile(np.arange(G)[None, :, None], (B, 1, L))  # (B, G, L)
    holder[:, 0, 1::2] = 2
    mask = holder[:, :, :, None] == np.arange(G)  # (B, G, L, G)
    mask = mask.reshape(B, G, L * G)
    for t in range(T):
        step, cache = ours(x[:, t : t + 1], x[:, t : t + 1], use_causal_mask=True,
                           attention_mask=mask, cache=cache, cache_update_index=t)
    keys, values = ours.project_key_value(x)  # (B * G, H, T, DK), row-major groups
    source_rows = np.arange(B * G).reshape(B, G)[np.arange(B)[:, None, None],
                                                 holder[:, :, :T]]  # (B, G, T)
    query = np.asarray(ours._query_dense(x[:, T - 1 :]))  # (B * G, 1, H, DK)
    for b in range(B):
        for g in range(G):
            row = b * G + g
            rows = source_rows[b, g]  # the row whose keys fill each position
            k = np.asarray(keys)[rows, :, np.arange(T)]  # (T, H, DK)
            v = np.asarray(values)[rows, :, np.arange(T)]
            logits = np.einsum("hd,thd->ht", query[row, 0], k) / np.sqrt(DK)
            weights = np.exp(logits - logits.max(-1, keepdims=True))
            weights /= weights.sum(-1, keepdims=True)
            heads = np.einsum("ht,thd->hd", weights, v)  # (H, DK)
            expected = np.asarray(ours._output_dense(heads[None, None]))[0, 0]
            np.testing.assert_allclose(step[row, 0], expected, atol=1e-5)


def test_search_options_change_how_a_cached_step_runs_not_its_result():
    """A step of G = 2 rows per group over the cache, in a graph: with
    `SearchOptions(write_cache_in_place=True)` the cache is written with
    `InplaceUpdate` and the 6 transposes of heads (query, keys, values, their
    slots, output) move integers; the output and the cache equal those of the
    step without options (slice updates, float transposes)."""
    import tensorflow as tf

    ours, _ = _pair()
    G, L, index = 2, T, 2
    x = np.random.randn(B * G, 1, D).astype("float32")
    keys, values = (np.random.randn(B, H, L * G, DK).astype("float32") for _ in range(2))
    mask = np.ones((B, G, L * G), bool)

    def step(options):
        def run(x, keys, values):
            cache = tf.identity(keys), tf.identity(values)  # buffers of the function's own
            return ours(x, x, use_causal_mask=True, attention_mask=mask, cache=cache,
                        cache_update_index=index, search_options=options)

        return tf.function(run, autograph=False)

    results, graphs = [], []
    for options in (None, SearchOptions(write_cache_in_place=True)):
        function = step(options)
        results.append(tf.nest.map_structure(np.asarray, function(x, keys, values)))
        graphs.append(function.get_concrete_function(x, keys, values).graph.get_operations())
    (plain, plain_cache), (searched, searched_cache) = results
    np.testing.assert_array_equal(searched, plain)
    np.testing.assert_array_equal(searched_cache[0], plain_cache[0])
    np.testing.assert_array_equal(searched_cache[1], plain_cache[1])
    assert not np.array_equal(plain_cache[0], keys)  # the step wrote its position
    plain_ops, search_ops = graphs
    assert "InplaceUpdate" not in {op.type for op in plain_ops}
    assert [op.type for op in search_ops].count("InplaceUpdate") == 2

    def transposes(ops):
        return collections.Counter(op.get_attr("T") for op in ops if op.type == "Transpose")

    plain_transposes, search_transposes = transposes(plain_ops), transposes(search_ops)
    assert plain_transposes[tf.int32] == 0
    assert search_transposes[tf.int32] == 6
    assert search_transposes[tf.float32] == plain_transposes[tf.float32] - 6


def test_cross_attention_cache_equals_recomputing():
    ours, _ = _pair()
    query, value = np.random.randn(B, T, D), np.random.randn(B, S, D)
    mask = _padding_mask([6, 2], S)
    expected = ours(query, value, attention_mask=mask)
    actual, cache = ours(query, attention_mask=mask, cache=ours.project_key_value(value))
    np.testing.assert_allclose(actual, expected, atol=1e-6)


def test_grouped_cross_attention_equals_a_tiled_cache():
    """G query rows per source read the source's keys and values once; the
    twin tiles them to one copy per row, as beam search used to."""
    ours, _ = _pair()
    G = 3
    query, value = np.random.randn(B * G, T, D), np.random.randn(B, S, D)
    mask = _padding_mask([6, 2], S)
    keys, values = ours.project_key_value(value)
    tiled = (np.repeat(keys, G, axis=0), np.repeat(values, G, axis=0))
    expected, expected_scores, _ = ours(query, attention_mask=np.repeat(mask, G, axis=0),
                                        cache=tiled, return_attention_scores=True)
    actual, scores, _ = ours(query, attention_mask=mask, cache=(keys, values),
                             return_attention_scores=True)
    np.testing.assert_allclose(actual, expected, atol=1e-6)
    np.testing.assert_allclose(scores, expected_scores, atol=1e-6)  # (B * G, H, T, S)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_half_precision_masking_is_finite(policy):
    keras.config.set_dtype_policy(policy)
    layer = MultiHeadAttention(H, DK)
    # Large activations: a -1e9 mask constant would overflow if applied in half precision.
    x = 30.0 * np.random.randn(B, T, D).astype("float32")
    outputs, scores = layer(x, x, attention_mask=_padding_mask([5, 1], T), use_causal_mask=True,
                            return_attention_scores=True)
    assert outputs.dtype == policy.split("_")[1]
    assert scores.dtype == "float32"
    assert np.all(np.isfinite(np.asarray(outputs, "float32")))
    np.testing.assert_allclose(np.asarray(scores).sum(-1), 1.0, atol=1e-5)


def test_invalid_arguments_name_the_value():
    with pytest.raises(ValueError, match="num_heads=0"):
        MultiHeadAttention(0, 8)
    with pytest.raises(ValueError, match="dropout=1.5"):
        MultiHeadAttention(2, 8, dropout=1.5)
