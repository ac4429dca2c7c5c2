"""Dense projections: kernel gradients XLA:CPU runs as plain matrix products, and
kernels stored transposed for inference.

The kernel gradient of `y = x W` is `x^T dy`, a product with a transposed left
operand. XLA folds that transpose into the dot, and XLA:CPU's matrix multiply runs
the folded form at 70-90% of the speed of a plain `(m, k) x (k, n)` product (2-core
AVX2 CPU: `(4096, 512)^T (4096, 2048)` at 112 GFLOP/s against 154 once `x^T` is a
tensor of its own). Under XLA on a CPU, `dense` therefore writes the transpose of
the narrower operand out first, behind an optimization barrier so that XLA cannot
fold it back; the copy costs far less than it saves (5% of a base-model training
step). Everywhere else (no XLA, a GPU or TPU, another Keras backend) the gradient is
autodiff's. This and `_cache.py` are the TensorFlow-specific pieces of the layers,
and `Projection` (projection.py) is this one's caller. TensorFlow's private modules
are imported inside the functions that use them, so that importing the layers never
depends on them.

Inference may also multiply by kernels stored transposed, `(units, contracted)`,
the layout of PyTorch's and CTranslate2's linear layers: `x W^T`. oneDNN's matrix
multiply runs it 1.1x to 1.8x faster than `x W` once the product has 32 rows or more
(2-core AVX2 CPU, `(128, 512) x (512, 2048)`: 2.0 against 3.6 ms), and no slower
below. `transposed_copy` makes such a copy; inside `multiplying_transposed(copies)`,
`dense` multiplies by the copy of its kernel if it has one, except under XLA, which
picks its own layouts.
"""

import contextlib
import math
import threading

import keras
import tensorflow as tf
from keras import ops

_state = threading.local()


def dense(inputs, kernel, bias=None, contracted=1):
    """`tensordot(inputs, kernel, contracted) + bias` as one 2-D matrix multiply.

    Args:
        inputs: `(..., *kernel.shape[:contracted])`.
        kernel: the kernel; its first `contracted` axes are contracted.
        bias: optional, of shape `kernel.shape[contracted:]`.
        contracted: how many trailing input axes (leading kernel axes) are summed.

    Returns:
        `(..., *kernel.shape[contracted:])`.
    """
    input_size = math.prod(kernel.shape[:contracted])
    output_shape = tuple(kernel.shape[contracted:])
    output_size = math.prod(output_shape)
    batch_shape = ops.shape(inputs)[: len(inputs.shape) - contracted]
    x = ops.reshape(inputs, (-1, input_size))
    transposed = getattr(_state, "copies", {}).get(id(kernel))
    if transposed is not None and not _under_xla():
        outputs = tf.matmul(x, ops.cast(transposed, x.dtype), transpose_b=True)
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


@contextlib.contextmanager
def multiplying_transposed(copies):
    """Within it, `dense` multiplies by `copies[id(kernel)]`, a `transposed_copy` of
    its kernel, where there is one (not under XLA)."""
    previous = getattr(_state, "copies", {})
    _state.copies = {**previous, **copies}
    try:
        yield
    finally:
        _state.copies = previous


def _under_xla():
    """Whether this is being traced for XLA (`jit_compile=True`)."""
    if keras.backend.backend() != "tensorflow":
        return False
    from tensorflow.python.ops import control_flow_util

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _under_xla_on_cpu():
    """Whether this is being traced for XLA (`jit_compile=True`) with no GPU or TPU."""
    if not _under_xla():
        return False
    return not (tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))


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
