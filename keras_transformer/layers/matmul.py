"""Dense projections: kernel gradients XLA:CPU runs as plain matrix products, and a
search's inference-only variants (kernels stored transposed, integer transposes).

The kernel gradient of `y = x W` is `x^T dy`, a product with a transposed left
operand. XLA folds that transpose into the dot, and XLA:CPU's matrix multiply runs
the folded form markedly slower than a plain `(m, k) x (k, n)` product. Under XLA
on a CPU, `dense` therefore writes the transpose of the narrower operand out first,
behind an optimization barrier so that XLA cannot fold it back; the copy costs far
less than it saves (see benchmarks/train_throughput.py). Everywhere else (no XLA, a
GPU or TPU, another Keras backend) the gradient is autodiff's. This and
`kv_cache.py` are the TensorFlow-specific pieces of the layers, and `Projection`
(projection.py) is this one's caller. TensorFlow's private modules are imported
inside the functions that use them, so that importing the layers never depends on
them.

A search's steps (weights fixed, no gradients; see `SearchOptions`) run two
inference-only variants, each chosen by an argument. First, `dense` may multiply by
a kernel stored transposed, `(units, contracted)`, the layout of PyTorch's and
CTranslate2's linear layers: `x W^T` (`transposed_kernel`). Which layout oneDNN
multiplies faster depends on the CPU: without AVX-512, `x W^T` is faster once the
product has 32 rows or more and no slower below; with AVX-512, `x W` is faster in
float32 and as fast in bfloat16. `transposed_copy` makes such a copy; under XLA,
which picks its own layouts, `dense` ignores it. `hardware.decoding_transposed_kernels`
says where the copies pay (see benchmarks/decode_throughput.py). Second, `transpose`
with `as_integers` moves 16- and 32-bit floats as integers of their width, which
TensorFlow's own kernel transposes: oneDNN's, which takes every float transpose when
it is on, costs several times more for a step's small heads, while for tensors of
training's sizes the two are about even. Integer transposes have no gradient, hence
only in a search.
"""

import math

import keras
import tensorflow as tf
from keras import ops


def dense(inputs, kernel, bias=None, contracted=1, transposed_kernel=None):
    """`tensordot(inputs, kernel, contracted) + bias` as one 2-D matrix multiply.

    Args:
        inputs: `(..., *kernel.shape[:contracted])`.
        kernel: the kernel; its first `contracted` axes are contracted.
        bias: optional, of shape `kernel.shape[contracted:]`.
        contracted: how many trailing input axes (leading kernel axes) are summed.
        transposed_kernel: optional `transposed_copy(kernel, contracted)`, for a
            search: multiplied instead of `kernel`, as `x W^T`, except under XLA.

    Returns:
        `(..., *kernel.shape[contracted:])`.
    """
    input_size = math.prod(kernel.shape[:contracted])
    output_shape = tuple(kernel.shape[contracted:])
    output_size = math.prod(output_shape)
    batch_shape = ops.shape(inputs)[: len(inputs.shape) - contracted]
    x = ops.reshape(inputs, (-1, input_size))
    if transposed_kernel is not None and not _under_xla():
        outputs = tf.matmul(x, ops.cast(transposed_kernel, x.dtype), transpose_b=True)
    else:
        w = ops.reshape(ops.cast(kernel, x.dtype), (input_size, output_size))
        outputs = _xla_cpu_matmul(x, w) if _under_xla_on_cpu() else ops.matmul(x, w)
    if bias is not None:
        outputs = ops.add(outputs, ops.reshape(ops.cast(bias, outputs.dtype), (output_size,)))
    return ops.reshape(outputs, (*batch_shape, *output_shape))


def transposed_copy(kernel, contracted=1):
    """`kernel` as the matrix `(units, contracted)`: `W^T` of `dense`'s `x W`."""
    input_size = math.prod(kernel.shape[:contracted])
    return tf.transpose(tf.reshape(tf.convert_to_tensor(kernel), (input_size, -1)))


def transpose(x, perm, as_integers=False):
    """`ops.transpose(x, perm)`; with `as_integers` (a search's steps), in a
    TensorFlow graph outside XLA, by TensorFlow's integer kernel (see above)."""
    integer = _SAME_WIDTH_INTEGER.get(keras.backend.standardize_dtype(x.dtype))
    if not (as_integers and integer and tf.inside_function() and not _under_xla()):
        return ops.transpose(x, perm)
    return tf.bitcast(tf.transpose(tf.bitcast(x, integer), perm), x.dtype)


_SAME_WIDTH_INTEGER = {"float32": tf.int32, "bfloat16": tf.int16, "float16": tf.int16}


def _under_xla():
    """Whether this is being traced for XLA (`jit_compile=True`)."""
    if keras.backend.backend() != "tensorflow":
        return False
    from tensorflow.python.ops import control_flow_util

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _under_xla_on_cpu():
    """Whether this is being traced for XLA (`jit_compile=True`) with no GPU or TPU."""
    return _under_xla() and not _has_accelerator()


def _has_accelerator():
    """Whether this process sees a GPU or TPU, where XLA's own layouts are kept."""
    return bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))


@tf.custom_gradient
def _xla_cpu_matmul(x, w):
    """`x w` whose kernel gradient multiplies a materialized transpose (see above)."""

    def gradient(upstream):
        return tf.matmul(upstream, w, transpose_b=True), _transposed_product(x, upstream)

    return tf.matmul(x, w), gradient


def _transposed_product(a, b):
    """`a^T b` for `a` of shape `(k, m)` and `b` of shape `(k, n)`, as a plain product.

    The narrower operand is transposed: `a^T b` if `m <= n`, else `(b^T a)^T`.
    """
    from tensorflow.compiler.tf2xla.python import xla

    def barrier(tensor):
        return xla.optimization_barrier(tensor)[0]

    if a.shape[1] <= b.shape[1]:
        return tf.matmul(barrier(tf.transpose(a)), b)
    return tf.transpose(barrier(tf.matmul(barrier(tf.transpose(b)), a)))
