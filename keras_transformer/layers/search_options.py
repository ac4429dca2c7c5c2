"""How a search's decoding steps run: `SearchOptions`, passed down the decoder."""

import dataclasses
import types
import typing


# eq=False: hashed and compared by identity (its tensors have no truth value), so
# that it may also be an argument of a tf.function.
@dataclasses.dataclass(frozen=True, eq=False)
class SearchOptions:
    """Inference-only ways of running a search's decoding steps, with the same numbers.

    A search (`decoding.beam_search`, `greedy_search`) runs the decoder with fixed
    weights and no gradients, and hands each cache to one step only. Its steps
    pass these options down the decoder: `Transformer.decode_step` to every
    `TransformerDecoderLayer`, which passes them to its `MultiHeadAttention`
    layers and its `PositionwiseFeedForward`, and those to their `Projection`s
    (`layers/matmul.py`) and to the cache writes (`layers/kv_cache.py`). Without
    options (None: in training and every other call) each runs its plain path,
    `NO_SEARCH`, the twin that tests compare these with. `Transformer.step_function`
    builds them once per search.

    Attributes:
        write_cache_in_place: each step writes its positions into the
            self-attention cache it is given instead of into a copy (in a
            TensorFlow graph outside XLA; elsewhere nothing changes): only for
            a search that never reads a cache twice (`kv_cache.write`).
        integer_transposes: the attention's transposes move floats as integers
            of their width (TensorFlow's own kernel, in a graph outside XLA;
            `matmul.transpose`). They have no gradient.
        transposed_kernels: `transposed_copy`s of the decoder's kernels, keyed
            by the kernel's `path`; a `Projection` whose kernel has one
            multiplies by it, `x W^T` (not under XLA; `matmul.dense`). Only for
            weights that do not change while the options are in use.

    Example:
    >>> options = SearchOptions(write_cache_in_place=True)
    >>> logits, cache = model.decode_step(ids, cache, step, search_options=options)
    """

    write_cache_in_place: bool = False
    integer_transposes: bool = True
    transposed_kernels: typing.Mapping[str, typing.Any] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({}))

    def transposed_kernel(self, kernel):
        """The transposed copy of `kernel` (a weight), or None if there is none."""
        return self.transposed_kernels.get(kernel.path)


# What a call without options runs: every plain path.
NO_SEARCH = SearchOptions(integer_transposes=False)
