import ast
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.config import TransformerConfig
from keras_transformer.layers import Projection
from keras_transformer.layers import SearchOptions
from keras_transformer.layers import matmul
from keras_transformer.model import build_transformer

NAMES = ["query", "attention_output", "feed_forward"]


def _pair(name, use_bias=True, **kwargs):
    """Keras's layer and ours for attention's query or output projection or FFN's W1,
    and an input shape."""
    if name == "query":
        return (keras.layers.EinsumDense("abc,cde->abde", (None, 4, 3),
                                         bias_axes="de" if use_bias else None, **kwargs),
                Projection((4, 3), use_bias=use_bias, **kwargs), (2, 5, 16))
    if name == "attention_output":
        return (keras.layers.EinsumDense("abcd,cde->abe", (None, 16),
                                         bias_axes="e" if use_bias else None, **kwargs),
                Projection(16, contracted=2, use_bias=use_bias, **kwargs), (2, 5, 4, 3))
    return (keras.layers.Dense(12, use_bias=use_bias, **kwargs),
            Projection(12, use_bias=use_bias, **kwargs), (2, 5, 16))


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("name", NAMES)
def test_equals_keras_layer_with_the_same_weights(name, use_bias):
    reference, ours, input_shape = _pair(name, use_bias)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(input_shape).astype("float32")
    reference(x)
    ours(x)
    assert [(w.name, w.shape) for w in ours.weights] == [
        (w.name, w.shape) for w in reference.weights
    ]
    weights = [rng.standard_normal(w.shape).astype("float32") for w in reference.weights]
    reference.set_weights(weights)
    ours.set_weights(weights)
    np.testing.assert_allclose(ours(x), reference(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_seeded_initial_kernel_equals_keras_layers(name):
    """The fans are EinsumDense's: `(d_model, h, d_k)` is no convolution kernel."""
    initializer = keras.initializers.GlorotUniform(seed=7)
    reference, ours, input_shape = _pair(name, kernel_initializer=initializer)
    reference.build(input_shape)
    ours.build(input_shape)
    np.testing.assert_array_equal(ours.kernel, reference.kernel)


@pytest.mark.parametrize("seeded", [False, True])
def test_layers_sharing_an_initializer_get_different_kernels(seeded):
    seed = keras.random.SeedGenerator(3) if seeded else None
    initializer = keras.initializers.GlorotUniform(seed=seed)
    first, second = (Projection(8, kernel_initializer=initializer) for _ in range(2))
    first.build((None, 8))
    second.build((None, 8))
    assert not np.array_equal(first.kernel, second.kernel)


@pytest.mark.parametrize("name", ["query", "attention_output"])
def test_search_options_with_its_transposed_kernel_equal_the_plain_call(name):
    """A layer finds its own copy in the options by its kernel's path and
    multiplies `x W^T` (in a graph); options without a copy of its kernel, or
    none, leave `x W`."""
    _, layer, input_shape = _pair(name)
    x = np.random.default_rng(4).standard_normal(input_shape).astype("float32")
    expected = layer(x)
    own = {layer.kernel.path: matmul.transposed_copy(layer.kernel, layer.contracted)}
    for copies, transposed_products in ((own, 1), ({"another/kernel": own[layer.kernel.path]}, 0),
                                        (None, 0)):
        options = None if copies is None else SearchOptions(transposed_kernels=copies)
        function = tf.function(lambda x, options=options: layer(x, search_options=options))
        np.testing.assert_allclose(function(x), expected, rtol=1e-5, atol=1e-5)
        graph = function.get_concrete_function(tf.TensorSpec(input_shape)).graph
        assert transposed_products == sum(
            op.type == "MatMul" and op.get_attr("transpose_b") for op in graph.get_operations())


def test_invalid_arguments_name_the_value():
    with pytest.raises(ValueError, match=r"units=\(4, 0\)"):
        Projection((4, 0))
    with pytest.raises(ValueError, match="contracted=0"):
        Projection(4, contracted=0)
    with pytest.raises(ValueError, match=r"inputs_shape=\(2, None\)"):
        Projection(4).build((2, None))


def _model_gradients(model, inputs, targets):
    @tf.function(jit_compile=True)
    def gradients(inputs, targets):
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)
            loss = keras.ops.mean(keras.losses.sparse_categorical_crossentropy(
                targets, logits, from_logits=True))
        return [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]

    return [g.numpy() for g in gradients(inputs, targets)]


def test_model_gradients_under_xla_equal_with_the_fast_path_off(monkeypatch, xla_on_cpu):
    config = TransformerConfig.tiny(vocab_size=40, num_layers=1, d_model=32, d_ff=48,
                                    num_heads=2, dropout_rate=0.0)
    model = build_transformer(config)
    rng = np.random.default_rng(0)
    inputs = {"encoder_inputs": rng.integers(1, 40, (2, 7)).astype("int32"),
              "decoder_inputs": rng.integers(1, 40, (2, 5)).astype("int32")}
    targets = rng.integers(1, 40, (2, 5)).astype("int32")
    model(inputs)

    under_xla_on_cpu = matmul._under_xla_on_cpu
    decisions = []

    def recorded():
        decisions.append(under_xla_on_cpu())
        return decisions[-1]

    monkeypatch.setattr(matmul, "_under_xla_on_cpu", recorded)
    fast = _model_gradients(model, inputs, targets)
    # Each projection, one per kernel, took the fast path.
    kernels = [v for v in model.trainable_variables if v.path.endswith("/kernel")]
    assert len(decisions) == len(kernels) and all(decisions), decisions

    monkeypatch.setattr(matmul, "_under_xla_on_cpu", lambda: False)
    plain = _model_gradients(model, inputs, targets)
    assert len(fast) == len(plain) == len(model.trainable_variables)
    for variable, a, b in zip(model.trainable_variables, fast, plain):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=variable.path)


def _imported_at_module_level(node):
    """Modules that `node`'s imports name, outside function bodies."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        yield node.module or ""
    for child in ast.iter_child_nodes(node):
        yield from _imported_at_module_level(child)


def test_layers_import_no_private_framework_module_at_import_time():
    """`import tensorflow` itself loads the private modules `matmul` uses, so
    `sys.modules` cannot tell; the layers' sources can."""
    private = ("tensorflow.", "keras.src")
    found = [
        f"{path.name}: {module}"
        for path in sorted(pathlib.Path(matmul.__file__).parent.glob("*.py"))
        for module in _imported_at_module_level(ast.parse(path.read_text()))
        if module.startswith(private)
    ]
    assert not found, found
