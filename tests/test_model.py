import keras
import numpy as np
import pytest

from keras_transformer import Transformer
from keras_transformer import TransformerConfig
from keras_transformer import build_transformer
from tests.seeding import reseed
from tests.test_config import analytic_parameter_count

VOCAB = 40
VARIANTS = {
    "post_norm_sinusoidal": TransformerConfig.tiny(VOCAB, d_model=32, d_ff=64),
    "pre_norm_learned": TransformerConfig.tiny(
        VOCAB, d_model=32, d_ff=64, norm_first=True, positional_encoding="learned"),
    "unequal_head_dims": TransformerConfig.tiny(VOCAB, d_model=32, d_ff=64, key_dim=4,
                                                value_dim=12),
}


def _ids(batch, length, seed=0):
    return np.random.RandomState(seed).randint(1, VOCAB, (batch, length)).astype("int32")


def _logits(model, source, target):
    return np.asarray(model({"encoder_inputs": source, "decoder_inputs": target}))


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def model(request):
    reseed(0)
    return build_transformer(VARIANTS[request.param])


def test_inputs_and_outputs(model):
    assert isinstance(model, keras.Model)
    assert sorted(t.name for t in model.inputs) == ["decoder_inputs", "encoder_inputs"]
    assert all(t.dtype == "int32" for t in model.inputs)
    logits = model({"encoder_inputs": _ids(3, 9), "decoder_inputs": _ids(3, 4)})
    assert logits.shape == (3, 4, VOCAB) and logits.dtype == "float32"


def test_decoder_is_causal(model):
    source, target = _ids(2, 8), _ids(2, 6)
    changed = target.copy()
    changed[:, 4:] = _ids(2, 2, seed=1)
    before, after = _logits(model, source, target), _logits(model, source, changed)
    np.testing.assert_allclose(after[:, :4], before[:, :4], atol=1e-5)
    assert not np.allclose(after[:, 4:], before[:, 4:])


def test_source_padding_does_not_change_logits(model):
    source, target = _ids(2, 7), _ids(2, 5)
    padded = np.pad(source, ((0, 0), (0, 6)))
    np.testing.assert_allclose(_logits(model, padded, target), _logits(model, source, target),
                               atol=1e-5)


def test_target_padding_does_not_change_real_positions(model):
    source, target = _ids(2, 7), _ids(2, 5)
    padded = np.pad(target, ((0, 0), (0, 3)))
    np.testing.assert_allclose(_logits(model, source, padded)[:, :5],
                               _logits(model, source, target), atol=1e-5)


def test_cached_step_by_step_decoding_equals_full_pass(model):
    source, target = _ids(3, 7), _ids(3, 6)
    source[1, 4:] = 0  # a padded source in the batch
    full = _logits(model, source, target)
    cache = model.initial_cache(source, max_output_length=10)
    for step in range(target.shape[1]):
        logits, cache = model.decode_step(target[:, step], cache, step)
        np.testing.assert_allclose(logits, full[:, step], atol=1e-5)


def test_cached_decoding_compiles_with_xla(model):
    import tensorflow as tf

    source, target = _ids(2, 7), _ids(2, 3)
    full = _logits(model, source, target)

    @tf.function(jit_compile=True)
    def decode(source, target):
        cache = model.initial_cache(source, max_output_length=3)
        logits = []
        for step in range(3):
            step_logits, cache = model.decode_step(target[:, step], cache, tf.constant(step))
            logits.append(step_logits)
        return tf.stack(logits, axis=1)

    np.testing.assert_allclose(decode(source, target), full, atol=1e-4)


def test_xla_beam_search_writes_the_cache_in_place(model):
    """Under XLA a search's step writes each self-attention cache with one
    dynamic-update-slice and never copies it (a reshape between the write and
    the attention once made XLA copy it twice a step). Read off the optimized HLO."""
    import re

    import tensorflow as tf

    from keras_transformer import decoding

    config = model.config
    length, beam_size = 12, 3

    @tf.function(autograph=False, jit_compile=True)
    def search(source):
        cache = model.initial_cache(source, length, beam_size=beam_size)
        return decoding.beam_search(
            model.step_function(), tf.fill([4], 1), cache, vocab_size=VOCAB,
            max_output_length=length, eos_id=2, beam_size=beam_size, alpha=0.6,
            padding_id=0, reorder_cache=model.reorder_cache)

    source = tf.constant(_ids(4, 7))
    hlo = search.experimental_get_compiler_ir(source)(stage="optimized_hlo")
    shapes = "|".join(re.escape(f"[4,{config.num_heads},{length * beam_size},{dim}]")
                      for dim in {config.d_k, config.d_v})  # (B, h, L * K, d)
    writes = re.findall(rf"= \w+(?:{shapes})\S* dynamic-update-slice\(", hlo)
    assert len(writes) == 2 * config.num_layers  # once per cache and step
    # The loop's caches (get-tuple-element) are never copied.
    assert not re.findall(rf"= \w+(?:{shapes})\S* copy\(%get-tuple-element", hlo)
    ids, _ = search(source)
    eager_ids, _ = decoding.beam_search(
        model.step_function(), tf.fill([4], 1),
        model.initial_cache(source, length, beam_size=beam_size), vocab_size=VOCAB,
        max_output_length=length, eos_id=2, beam_size=beam_size, alpha=0.6, padding_id=0,
        reorder_cache=model.reorder_cache)
    np.testing.assert_array_equal(ids, eager_ids)


def _beam_search(model, **step_options):
    """A beam search of `model.step_function(**step_options)` in a tf.function, with
    sources leaving the batch and per-source limits: its ids and scores, and the
    nodes of its graph's functions (the while loop's body among them)."""
    import tensorflow as tf

    from keras_transformer import decoding

    source = _ids(5, 7)
    source[2, 3:] = 0

    @tf.function(autograph=False)
    def run(source):
        cache = model.initial_cache(source, 9, beam_size=3)
        return decoding.beam_search(
            model.step_function(**step_options), tf.fill([5], 1), cache,
            vocab_size=VOCAB, max_output_length=9, eos_id=2, beam_size=3, alpha=0.6,
            max_output_lengths=tf.constant([9, 4, 6, 2, 9]), padding_id=0,
            reorder_cache=model.reorder_cache, select_examples=model.select_examples)

    graph = run.get_concrete_function(tf.TensorSpec([None, None], tf.int32)).graph
    nodes = [node for function in graph.as_graph_def().library.function
             for node in function.node_def]
    return [np.asarray(t) for t in run(source)], nodes


def test_beam_search_writing_the_cache_in_place_equals_copying_it(model):
    """`step_function(write_cache_in_place=True)` against the steps that copy the
    cache: the same ids and scores."""
    (ids, scores), nodes = _beam_search(model, write_cache_in_place=True)
    (copied_ids, copied_scores), copied_nodes = _beam_search(model)
    assert "InplaceUpdate" in {node.op for node in nodes}
    assert "InplaceUpdate" not in {node.op for node in copied_nodes}
    np.testing.assert_array_equal(ids, copied_ids)
    np.testing.assert_allclose(scores, copied_scores, rtol=1e-6)


def test_beam_search_with_transposed_kernels_equals_plain_kernels(model):
    """`step_function(transposed_kernels=True)`: each of the decoder's 8
    projections a layer multiplies by (self-attention Q, K, V, W^O; cross-attention
    Q, W^O; W_1, W_2) becomes `x W^T`, and the search finds the same ids and scores."""
    (ids, scores), nodes = _beam_search(model, transposed_kernels=True)
    (plain_ids, plain_scores), plain_nodes = _beam_search(model)

    def transposed_products(nodes):
        return sum(node.op == "MatMul" and node.attr["transpose_b"].b for node in nodes)

    added = transposed_products(nodes) - transposed_products(plain_nodes)
    assert added == 8 * model.config.num_layers
    np.testing.assert_array_equal(ids, plain_ids)
    np.testing.assert_allclose(scores, plain_scores, rtol=1e-5)


def test_beam_search_of_one_source_with_a_length_known_at_run_time(model):
    """A tf.function over one source of static shape and a length tensor: the
    steps keep the batch of 1 static in the slot mask they write, as the
    search's while loop requires of its state, and the search equals one with
    the length known when traced."""
    import tensorflow as tf

    from keras_transformer import decoding

    source = _ids(1, 7)

    def search(source, length):
        cache = model.initial_cache(source, length, beam_size=3)
        return decoding.beam_search(
            model.step_function(), tf.fill([1], 1), cache, vocab_size=VOCAB,
            max_output_length=length, eos_id=2, beam_size=3, padding_id=0,
            reorder_cache=model.reorder_cache)

    at_run_time = tf.function(search, autograph=False, input_signature=[
        tf.TensorSpec([1, 7], tf.int32), tf.TensorSpec([], tf.int32)])
    ids, scores = at_run_time(source, tf.constant(6))
    expected_ids, expected_scores = search(source, 6)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5)


def test_graph_decoding_grows_the_cache_as_the_steps_need(model):
    """In a graph outside XLA the self-attention cache holds 16 positions at
    first and grows by 16 when a step writes past its end; eagerly and under XLA it
    holds all of them from the start (also with a limit known only when XLA
    compiles it)."""
    import tensorflow as tf

    source, tokens = _ids(2, 7), tf.ones([6], tf.int32)

    def lengths(source):
        cache = model.initial_cache(source, tf.shape(source)[1] + 33, beam_size=3)  # 40
        result = []
        for step in (None, 0, 15, 16, 33, 39):
            if step is not None:
                _, cache = model.decode_step(tokens, cache, tf.constant(step))
            # (B, h, L * K, d) and (B, K, L): positions held.
            result.append([tf.shape(key)[2] // 3 for key, _ in cache["self_attention"]]
                          + [tf.shape(cache["self_attention_slots"])[2]])
        return tf.convert_to_tensor(result)

    any_source = [tf.TensorSpec([None, None], tf.int32)]
    expected = np.repeat([[16], [16], [16], [32], [48], [48]], model.config.num_layers + 1, 1)
    np.testing.assert_array_equal(
        tf.function(lengths, autograph=False, input_signature=any_source)(source), expected)
    np.testing.assert_array_equal(lengths(source), np.full_like(expected, 40))
    compiled = tf.function(lengths, autograph=False, jit_compile=True, input_signature=any_source)
    np.testing.assert_array_equal(compiled(source), np.full_like(expected, 40))


def test_beam_search_over_a_growing_cache_equals_one_over_every_position(model):
    """A beam search in a graph, whose cache grows (see above), against the same
    search over a cache of all 40 positions made eagerly: the same ids, and scores
    within float32 rounding; the longest hypothesis needs the cache's third chunk."""
    import tensorflow as tf

    from keras_transformer import decoding

    source = _ids(5, 7)
    source[2, 3:] = 0
    limits = tf.constant([40, 4, 36, 2, 33])

    @tf.function(autograph=False)
    def search(source, cache):
        cache = model.initial_cache(source, 40, beam_size=3) if cache is None else cache
        return decoding.beam_search(
            model.step_function(write_cache_in_place=True), tf.fill([5], 1), cache,
            vocab_size=VOCAB, max_output_length=40, eos_id=2, beam_size=3, alpha=2.0,
            max_output_lengths=limits, padding_id=0,
            reorder_cache=model.reorder_cache, select_examples=model.select_examples)

    ids, scores = search(source, None)
    every_position = model.initial_cache(source, 40, beam_size=3)
    expected_ids, expected_scores = search(source, every_position)
    assert every_position["self_attention"][0][0].shape[2] == 40 * 3  # (B, h, L * K, d)
    assert np.max(np.sum(np.asarray(ids) != 0, axis=-1)) > 32
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5)


# big: 213M parameters, 5 s to build.
@pytest.mark.parametrize("name", ["base", pytest.param("big", marks=pytest.mark.slow)])
def test_parameter_count_matches_the_paper(name):
    config = TransformerConfig.preset(name, vocab_size=37000)
    count = build_transformer(config).count_params()
    assert count == analytic_parameter_count(config)
    paper = {"base": 65e6, "big": 213e6}[name]
    assert abs(count - paper) / paper < 0.04


def test_parameter_count_of_variants(model):
    assert model.count_params() == analytic_parameter_count(model.config)


def test_dropout_only_in_training():
    model = build_transformer(TransformerConfig.tiny(VOCAB, dropout_rate=0.3))
    inputs = {"encoder_inputs": _ids(2, 7), "decoder_inputs": _ids(2, 5)}
    np.testing.assert_array_equal(model(inputs), model(inputs))
    assert not np.allclose(model(inputs, training=True), model(inputs))


def test_dropout_on_the_sums_of_embeddings_and_positions_in_both_stacks():
    """Sec. 5.4: dropout on the sums of the embeddings and the positional
    encodings, in the encoder and in the decoder: in training, each entry of the
    sum is 0 or 1 / (1 - P_drop) times itself."""
    rate = 0.3
    model = build_transformer(TransformerConfig.tiny(VOCAB, dropout_rate=rate))
    inputs = {"encoder_inputs": _ids(4, 9), "decoder_inputs": _ids(4, 7, seed=1)}
    for name in ("encoder_embedding_dropout", "decoder_embedding_dropout"):
        sums = keras.Model(model.inputs, model.get_layer(name).output)
        kept = np.asarray(sums(inputs))
        dropped = np.asarray(sums(inputs, training=True))
        zeros = dropped == 0
        assert 0.2 < zeros.mean() < 0.4, name
        np.testing.assert_allclose(dropped[~zeros], kept[~zeros] / (1 - rate), rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_each_stack_ends_in_a_layer_norm(norm_first):
    """The encoder's output and the decoder's last hidden states are layer-normalized:
    post-norm by each layer's last norm, pre-norm by the norm that ends its stack
    (gain 1 and bias 0 in a new model: mean 0 and variance 1 at every position),
    and the logits are those states times the shared embedding."""
    model = build_transformer(TransformerConfig.tiny(VOCAB, norm_first=norm_first))
    source, target = _ids(3, 8), _ids(3, 6, seed=1)
    encoded = np.asarray(model.encode(source))
    np.testing.assert_allclose(encoded.mean(-1), 0, atol=1e-5)
    np.testing.assert_allclose(encoded.var(-1), 1, rtol=1e-3)
    last = "decoder_norm" if norm_first else \
        f"decoder_layer_{model.config.num_layers - 1}"
    states = keras.Model(model.inputs, model.get_layer(last).output)
    hidden = np.asarray(states({"encoder_inputs": source, "decoder_inputs": target}))
    np.testing.assert_allclose(hidden.mean(-1), 0, atol=1e-5)
    np.testing.assert_allclose(hidden.var(-1), 1, rtol=1e-3)
    table = np.asarray(model.embedding.embeddings)
    np.testing.assert_allclose(_logits(model, source, target), hidden @ table.T,
                               rtol=1e-4, atol=1e-4)


def test_keras_file_round_trip(tmp_path, model):
    source, target = _ids(2, 7), _ids(2, 5)
    path = str(tmp_path / "model.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    assert isinstance(restored, Transformer)
    assert restored.config == model.config
    np.testing.assert_array_equal(_logits(restored, source, target),
                                  _logits(model, source, target))


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(policy, tmp_path):
    config = VARIANTS["post_norm_sinusoidal"]
    reference = build_transformer(config)
    keras.config.set_dtype_policy(policy)
    model = build_transformer(config)
    model.set_weights(reference.get_weights())
    assert model.get_layer("encoder_layer_0").compute_dtype == policy.split("_")[1]
    source, target = _ids(2, 7), _ids(2, 5)
    source[0, 3:] = 0
    logits = _logits(model, source, target)
    assert logits.dtype == "float32"
    assert np.all(np.isfinite(logits))
    # Weights and activations rounded to the policy's compute dtype, of unit
    # roundoff u (2^-11 float16, 2^-8 bfloat16): measured errors up to 3.3 u
    # times the largest logit (seeds 0 to 2, both policies); allowed 8 u.
    expected = _logits(reference, source, target)
    u = {"mixed_float16": 2.0 ** -11, "mixed_bfloat16": 2.0 ** -8}[policy]
    np.testing.assert_allclose(logits, expected, rtol=0, atol=8 * u * np.abs(expected).max())
    # The policy is saved with the model.
    model.save(tmp_path / "mixed.keras")
    keras.config.set_dtype_policy("float32")
    restored = keras.saving.load_model(tmp_path / "mixed.keras")
    assert restored.get_layer("decoder_layer_1").compute_dtype == policy.split("_")[1]
