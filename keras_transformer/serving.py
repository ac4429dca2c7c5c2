"""The exportable translator: text in, text out, with the paper's decoding.

Sec. 6.1: "we used beam search with a beam size of 4 and length penalty
alpha = 0.6 [...] We set the maximum output length during inference to input
length + 50, but terminate early when possible."

`Translator` is a `tf.Module` whose `tf.function`s hold the whole pipeline:
subword tokenization, the encoder once per source, the cached beam search of
`keras_transformer.decoding`, and detokenization.
`keras_transformer.saved_model.export_translator` saves it as a SavedModel in
the layout TensorFlow Serving reads (`EXPORT_DIR/<version>/`) with these
signatures:

| signature         | inputs                                   | outputs                              |
|-------------------|------------------------------------------|--------------------------------------|
| `serving_default` | `text` string (B,)                       | `translation` string (B,), `score` float32 (B,) |
| `translate`       | `text`, optional `beam_size`, `alpha`, `extra_length` | as `serving_default`   |
| `translate_nbest` | as `translate`                           | `translations` string (B, K), `scores` float32 (B, K) |
| `translate_ids`   | `ids` int32 (B, S), optional knobs       | `ids` int32 (B, T), `score` float32 (B,) |
| `translate_aligned` | as `translate`                         | as `translate`, and the best translation's `target_tokens`, `alignment`, `source_tokens` |
| `score`           | `source`, `target` string (B,)           | `log_prob` (B,), `token_log_probs` (B, T), `target_tokens`, `alignment` (B, T), `source_tokens` (B, S) |

`score` is forced decoding: log P(target | source) (the target's pieces and the
end of sequence, no length penalty) and each piece's; `target_tokens` are the
pieces scored ("" after the end). `alignment` gives, for each, the index into
`source_tokens` of the source piece the last decoder layer's cross-attention
(averaged over heads) weighs most while predicting it; -1 after the end.
`translate_aligned` aligns the beam search's best output the same way.

Optional inputs: the knobs are scalar inputs with defaults in the SignatureDef
(`PlaceholderWithDefault`), which TF Serving's gRPC Predict API may leave out;
its REST API needs every input of a signature with more than one (call
`serving_default`, or send all four of `translate`).

Beam size at run time: one of the sizes traced at export (`beam_sizes`, default
1, 2, 4, 8; `tf.switch_case` picks one); another gets an `InvalidArgument`.
With `jit_compile`, requests are padded to a few shapes, all compiled by the
warm-up requests (`keras_transformer.serving_shapes`); with `xla_max_batch_size`
too, only requests of at most that many sentences (larger ones run the graph).

Request limits (`export --max-batch-size --max-input-chars`, recorded in
`assets.extra/config.json`): a request of more than `max_batch_size` sentences,
or with a sentence of more than `max_input_chars` characters, is refused with
an `InvalidArgument` error naming the limit, before any tokenization or search.

Bad input is answered, not crashed on: runs of whitespace (tabs, newlines,
Unicode spaces) become one space, ends stripped, as in the training text; an
empty or whitespace-only string translates to "" with score 0.0; invalid UTF-8
bytes become U+FFFD; a source longer than `max_input_length` tokens (default: the
model's `max_positions`) is truncated to them; an empty batch gives empty
outputs; a `beam_size` outside the traced set, a negative `extra_length`, a
non-finite `alpha` or ids outside the vocabulary give an `InvalidArgument` error
that says what was received.

Without tensorflow-text (which stock TF Serving links in), `Translator(model,
None)` (`export --ids-only`) exports only signatures that take token ids
(`serving_default` and `translate_ids`). Outputs hold at most
`source tokens + extra_length` tokens (EOS included) and `max_output_length`.
"""

import tensorflow as tf

from keras_transformer import decoding
from keras_transformer import hardware
from keras_transformer import runs
from keras_transformer import serving_shapes
from keras_transformer.token_ids import BOS_ID
from keras_transformer.token_ids import EOS_ID
from keras_transformer.token_ids import PAD_ID

DEFAULT_BEAM_SIZES = (1, 2, 4, 8)
# Request limits: one request holds a model server for about as long as the
# batch takes, and its memory grows with the text's length.
DEFAULT_MAX_BATCH_SIZE = 256
DEFAULT_MAX_INPUT_CHARS = 10_000
TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
SOURCE_SPEC = tf.TensorSpec([None], tf.string, name="source")
TARGET_SPEC = tf.TensorSpec([None], tf.string, name="target")
IDS_SPEC = tf.TensorSpec([None, None], tf.int32, name="ids")
# The decoding settings a caller may give, after the text or ids.
KNOB_SPECS = (
    tf.TensorSpec([], tf.int32, name="beam_size"),
    tf.TensorSpec([], tf.float32, name="alpha"),
    tf.TensorSpec([], tf.int32, name="extra_length"),
)


class Translator(tf.Module):
    """Translates text with a Transformer, as TensorFlow graphs that export.

    Args:
        model: a `keras_transformer.Transformer` (anything with `config`,
            `initial_cache`, `decode_step` and the functional call).
        tokenizer: the `SubwordTokenizer` shared by source and target; None
            for an ids-only translator (`translate_ids`, and `serve` taking
            ids), whose export needs no tensorflow-text ops.
        beam_size: default K (4 in the paper); must be in `beam_sizes`.
        alpha: default length penalty strength (0.6 in the paper).
        extra_length: default number of output tokens allowed beyond the
            source length (50 in the paper).
        max_input_length: sources are truncated to this many tokens; defaults
            to `model.config.max_positions`.
        beam_sizes: the beam sizes callers may ask for at run time; one search
            program is traced for each.
        max_output_length: the most tokens generated for any input; defaults
            to `model.config.max_positions` with learned positions, else
            `max_input_length + extra_length`.
        max_batch_size: the most sentences (or id rows) a request may hold.
        max_input_chars: the most characters a request's sentence may have.
        jit_compile: compile each search with XLA, over the padded shapes of
            `serving_shapes` (batch sizes and source lengths).
        xla_max_batch_size: with `jit_compile`, the largest request (in
            sentences) that runs the XLA search; larger ones run the graph
            search. None: `max_batch_size`. On a CPU XLA is the faster up to 4
            sentences (0.3x to 0.85x the time), about even at 8, slower beyond
            (no finished source leaves a fixed-shape batch).
        use_cache: False re-runs the decoder on the whole prefix every step
            (`Transformer.step_function(use_cache=False)`), for tests and
            benchmarks; not with `jit_compile`.
        ignore_eos: the end-of-sequence token does not end a hypothesis, so
            every search runs to its length limit (benchmarks with random
            weights).
        transposed_kernels: whether searches multiply by transposed copies of
            the decoder's kernels (`Transformer.step_function`); None: where
            that pays on the CPU that traces them
            (`hardware.decoding_transposed_kernels`).
        name: module name.

    The output projection multiplies by a copy of the embedding transposed to
    `(d_model, V)` when the translator is built, in the model's compute dtype
    (saved with an export): build a new translator after the weights change.

    Example:
    ```python
    translator = Translator(model, tokenizer)
    outputs = translator.translate(tf.constant(["In the beginning."]))
    outputs["translation"], outputs["score"]          # (1,) string, (1,) float32
    translator.translate_nbest(texts, beam_size=tf.constant(8))["translations"]  # (B, 8)
    saved_model.export_translator(translator, "exports/en-es")  # exports/en-es/1/
    ```
    """

    def __init__(
        self,
        model,
        tokenizer,
        beam_size=4,
        alpha=0.6,
        extra_length=50,
        max_input_length=None,
        *,
        beam_sizes=DEFAULT_BEAM_SIZES,
        max_output_length=None,
        max_batch_size=DEFAULT_MAX_BATCH_SIZE,
        max_input_chars=DEFAULT_MAX_INPUT_CHARS,
        jit_compile=False,
        xla_max_batch_size=None,
        use_cache=True,
        ignore_eos=False,
        transposed_kernels=None,
        name=None,
    ):
        super().__init__(name=name)
        config = model.config
        if tokenizer is not None and tokenizer.vocab_size != config.vocab_size:
            raise ValueError(
                f"Translator: the tokenizer has {tokenizer.vocab_size} ids but the model "
                f"was built for vocab_size={config.vocab_size}; pass the vocabulary the "
                "model was trained with"
            )
        beam_sizes = tuple(sorted({positive_int("beam_sizes", k) for k in beam_sizes}))
        if beam_size not in beam_sizes:
            raise ValueError(
                f"Translator: beam_size must be one of beam_sizes={beam_sizes}. "
                f"Received: beam_size={beam_size!r}"
            )
        if not (isinstance(extra_length, int) and extra_length >= 0):
            raise ValueError(
                f"Translator: extra_length must be an int >= 0. Received: "
                f"extra_length={extra_length!r}"
            )
        if max_input_length is None:
            max_input_length = config.max_positions
        max_input_length = positive_int("max_input_length", max_input_length)
        if max_output_length is None:
            if config.positional_encoding == "learned":
                max_output_length = config.max_positions
            else:
                max_output_length = max_input_length + extra_length
        max_output_length = positive_int("max_output_length", max_output_length)
        if config.positional_encoding == "learned" and max_output_length > config.max_positions:
            raise ValueError(
                f"Translator: max_output_length={max_output_length} exceeds the "
                f"{config.max_positions} learned decoder positions of the model"
            )
        if xla_max_batch_size is not None and not (
                jit_compile and positive_int("xla_max_batch_size", xla_max_batch_size)
                <= max_batch_size):
            raise ValueError(
                "Translator: xla_max_batch_size needs jit_compile=True and at most "
                f"max_batch_size={max_batch_size}. Received: {xla_max_batch_size!r}")
        if jit_compile and not use_cache:
            raise ValueError(
                "Translator: use_cache=False re-runs the decoder on a prefix that grows "
                "every step, which XLA cannot compile; use jit_compile=False with it"
            )

        # Keras variables wrap tf.Variables. Saved through the model, each would
        # get two handles in the SavedModel's TF1 graph, one never restored, on
        # which TF Serving fails: the module tracks the tf.Variables, not the model.
        object.__setattr__(self, "model", model)
        self.model_variables = [variable.value for variable in model.variables]
        self.tokenizer = tokenizer
        self.beam_size = beam_size
        self.alpha = float(alpha)
        self.extra_length = extra_length
        self.beam_sizes = beam_sizes
        self.max_input_length = max_input_length
        self.max_output_length = max_output_length
        self.max_batch_size = positive_int("max_batch_size", max_batch_size)
        self.max_input_chars = positive_int("max_input_chars", max_input_chars)
        self.jit_compile = bool(jit_compile)
        self.xla_max_batch_size = (xla_max_batch_size or self.max_batch_size) if jit_compile else 0
        # Larger requests run the graph's search: both searches are traced.
        self.xla_small_requests_only = (self.jit_compile
                                        and self.xla_max_batch_size < self.max_batch_size)
        # XLA's padded request shapes (serving_shapes); none without XLA.
        self.batch_sizes = (serving_shapes.batch_sizes(self.xla_max_batch_size,
                                                       self.xla_small_requests_only)
                            if jit_compile else ())
        self.source_lengths = (serving_shapes.source_lengths(max_input_length)
                               if jit_compile else ())
        self.use_cache = bool(use_cache)
        self.ignore_eos = bool(ignore_eos)
        if transposed_kernels is None:
            transposed_kernels = hardware.decoding_transposed_kernels()
        self.transposed_kernels = bool(transposed_kernels)
        # In the layout the logits' product reads fastest; made per search, 43 ms
        # (base model, bfloat16): a tenth of a one-sentence request.
        self.output_kernel = tf.Variable(tf.cast(tf.transpose(model.embedding.embeddings),
                                                 model.embedding.compute_dtype), trainable=False)
        # [graph, XLA] searches (by jit_compile).
        modes = {False, True} if self.xla_small_requests_only else {self.jit_compile}
        self._searches = [[self._search_function(k, xla) for k in beam_sizes if xla in modes]
                          for xla in (False, True)]

        # No autograph: the loops are explicit tf.while_loops, and converting
        # the model's Python code costs most of the tracing time.
        self.translate_ids = self._with_knobs(self._translate_ids, IDS_SPEC)
        if tokenizer is None:
            # The ids-only export: not one tensorflow-text op in its graph.
            self.serve = tf.function(lambda ids: self.translate_ids(ids),
                                     input_signature=[IDS_SPEC], autograph=False)
            return
        self.translate = self._with_knobs(self._translate, TEXT_SPEC)
        self.translate_nbest = self._with_knobs(self._translate_nbest, TEXT_SPEC)
        self.translate_aligned = self._with_knobs(self._translate_aligned, TEXT_SPEC)
        self.score = tf.function(self._score, input_signature=[SOURCE_SPEC, TARGET_SPEC],
                                 autograph=False)
        # The paper's settings, text only: the REST-friendly signature.
        self.serve = tf.function(lambda text: self.translate(text),
                                 input_signature=[TEXT_SPEC], autograph=False)

    @classmethod
    def from_run(cls, run_dir, weights="averaged", **kwargs):
        """A translator for a training run directory (see `runs.load_run`)."""
        model, tokenizer, _ = runs.load_run(run_dir, weights)
        return cls(model, tokenizer, **kwargs)

    @property
    def ids_only(self):
        """True without a tokenizer: only `translate_ids` (and `serve` on ids)."""
        return self.tokenizer is None

    def signatures(self):
        """The SavedModel signatures, by name."""
        if self.ids_only:
            return {"serving_default": self.serve, "translate_ids": self.translate_ids}
        return {
            "serving_default": self.serve,
            "translate": self.translate,
            "translate_ids": self.translate_ids,
            "translate_nbest": self.translate_nbest,
            "translate_aligned": self.translate_aligned,
            "score": self.score,
        }

    def settings(self):
        """The decoding settings, as JSON-ready values."""
        return {
            "beam_size": self.beam_size,
            "alpha": self.alpha,
            "extra_length": self.extra_length,
            "beam_sizes": list(self.beam_sizes),
            "max_input_length": self.max_input_length,
            "max_output_length": self.max_output_length,
            "max_batch_size": self.max_batch_size,
            "max_input_chars": self.max_input_chars,
            "precision": self.model.precision,
            "jit_compile": self.jit_compile,
            "xla_max_batch_size": self.xla_max_batch_size,
            "padded_batch_sizes": list(self.batch_sizes),
            "padded_source_lengths": list(self.source_lengths),
            "use_cache": self.use_cache,
            "ignore_eos": self.ignore_eos,
            "transposed_kernels": self.transposed_kernels,
            "ids_only": self.ids_only,
        }

    # Signatures --------------------------------------------------------------

    def _with_knobs(self, body, input_spec):
        """`body(inputs, beam_size, alpha, extra_length)` as a `tf.function` whose
        knobs are optional inputs defaulting to this translator's settings,
        which become the SignatureDef's defaults."""
        beam_size = tf.constant(self.beam_size, tf.int32)
        alpha = tf.constant(self.alpha, tf.float32)
        extra_length = tf.constant(self.extra_length, tf.int32)
        if input_spec.name == "ids":
            def function(ids, beam_size=beam_size, alpha=alpha, extra_length=extra_length):
                return body(ids, beam_size, alpha, extra_length)
        else:
            def function(text, beam_size=beam_size, alpha=alpha, extra_length=extra_length):
                return body(text, beam_size, alpha, extra_length)
        function.__doc__ = body.__doc__
        return tf.function(function, input_signature=[input_spec, *KNOB_SPECS], autograph=False)

    def _translate(self, text, beam_size, alpha, extra_length):
        """Best translation and its score: `{"translation": (B,), "score": (B,)}`."""
        ids, scores, lengths = self._search(self._tokens(text), beam_size, alpha, extra_length)
        empty = tf.equal(lengths, 0)  # (B,)
        return {
            "translation": tf.where(empty, "", self.tokenizer.detokenize(ids[:, 0])),
            "score": tf.where(empty, 0.0, scores[:, 0]),
        }

    def _translate_nbest(self, text, beam_size, alpha, extra_length):
        """The K best: `{"translations": (B, K), "scores": (B, K)}`, best first."""
        ids, scores, lengths = self._search(self._tokens(text), beam_size, alpha, extra_length)
        shape = tf.shape(ids)  # (B, K, T)
        texts = self.tokenizer.detokenize(tf.reshape(ids, [-1, shape[2]]))
        texts = tf.reshape(texts, shape[:2])  # (B, K)
        empty = tf.equal(lengths, 0)[:, tf.newaxis]  # (B, 1)
        first = tf.range(shape[1]) == 0  # (K,)
        # An empty source has one hypothesis, the empty one.
        return {
            "translations": tf.where(empty | (scores == float("-inf")), "", texts),
            "scores": tf.where(empty, tf.where(first, 0.0, float("-inf")), scores),
        }

    def _translate_aligned(self, text, beam_size, alpha, extra_length):
        """The best translation, its score, and each of its pieces' source piece."""
        tokens = self._tokens(text)
        ids, scores, lengths = self._search(tokens, beam_size, alpha, extra_length)
        best = ids[:, 0]  # (B, T): the pieces, EOS, padding
        outputs = self._forced(tokens, best)
        empty = tf.equal(lengths, 0)
        return {
            "translation": tf.where(empty, "", self.tokenizer.detokenize(best)),
            "score": tf.where(empty, 0.0, scores[:, 0]),
            "target_tokens": outputs["target_tokens"],
            "alignment": outputs["alignment"],
            "source_tokens": outputs["source_tokens"],
        }

    def _score(self, source, target):
        """Forced decoding: log P(target | source), per sentence and per piece."""
        source_tokens = self._tokens(source)
        target_ids = tf.cast(self._tokens(target), tf.int32)
        # The pieces to predict: the target's, then EOS (it ends the sentence).
        predicted = tf.concat(
            [target_ids, tf.fill([target_ids.nrows(), 1], EOS_ID)], axis=1).to_tensor(PAD_ID)
        tf.debugging.assert_equal(
            tf.shape(source_tokens.row_lengths()), tf.shape(target_ids.row_lengths()),
            message="score: source and target must hold as many sentences")
        return self._forced(source_tokens, predicted)

    def _forced(self, source_tokens, predicted):
        """Teacher-forces `predicted` (B, T) ids (EOS included, padded with 0)
        after ragged source tokens; see `score` for the outputs."""
        source_ids = tf.cast(source_tokens, tf.int32)[:, : self.max_input_length].to_tensor(
            PAD_ID)  # (B, S)
        source_ids = tf.pad(source_ids, [[0, 0], [0, tf.maximum(1 - tf.shape(source_ids)[1], 0)]])
        real = tf.not_equal(predicted, PAD_ID)  # (B, T)
        # BOS, then the pieces before each predicted one: padding where nothing is predicted.
        decoder_inputs = tf.concat(
            [tf.fill([tf.shape(predicted)[0], 1], BOS_ID), predicted[:, :-1]], axis=1)
        decoder_inputs = tf.where(real, decoder_inputs, PAD_ID)
        memory = self.model.initial_cache(source_ids)
        logits, weights = self.model.decode(decoder_inputs, memory,
                                            return_attention_scores=True, training=False)
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))  # (B, T, V)
        token_log_probs = tf.where(real, tf.gather(log_probs, predicted, batch_dims=2), 0.0)
        attention = tf.reduce_mean(
            tf.cast(weights[-1]["cross_attention"], tf.float32), axis=1)  # (B, T, S)
        alignment = tf.where(real, tf.argmax(attention, axis=-1, output_type=tf.int32), -1)
        source_real = tf.not_equal(source_ids, PAD_ID)
        return {
            "log_prob": tf.reduce_sum(token_log_probs, axis=1),
            "token_log_probs": token_log_probs,
            "target_tokens": tf.where(real, self.tokenizer.id_to_token(predicted), ""),
            "alignment": alignment,
            "source_tokens": tf.where(source_real, self.tokenizer.id_to_token(source_ids), ""),
        }

    def _translate_ids(self, ids, beam_size, alpha, extra_length):
        """Ids in, ids out: `{"ids": (B, T), "score": (B,)}`, without BOS/EOS."""
        vocab_size = self.model.config.vocab_size
        ids = self._within_batch_limit(ids)
        tf.debugging.assert_greater_equal(
            ids, 0, message="translate_ids: ids must be >= 0 (0 is padding)")
        tf.debugging.assert_less(
            ids, vocab_size, message=f"translate_ids: ids must be < vocab_size={vocab_size}"
        )
        tokens = tf.RaggedTensor.from_tensor(ids, padding=PAD_ID)
        best, scores, lengths = self._search(tokens, beam_size, alpha, extra_length)
        empty = tf.equal(lengths, 0)[:, tf.newaxis]  # (B, 1)
        best = best[:, 0]  # (B, T)
        best = tf.where(tf.equal(best, EOS_ID) | empty, PAD_ID, best)
        # The longest hypothesis; max(.., 0) for an empty batch.
        width = tf.maximum(
            tf.reduce_max(tf.reduce_sum(tf.cast(best != PAD_ID, tf.int32), axis=1)), 0
        )
        return {
            "ids": best[:, :width],
            "score": tf.where(empty[:, 0], 0.0, scores[:, 0]),
        }

    # Pipeline ----------------------------------------------------------------

    def _within_batch_limit(self, inputs):
        """`inputs`, once their batch is known to be within `max_batch_size`."""
        check = tf.debugging.assert_less_equal(
            tf.shape(inputs)[0], self.max_batch_size,
            message=f"the request holds more than max_batch_size={self.max_batch_size} "
                    "sentences (a limit set at export); split it. Sentences received:")
        with tf.control_dependencies([check]):
            return tf.identity(inputs)

    def _tokens(self, text):
        """Ragged subword ids `(B, None)` of a request's text, once it is within
        the limits."""
        # The limits first: nothing else runs on a request over them.
        text = self._within_batch_limit(text)
        longest = tf.reduce_max(  # 0 for an empty batch
            tf.concat([tf.strings.length(text, unit="UTF8_CHAR"), [0]], axis=0))
        check = tf.debugging.assert_less_equal(
            longest, self.max_input_chars,
            message=f"a sentence of the request is longer than max_input_chars="
                    f"{self.max_input_chars} characters (a limit set at export). Longest:")
        with tf.control_dependencies([check]):
            text = tf.identity(text)
        # Sentencepiece would replace invalid bytes too; doing it here makes
        # the behaviour ours, whatever the tokenizer does.
        text = tf.strings.unicode_transcode(
            text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)
        # Runs of whitespace (tabs, newlines, Unicode spaces) become one space,
        # none at the ends, as in the training text: whitespace-only is empty.
        text = tf.strings.regex_replace(text, r"[\s\pZ]+", " ")
        text = tf.strings.regex_replace(text, r"^ | $", "")
        return self.tokenizer.tokenize(text)

    def _search(self, tokens, beam_size, alpha, extra_length):
        """Beam search over ragged source tokens `(B, None)`.

        Returns ids `(B, K, T)` (EOS included, padding after), scores `(B, K)`
        and the source lengths `(B,)` after truncation.
        """
        tf.debugging.assert_non_negative(extra_length,
                                         message="extra_length must be >= 0; received")
        tf.debugging.assert_all_finite(alpha, message="alpha must be finite; received")
        # No more than the output limit, so that adding lengths cannot overflow.
        extra_length = tf.minimum(extra_length, self.max_output_length)
        tokens = tf.cast(tokens, tf.int32)[:, : self.max_input_length]
        lengths = tf.cast(tokens.row_lengths(), tf.int32)  # (B,)
        batch_size = tf.shape(lengths)[0]

        def search(xla):
            return self._padded_search(xla, tokens, lengths, beam_size, alpha, extra_length)
        if self.xla_small_requests_only:
            ids, scores = tf.cond(batch_size <= self.xla_max_batch_size,
                                  lambda: search(True), lambda: search(False))
        else:
            ids, scores = search(self.jit_compile)
        return ids[:batch_size], scores[:batch_size], lengths

    def _padded_search(self, xla, tokens, lengths, beam_size, alpha, extra_length):
        """The search of `beam_size` (with XLA or not) over the padded request:
        ids and scores of the padded batch."""
        source_ids, output_limits, longest_output = serving_shapes.padded_request(
            self, xla, tokens, lengths, extra_length)
        searches = self._searches[xla]
        sizes = tf.constant(self.beam_sizes, tf.int32)
        check = tf.debugging.Assert(
            tf.reduce_any(tf.equal(beam_size, sizes)),
            [f"beam_size must be one of {list(self.beam_sizes)} (the sizes traced at "
             "export); received", beam_size],
        )
        args = (source_ids, output_limits, longest_output, alpha)
        with tf.control_dependencies([check]):
            if len(searches) == 1:
                return searches[0](*args)
            index = tf.argmax(tf.cast(tf.equal(beam_size, sizes), tf.int32), output_type=tf.int32)
        return tf.switch_case(index, [lambda search=search: search(*args) for search in searches])

    def _search_function(self, beam_size, jit_compile):
        """The beam search for one K, a tf.function over padded source ids."""
        model = self.model
        vocab_size = model.config.vocab_size

        def search(source_ids, output_limits, longest_output, alpha):
            batch_size = tf.shape(source_ids)[0]
            # The encoder runs once per source; the K hypotheses of a source share its cache.
            cache = model.initial_cache(
                source_ids, longest_output if self.use_cache else None, beam_size)
            return decoding.beam_search(
                model.step_function(self.use_cache, self.output_kernel, write_cache_in_place=True,
                                    transposed_kernels=self.transposed_kernels),
                tf.fill([batch_size], BOS_ID),
                cache,
                vocab_size=vocab_size,
                max_output_length=longest_output,
                eos_id=EOS_ID,
                beam_size=beam_size,
                alpha=alpha,
                max_output_lengths=output_limits,
                padding_id=PAD_ID,
                ignore_eos=self.ignore_eos,
                reorder_cache=model.reorder_cache,
                # Finished sources leave the batch; XLA's shapes cannot change.
                select_examples=None if jit_compile else model.select_examples,
            )

        return tf.function(
            search,
            jit_compile=jit_compile,
            autograph=False,
            input_signature=[
                tf.TensorSpec([None, None], tf.int32),  # source_ids (B, S)
                tf.TensorSpec([None], tf.int32),  # output_limits (B,)
                tf.TensorSpec([], tf.int32),  # longest_output T (a constant for XLA)
                tf.TensorSpec([], tf.float32),  # alpha
            ],
        )


def positive_int(name, value):
    """`value`, checked to be an int >= 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int. Received: {name}={value!r}")
    return value
