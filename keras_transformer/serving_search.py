"""A translator's beam searches: one traced program per beam size it offers, with
XLA or without, over the model's step function and the padded requests of
`serving_shapes`.

Beam size at run time: one of the sizes traced (`DecodingConfig.beam_sizes`;
`tf.switch_case` picks one); another gets an `InvalidArgument`. With XLA (and
`xla_max_batch_size`), requests of at most that many sentences run the XLA
search and larger ones the graph's; without XLA, finished sources leave the
batch as they finish (`Transformer.select_examples`), and a request's sources
are split into up to `DecodingConfig.parallel_searches` searches that run side by
side (`side_by_side`).
"""

import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.token_ids import BOS_ID
from keras_transformer.token_ids import EOS_ID
from keras_transformer.token_ids import PAD_ID


class BeamSearches:
    """The searches of a `serving.Translator`, called inside its graphs.

    Args:
        model: the `Transformer` (its `initial_cache`, `step_function`,
            `reorder_cache` and `select_examples`).
        config: the translator's resolved `DecodingConfig`.
        output_kernel: the embedding transposed to `(d_model, V)`, a variable
            the translator keeps (and saves).
        output_bias: None, or zeros `(V,)` for the logits' product, a variable
            the translator keeps (`Transformer.decode`).
        shapes: the translator's `serving_shapes.RequestShapes`.
        word_starts: None, or bool `(V,)`, which pieces start a word, to block
            runs of words repeated right after themselves
            (`DecodingConfig.block_adjacent_repeats`).
        stutters: None, or bool `(V,)`, which pieces inside a word may not
            come three times in a row (with `word_starts`).
    """

    def __init__(self, model, config, output_kernel, output_bias, shapes, word_starts=None,
                 stutters=None):
        self.model = model
        self.config = config
        self.shapes = shapes
        self.word_starts = word_starts
        self.stutters = stutters
        modes = {False, True} if shapes.xla_small_requests_only else {shapes.xla}
        # [graph, XLA] searches, one per beam size.
        self.traced = [[self._traced(k, xla, output_kernel, output_bias)
                        for k in config.beam_sizes if xla in modes] for xla in (False, True)]

    def __call__(self, tokens, beam_size, alpha, extra_length, no_repeat_ngram_size):
        """Beam search over ragged source tokens `(B, None)`.

        Returns ids `(B, K, T)` (EOS included, padding after), scores `(B, K)`
        and the source lengths `(B,)` after truncation.
        """
        config = self.config
        tf.debugging.assert_non_negative(extra_length,
                                         message="extra_length must be >= 0; received")
        tf.debugging.assert_all_finite(alpha, message="alpha must be finite; received")
        tf.debugging.assert_non_negative(
            no_repeat_ngram_size, message="no_repeat_ngram_size must be >= 0 (0 blocks "
            "nothing); received")
        # No more than the output limit, so that adding lengths cannot overflow.
        extra_length = tf.minimum(extra_length, config.max_output_length)
        tokens = tf.cast(tokens, tf.int32)[:, : config.max_input_length]
        lengths = tf.cast(tokens.row_lengths(), tf.int32)  # (B,)
        batch_size = tf.shape(lengths)[0]

        def search(xla):
            return self._padded(xla, tokens, lengths, beam_size, alpha, extra_length,
                                no_repeat_ngram_size)
        if self.shapes.xla_small_requests_only:
            ids, scores = tf.cond(batch_size <= self.shapes.xla_max_batch_size,
                                  lambda: search(True), lambda: search(False))
        else:
            ids, scores = search(self.shapes.xla)
        return ids[:batch_size], scores[:batch_size], lengths

    def _padded(self, xla, tokens, lengths, beam_size, alpha, extra_length,
                no_repeat_ngram_size):
        """The search of `beam_size` (with XLA or not) over the padded request:
        ids and scores of the padded batch."""
        source_ids, output_limits, longest_output = self.shapes.padded(
            xla, tokens, lengths, extra_length)
        searches = self.traced[xla]
        sizes = tf.constant(self.config.beam_sizes, tf.int32)
        check = tf.debugging.Assert(
            tf.reduce_any(tf.equal(beam_size, sizes)),
            [f"beam_size must be one of {list(self.config.beam_sizes)} (the sizes traced at "
             "export); received", beam_size],
        )
        with tf.control_dependencies([check]):
            index = tf.argmax(tf.cast(tf.equal(beam_size, sizes), tf.int32), output_type=tf.int32)

        def search(source_ids, output_limits):
            args = (source_ids, output_limits, longest_output, alpha, no_repeat_ngram_size)
            if len(searches) == 1:
                with tf.control_dependencies([check]):
                    return searches[0](*args)
            return tf.switch_case(index, [lambda search=search: search(*args)
                                          for search in searches])

        most = 1 if xla else self.config.parallel_searches
        return side_by_side(search, source_ids, output_limits, most)

    def _traced(self, beam_size, jit_compile, output_kernel, output_bias):
        """The beam search for one K, a tf.function over padded source ids."""
        model, config = self.model, self.config

        def search(source_ids, output_limits, longest_output, alpha, no_repeat_ngram_size):
            batch_size = tf.shape(source_ids)[0]
            # The encoder runs once per source; the K hypotheses of a source share its cache.
            cache = model.initial_cache(
                source_ids, longest_output if config.use_cache else None, beam_size)

            def run(size):
                return decoding.beam_search(
                    model.step_function(config.use_cache, output_kernel,
                                        write_cache_in_place=True,
                                        transposed_kernels=config.transposed_kernels,
                                        output_bias=output_bias),
                    tf.fill([batch_size], BOS_ID),
                    cache,
                    vocab_size=model.config.vocab_size,
                    max_output_length=longest_output,
                    eos_id=EOS_ID,
                    beam_size=beam_size,
                    alpha=alpha,
                    max_output_lengths=output_limits,
                    padding_id=PAD_ID,
                    no_repeat_ngram_size=size,
                    block_adjacent_repeats=self.word_starts,
                    block_stutters=self.stutters,
                    ignore_eos=config.ignore_eos,
                    reorder_cache=model.reorder_cache,
                    # Finished sources leave the batch; XLA's shapes cannot change.
                    select_examples=None if jit_compile else model.select_examples,
                )

            if jit_compile:  # one program per shape, its per-step condition compiled in
                return run(no_repeat_ngram_size)
            # Without XLA, a condition in every step costs 3% of the search
            # (benchmarks/decode_throughput.py): the request chooses the search once.
            return tf.cond(no_repeat_ngram_size > 0, lambda: run(no_repeat_ngram_size),
                           lambda: run(0))

        return tf.function(
            search,
            jit_compile=jit_compile,
            autograph=False,
            # Not inlined into its callers: a request split into searches side by side
            # calls it once for each share, and TensorFlow would otherwise optimize a
            # copy of its graph for each call site when a signature is first called.
            experimental_attributes=None if jit_compile else {"_noinline": True},
            input_signature=[
                tf.TensorSpec([None, None], tf.int32),  # source_ids (B, S)
                tf.TensorSpec([None], tf.int32),  # output_limits (B,)
                tf.TensorSpec([], tf.int32),  # longest_output T (a constant for XLA)
                tf.TensorSpec([], tf.float32),  # alpha
                tf.TensorSpec([], tf.int32),  # no_repeat_ngram_size
            ],
        )


def search_counts(most):
    """How many searches `side_by_side` may split a request into: the powers of
    two below `most`, and `most`."""
    return sorted({most} | {2 ** i for i in range(most.bit_length()) if 2 ** i < most})


def side_by_side(search, source_ids, output_limits, most):
    """`search(source_ids (B, S), output_limits (B,))`, which returns ids
    `(B, K, T)` and scores `(B, K)`, run as n searches over consecutive shares
    of the B sources (sizes differing by at most one), which TensorFlow runs side
    by side: n the largest of `search_counts(most)` that is at most B. The
    sources of a beam search are independent, so the result is the single
    search's, its ids padded to the longest share's T."""
    counts = search_counts(most)
    if counts == [1]:
        return search(source_ids, output_limits)
    batch_size = tf.shape(source_ids)[0]
    index = tf.reduce_sum(tf.cast(tf.constant(counts) <= batch_size, tf.int32)) - 1

    def split(n):
        if n == 1:
            return search(source_ids, output_limits)
        sizes = batch_size // n + tf.cast(tf.range(n) < batch_size % n, tf.int32)
        shares = [search(ids, limits) for ids, limits in zip(
            tf.split(source_ids, sizes, num=n), tf.split(output_limits, sizes, num=n))]
        length = tf.reduce_max(tf.stack([tf.shape(ids)[2] for ids, _ in shares]))
        ids = [tf.pad(ids, [[0, 0], [0, 0], [0, length - tf.shape(ids)[2]]],
                      constant_values=PAD_ID) for ids, _ in shares]
        return tf.concat(ids, 0), tf.concat([scores for _, scores in shares], 0)

    return tf.switch_case(index, [lambda n=n: split(n) for n in counts])
