import keras

from keras_transformer.layers.matmul import dense
from keras_transformer.layers.search_options import NO_SEARCH


@keras.saving.register_keras_serializable(package="keras_transformer")
class Projection(keras.layers.Layer):
    """`x W + b` over the last `contracted` axes of `x`, run as one matrix multiply.

    The learned projections of the Transformer: the per-head `W_i^Q`, `W_i^K`,
    `W_i^V` of all heads at once (kernel `(d_model, h, d_k)`) and `W^O` (kernel
    `(h, d_v, d_model)`, two contracted axes) of Sec. 3.2.2, and `W_1`, `W_2` of
    the feed-forward network (Sec. 3.3).

    The weights have the names and shapes that `keras.layers.EinsumDense` and
    `keras.layers.Dense` give them for the same product: `kernel` of shape
    `(*inputs.shape[-contracted:], *units)` and `bias` of shape `units`. Weights
    therefore move one-to-one between this layer and those, e.g. from and into
    `keras.layers.MultiHeadAttention`'s projections.

    `call` reshapes the product to one 2-D matrix multiply (`matmul.dense`).
    TensorFlow runs an einsum such as `abc,cde->abde` as a batch matmul that
    broadcasts the kernel over the batch, so its kernel gradient is a
    `(B, d, h * d_k)` batch of products summed afterwards (B kernel-sized
    tensors written and read per projection); as `(B * T, d) x (d, h * d_k)` it
    is one matrix multiply, which under XLA on a CPU also multiplies no transposed
    operand (see benchmarks/train_throughput.py).

    Args:
        units: the trailing axes of the output and the shape of the bias, an
            int (as `Dense`'s) or a tuple: e.g. `(h, d_k)` for a query
            projection, `d_model` for the attention output.
        contracted: how many trailing input axes the kernel sums over.
        use_bias: whether to add a bias.
        kernel_initializer: initializer of the kernel. The layer draws from its
            own copy of an unseeded one, which would give every layer that shares
            it the same kernel (Keras draws the same values at each call). A
            variance-scaling one (Glorot, He, LeCun) takes the contracted axes
            as fan-in and the others as fan-out, as `EinsumDense` does.
        bias_initializer: initializer of the bias, copied likewise.

    Call arguments:
        inputs: `(..., *kernel.shape[:contracted])`.
        search_options: optional `SearchOptions`; in a search's steps, the layer
            multiplies by the transposed copy of its kernel they hold, if any.

    Returns:
        `(..., *units)`.

    Example:
    >>> layer = Projection((8, 64))
    >>> layer(keras.random.normal((2, 10, 512))).shape
    (2, 10, 8, 64)
    """

    def __init__(
        self,
        units,
        contracted=1,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        sizes = tuple(units) if isinstance(units, (tuple, list)) else (units,)
        if not sizes or any(n is None or n < 1 for n in sizes):
            raise ValueError(
                f"units must be a positive int or a tuple of them. Received: units={units}"
            )
        if contracted < 1:
            raise ValueError(f"contracted must be >= 1. Received: contracted={contracted}")
        self.units = tuple(int(n) for n in sizes)
        self.contracted = contracted
        self.use_bias = use_bias
        self.kernel_initializer = _own_copy(kernel_initializer)
        self.bias_initializer = _own_copy(bias_initializer)

    def build(self, inputs_shape):
        contracted_shape = tuple(inputs_shape)[len(inputs_shape) - self.contracted :]
        if len(inputs_shape) < self.contracted or None in contracted_shape:
            raise ValueError(
                f"Projection with contracted={self.contracted} needs inputs whose last "
                f"{self.contracted} axes are known. Received: inputs_shape={inputs_shape}"
            )
        kernel_shape = contracted_shape + self.units
        self.kernel = self.add_weight(
            name="kernel",
            shape=kernel_shape,
            initializer=_matrix_fans(self.kernel_initializer, self.contracted, len(kernel_shape)),
        )
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias", shape=self.units, initializer=self.bias_initializer
            )

    def call(self, inputs, search_options=None):
        transposed_kernel = (search_options or NO_SEARCH).transposed_kernel(self.kernel)
        return dense(inputs, self.kernel, self.bias, self.contracted, transposed_kernel)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)[: len(inputs_shape) - self.contracted] + self.units

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "contracted": self.contracted,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config


def _own_copy(initializer):
    """A copy of an initializer, unless it draws new values at every call.

    An unseeded Keras initializer picks its seed once and then draws the same values
    at every call; its copy picks a new one. One seeded with a `SeedGenerator`
    advances it at every call, while a copy would restart it.
    """
    initializer = keras.initializers.get(initializer)
    if not isinstance(initializer, keras.initializers.Initializer) or isinstance(
        getattr(initializer, "seed", None), keras.random.SeedGenerator
    ):
        return initializer
    return initializer.__class__.from_config(initializer.get_config())


def _matrix_fans(initializer, contracted, rank):
    """`initializer`, with the fans of the kernel seen as a matrix if it scales by them.

    Keras takes a kernel of rank > 2 for a convolution's unless told its axes; as
    `keras.layers.EinsumDense` does, the contracted axes are the fan-in and the
    others the fan-out (a query kernel `(d_model, h, d_k)`: `d_model` and `h * d_k`).
    The copy keeps the concrete seed, so it draws what `initializer` would.
    """
    if not isinstance(initializer, keras.initializers.VarianceScaling) or (
        initializer.input_axes is not None and initializer.output_axes is not None
    ):
        return initializer
    config = initializer.get_config()
    config["seed"] = initializer.seed
    config["input_axes"] = list(range(contracted))
    config["output_axes"] = list(range(contracted, rank))
    return initializer.__class__.from_config(config)
