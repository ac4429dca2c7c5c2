import keras
from keras import ops

_GOLDEN = 0x9E3779B9  # 2^32 / golden ratio, spreads a seed word over all bits


def check_rate(value, name="dropout_rate"):
    """Raises a ValueError naming `name` unless `value` is a dropout rate in [0, 1)."""
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1). Received: {name}={value}")


def _uint32(value):
    return ops.cast(value, "uint32")


def _mix(x):
    """The "lowbias32" integer hash (C. Wellons, 2018) of uint32 `x`: each output
    bit flips with probability ~1/2 when any input bit flips."""
    x = ops.bitwise_xor(x, ops.right_shift(x, _uint32(16)))
    x = ops.multiply(x, _uint32(0x7FEB352D))
    x = ops.bitwise_xor(x, ops.right_shift(x, _uint32(15)))
    x = ops.multiply(x, _uint32(0x846CA68B))
    return ops.bitwise_xor(x, ops.right_shift(x, _uint32(16)))


def random_bits(shape, seed):
    """uint32 random bits of `shape`: a hash of each element's index and a seed.

    Args:
        shape: the output shape (fewer than 2^31 elements).
        seed: an integer tensor of two words, e.g. `SeedGenerator.next()`.

    Returns:
        uint32 tensor of `shape`; each seed gives another, reproducible, stream.
    """
    seed = _uint32(seed)
    # Mix the two seed words into two keys, then the index with both keys.
    key0 = _mix(ops.add(seed[0], _uint32(_GOLDEN)))
    key1 = _mix(ops.bitwise_xor(ops.multiply(seed[1], _uint32(_GOLDEN)), key0))
    count = ops.prod(ops.convert_to_tensor(shape))
    index = _uint32(ops.arange(count, dtype="int32"))
    bits = _mix(ops.add(_mix(ops.bitwise_xor(index, key0)), key1))
    return ops.reshape(bits, shape)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(keras.layers.Layer):
    """Inverted dropout (Srivastava et al., 2014) with hashed random bits.

    In training each element is zeroed with probability `rate` and the others
    are scaled by `1 / (1 - rate)`; outside training the layer is the identity,
    as `keras.layers.Dropout`. The mask comes from `random_bits`, a hash of each
    element's index and a seed drawn from the layer's `SeedGenerator` on every
    call, kept where the bits are at least `rate * 2^32` (so the rate is exact to
    2^-32). Keras's own dropout draws its mask with Philox, which XLA on a CPU
    runs as a loop of 64-bit multiplies, a noticeable share of a base model's
    training step; the hash is 32-bit arithmetic that XLA fuses into the
    neighbouring elementwise work (see benchmarks/train_throughput.py).

    Args:
        rate: the probability of dropping an element, in [0, 1).
        seed: optional int seed of the layer's `SeedGenerator`.

    Call arguments:
        inputs: a float tensor of any shape.
        training: whether to drop.

    Example:
    >>> layer = Dropout(0.5, seed=1)
    >>> x = keras.ops.ones((2, 4))
    >>> bool(keras.ops.all(layer(x) == x))
    True
    """

    def __init__(self, rate, seed=None, **kwargs):
        super().__init__(**kwargs)
        check_rate(rate, "rate")
        self.rate = rate
        self.seed = seed
        if rate > 0:
            self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True
        self.built = True

    def call(self, inputs, training=False):
        if not training or self.rate == 0:
            return inputs
        bits = random_bits(ops.shape(inputs), self.seed_generator.next())
        keep = ops.greater_equal(bits, _uint32(round(self.rate * 2**32)))
        scale = ops.cast(1.0 / (1.0 - self.rate), inputs.dtype)
        return ops.where(keep, ops.multiply(inputs, scale), ops.zeros_like(inputs))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"rate": self.rate, "seed": self.seed})
        return config
