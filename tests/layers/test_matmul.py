import re

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers import matmul


def _weights(rng, input_shape, kernel_shape):
    x = rng.standard_normal(input_shape).astype("float32")
    kernel = rng.standard_normal(kernel_shape).astype("float32")
    bias = rng.standard_normal(kernel_shape[-1:]).astype("float32")
    return x, kernel, bias


@pytest.mark.parametrize("contracted", [1, 2])
def test_dense_is_tensordot_plus_bias(contracted):
    rng = np.random.default_rng(0)
    x, kernel, _ = _weights(rng, (2, 3, 4, 5), (4, 5, 6)[2 - contracted:])
    bias = rng.standard_normal(kernel.shape[contracted:]).astype("float32")
    expected = np.tensordot(x, kernel, axes=contracted) + bias
    np.testing.assert_allclose(matmul.dense(x, kernel, bias, contracted), expected,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(matmul.dense(x, kernel, None, contracted),
                               expected - bias, rtol=1e-5, atol=1e-5)


def _gradients(x, kernel, bias, upstream, jit_compile):
    @tf.function(jit_compile=jit_compile)
    def gradients(x, kernel, bias, upstream):
        with tf.GradientTape() as tape:
            tape.watch([x, kernel, bias])
            loss = tf.reduce_sum(matmul.dense(x, kernel, bias) * upstream)
        return tape.gradient(loss, [x, kernel, bias])

    return gradients, [g.numpy() for g in gradients(x, kernel, bias, upstream)]


# Both ways of writing the transpose: a narrow kernel (m > n) and a wide one.
@pytest.mark.parametrize("input_size,output_size", [(24, 8), (8, 24)])
def test_gradient_under_xla_equals_closed_form(input_size, output_size):
    rng = np.random.default_rng(1)
    x, kernel, bias = _weights(rng, (3, 10, input_size), (input_size, output_size))
    upstream = rng.standard_normal((3, 10, output_size)).astype("float32")
    rows, dy = x.reshape(-1, input_size).astype("float64"), upstream.reshape(-1, output_size)
    expected = [(dy @ kernel.T).reshape(x.shape), rows.T @ dy, dy.sum(axis=0)]
    for jit_compile in (True, False):
        _, actual = _gradients(x, kernel, bias, upstream, jit_compile)
        for a, e in zip(actual, expected):
            np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4)


def _plain_product(dot):
    """Whether an HLO dot multiplies row-major operands as stored, `(m, k) x (k, n)`.

    A column-major result `C` is computed as the row-major `C^T = rhs^T lhs^T`, so
    there the operands swap roles.
    """
    lhs = re.search(r"lhs_contracting_dims=\{(\d+)\}", dot).group(1)
    rhs = re.search(r"rhs_contracting_dims=\{(\d+)\}", dot).group(1)
    column_major = re.search(r"\]\{0,1\} dot\(", dot) is not None
    return (lhs, rhs) == (("0", "1") if column_major else ("1", "0"))


@pytest.mark.parametrize("input_size,output_size", [(96, 32), (32, 96)])
def test_xla_kernel_gradient_multiplies_plain_operands(input_size, output_size, xla_on_cpu):
    """The point of the module: the kernel gradient is no transposed-operand dot."""
    rng = np.random.default_rng(2)
    x, kernel, bias = _weights(rng, (4, 64, input_size), (input_size, output_size))
    upstream = rng.standard_normal((4, 64, output_size)).astype("float32")
    function, _ = _gradients(x, kernel, bias, upstream, jit_compile=True)
    hlo = function.experimental_get_compiler_ir(x, kernel, bias, upstream)(
        stage="optimized_hlo")
    kernel_shapes = {f"[{input_size},{output_size}]", f"[{output_size},{input_size}]"}
    dots = [line for line in hlo.splitlines()
            if (match := re.search(r"= f32(\[\d+,\d+\])\S* dot\(", line))
            and match.group(1) in kernel_shapes]
    assert len(dots) == 1, hlo
    assert _plain_product(dots[0]), dots[0]


def test_custom_gradient_only_under_xla(xla_on_cpu):
    seen = {}

    def probe(tag):
        seen[tag] = matmul._under_xla_on_cpu()
        return tf.constant(0.0)

    tf.function(lambda: probe("xla"), jit_compile=True)()
    tf.function(lambda: probe("graph"))()
    probe("eager")
    assert seen == {"xla": True, "graph": False, "eager": False}


@pytest.mark.parametrize("contracted", [1, 2])
def test_transposed_copy_is_the_kernel_as_a_transposed_matrix(contracted):
    kernel = np.arange(4 * 5 * 6, dtype="float32").reshape((4, 5, 6))
    input_size = 4 if contracted == 1 else 20
    np.testing.assert_array_equal(matmul.transposed_copy(kernel, contracted),
                                  kernel.reshape(input_size, -1).T)


@pytest.mark.parametrize("contracted", [1, 2])
def test_dense_multiplying_a_transposed_copy_equals_dense(contracted):
    """In a graph and eagerly, `x W^T` by the copy; under XLA, `x W` (the copy unused)."""
    rng = np.random.default_rng(3)
    x, kernel, _ = _weights(rng, (2, 3, 4, 5), (4, 5, 6)[2 - contracted:])
    bias = rng.standard_normal(kernel.shape[contracted:]).astype("float32")
    kernel = tf.constant(kernel)
    expected = np.tensordot(x, kernel, axes=contracted) + bias
    copy = matmul.transposed_copy(kernel, contracted)

    def run(x):
        return matmul.dense(x, kernel, bias, contracted, transposed_kernel=copy)

    np.testing.assert_allclose(run(x), expected, rtol=1e-5, atol=1e-5)
    for jit_compile, transposed_products in ((False, 1), (True, 0)):
        function = tf.function(run, jit_compile=jit_compile)
        np.testing.assert_allclose(function(x), expected, rtol=1e-5, atol=1e-5)
        graph = function.get_concrete_function(tf.TensorSpec(x.shape)).graph
        assert transposed_products == sum(
            op.type == "MatMul" and op.get_attr("transpose_b") for op in graph.get_operations())
    # Without a copy, the kernel as given.
    graph = tf.function(lambda x: matmul.dense(x, kernel, bias, contracted)).get_concrete_function(
        tf.TensorSpec(x.shape)).graph
    assert not any(op.type == "MatMul" and op.get_attr("transpose_b")
                   for op in graph.get_operations())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_transpose_as_integers_moves_integers_in_a_graph(dtype):
    """With `as_integers`, in a graph: `ops.transpose`'s result from a transpose
    of integers of the same width (TensorFlow's kernel, not oneDNN's);
    eagerly, under XLA and without `as_integers`, `ops.transpose` itself."""
    x = tf.cast(tf.reshape(tf.range(2 * 4 * 3 * 5, dtype=tf.float32), (2, 4, 3, 5)) / 7, dtype)
    expected = np.transpose(x.numpy(), (0, 2, 1, 3))

    def searching(x):
        return matmul.transpose(x, (0, 2, 1, 3), as_integers=True)

    def types(function):
        graph = function.get_concrete_function(tf.TensorSpec(x.shape, x.dtype)).graph
        return [(op.type, op.get_attr("T")) for op in graph.get_operations()
                if op.type == "Transpose"]

    integer = tf.int32 if dtype == "float32" else tf.int16
    for function, transposed in (
            (tf.function(searching), integer),
            (tf.function(searching, jit_compile=True), tf.as_dtype(dtype)),
            (tf.function(lambda x: matmul.transpose(x, (0, 2, 1, 3))), tf.as_dtype(dtype))):
        np.testing.assert_array_equal(function(x).numpy(), expected)
        assert types(function) == [("Transpose", transposed)]
    np.testing.assert_array_equal(searching(x).numpy(), expected)
