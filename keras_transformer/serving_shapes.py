"""How a request is padded for the search (`RequestShapes`), the padded shapes
of an XLA export, and warm-up requests that cover them.

XLA compiles the beam search once per shape. An export with `jit_compile` pads
every request (or, with `xla_max_batch_size`, every request that XLA runs) up to
one of a small fixed set of shapes, its rows and its
source length each on a geometric grid (`batch_sizes`, `source_lengths`), and
its output buffer the padded source length plus the export's `extra_length`
(a request's larger `extra_length` is cut to it); its TF Serving warm-up
requests hold one request of each shape (`warmup_requests`), so that the model
server compiles them all while it loads the version and no live request waits
for a compile. On a GPU the padding costs little: a step's time hardly grows
with its rows at these sizes, and the loop stops when every hypothesis has
finished, whatever the buffer's length. On a CPU it does grow with them, so
an export that runs only small requests through XLA (`xla_max_batch_size`)
pads their rows to powers of `SMALL_BATCH_GROWTH` (1, 2, 4, ...), which costs
less than the powers of `BATCH_GROWTH` there (`benchmarks/serving_latency.py`).
"""

import tensorflow as tf

from keras_transformer.token_ids import PAD_ID

BATCH_GROWTH = 4  # rows 1, 4, 16, 64, 256
SMALL_BATCH_GROWTH = 2  # rows 1, 2, 4, 8, ... up to xla_max_batch_size
SHORTEST_SOURCE = 16  # source lengths 16, 32, 64, 128, 256
SOURCE_GROWTH = 2
# Without XLA, sources are padded to a multiple of this many tokens.
SOURCE_LENGTH_GRANULARITY = 8


def batch_sizes(max_batch_size, small_requests_only=False):
    """The padded batch sizes: powers of `BATCH_GROWTH` (`SMALL_BATCH_GROWTH` for an
    export that runs only small requests through XLA), then `max_batch_size`."""
    growth = SMALL_BATCH_GROWTH if small_requests_only else BATCH_GROWTH
    return _grid(1, growth, max_batch_size)


def source_lengths(max_input_length):
    """The padded source lengths: `SHORTEST_SOURCE` doubling, then `max_input_length`."""
    return _grid(SHORTEST_SOURCE, SOURCE_GROWTH, max_input_length)


def pad_to(sizes, value):
    """The smallest of the sorted `sizes` that holds the int32 scalar `value`
    (which must be at most the last)."""
    sizes = tf.constant(sizes, tf.int32)
    return tf.gather(sizes, tf.searchsorted(sizes, value[tf.newaxis], side="left")[0])


class RequestShapes:
    """The shapes and batching policy of a translator's searches, from its
    resolved `DecodingConfig` (`max_input_length` and `max_output_length` set).

    Attributes:
        xla: whether requests run an XLA search (some, with `xla_max_batch_size`).
        xla_max_batch_size: the largest request that runs the XLA search; 0
            without XLA.
        xla_small_requests_only: larger requests run the graph's search; both
            searches are traced.
        batch_sizes, source_lengths: XLA's padded request shapes; () without XLA.
    """

    def __init__(self, config):
        self.config = config
        self.xla = config.xla
        self.xla_max_batch_size = (
            (config.xla_max_batch_size or config.max_batch_size) if self.xla else 0)
        self.xla_small_requests_only = (
            self.xla and self.xla_max_batch_size < config.max_batch_size)
        self.batch_sizes = (batch_sizes(self.xla_max_batch_size, self.xla_small_requests_only)
                            if self.xla else ())
        self.source_lengths = source_lengths(config.max_input_length) if self.xla else ()

    def padded(self, xla, tokens, lengths, extra_length):
        """A request of ragged source `tokens` `(B, None)` (their `lengths` `(B,)`)
        padded for the search with XLA or without: source ids `(B', S)`, each
        row's output limit `(B',)` and the output buffer's length. With XLA, B'
        and S are among `batch_sizes` and `source_lengths`, and the buffer holds
        the export's `extra_length` tokens more; without, B' = B (at least 1)
        and S is a multiple of `SOURCE_LENGTH_GRANULARITY`."""
        config = self.config
        batch_size = tf.shape(lengths)[0]
        # At least one row, so that an empty batch decodes one empty source.
        padded_batch = tf.maximum(batch_size, 1)
        longest = tf.maximum(tf.reduce_max(lengths), 1)  # (the max of none is INT_MIN)
        if xla:
            padded_batch = pad_to(self.batch_sizes, padded_batch)
            width = pad_to(self.source_lengths, longest)
            # One output buffer per padded shape: the export's extra_length.
            longest_output = tf.minimum(width + config.extra_length, config.max_output_length)
        else:
            granularity = SOURCE_LENGTH_GRANULARITY
            width = tf.minimum((longest + granularity - 1) // granularity * granularity,
                               config.max_input_length)
            width = tf.maximum(width, longest)
            longest_output = tf.clip_by_value(width + extra_length, 1, config.max_output_length)
        source_ids = tokens.to_tensor(PAD_ID, shape=tf.stack([padded_batch, width]))  # (B', S)
        padded_lengths = tf.pad(lengths, [[0, padded_batch - batch_size]])  # (B',)
        # Sec. 6.1: at most input length + 50 tokens; an empty source stops after one step.
        output_limits = tf.where(padded_lengths > 0, padded_lengths + extra_length, 1)
        return source_ids, output_limits, longest_output


def warmup_requests(translator, texts):
    """`[(signature, inputs)]`: one `serving_default` request of every padded
    shape of `translator` (a jit-compiled `serving.Translator`); every
    signature runs the same compiled programs. Its first sentence is made of
    the words of `texts`, repeated until it has the shape's source length in
    tokens (one more than the next shorter length, at least), and the other
    rows are empty, which finish at the first step; an ids-only translator
    gets ids. No scalar knobs: TF Serving's batching replays warm-up requests
    too, and it batches only inputs with a batch dimension."""
    requests = []
    words = " ".join(texts).split() or ["Hello."]
    lengths = source_lengths(translator.config.max_input_length)
    for shorter, length in zip((0, *lengths), lengths):
        if translator.ids_only:
            name, empty = "ids", [0] * length
            first = [4 + i % (translator.model.config.vocab_size - 4) for i in range(length)]
        else:
            name, empty = "text", ""
            first = _sentence(translator.tokenizer, words, shorter + 1, length)
        requests += [("serving_default", {name: [first] + [empty] * (rows - 1)})
                     for rows in translator.shapes.batch_sizes]
    return requests


def _sentence(tokenizer, words, at_least, at_most):
    """The shortest prefix of `words` (cycled) that tokenizes to a length in
    `[at_least, at_most]` tokens."""
    count = 0
    while True:
        count += 1
        sentence = " ".join(words[i % len(words)] for i in range(count))
        tokens = int(tokenizer.tokenize(tf.constant([sentence])).row_lengths()[0])
        if tokens >= at_least:
            if tokens > at_most:  # one word of many pieces jumped past the range
                raise ValueError(
                    f"no prefix of the warm-up sentences tokenizes to {at_least}..{at_most} "
                    "tokens; give warm-up sentences of shorter words")
            return sentence


def _grid(start, growth, last):
    sizes = []
    size = start
    while size < last:
        sizes.append(size)
        size *= growth
    return tuple(sizes) + (last,)
