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
| `translate`       | `text`, optional `beam_size`, `alpha`, `extra_length`, `no_repeat_ngram_size` | as `serving_default` |
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
`serving_default`, or send all five of `translate`). `no_repeat_ngram_size` n > 0
keeps a translation from repeating any n-gram of its pieces (0: the paper's
search; the export's default is the run's choice, see `export`).

The settings (beam sizes, defaults, limits, XLA, precision) are one
`DecodingConfig`. Beam size at run time: one of the sizes traced at export
(`beam_sizes`, default 1, 2, 4, 8); another gets an `InvalidArgument`. With
`jit_compile`, requests are padded to a few shapes, all compiled by the warm-up
requests (`keras_transformer.serving_shapes`); with `xla_max_batch_size` too,
only requests of at most that many sentences (larger ones run the graph).

The jobs are split: `serving_text.RequestText` (limits, normalization,
tokenization, detokenization), `serving_search.BeamSearches` (the traced
searches over the model's step function) and `serving_shapes.RequestShapes`
(how requests are padded); this module holds the signatures.

Request limits (`export --max-batch-size --max-input-chars`, recorded in
`assets.extra/config.json`): a request of more than `max_batch_size` sentences,
or with a sentence of more than `max_input_chars` characters, is refused with
an `InvalidArgument` error naming the limit, before any tokenization or search.

Bad input is answered, not crashed on: runs of whitespace (tabs, newlines,
Unicode spaces) become one space, ends stripped, as in the training text; an
empty or whitespace-only string translates to "" with score 0.0; invalid UTF-8
bytes become U+FFFD; a source longer than `max_input_length` tokens (default:
the model's `max_positions`) is truncated to them, and the `truncated` output
of `translate`, `translate_nbest`, `translate_aligned` and `translate_ids` is
true for it; an empty batch gives empty outputs; a `beam_size` outside the
traced set, a negative `extra_length` or `no_repeat_ngram_size`, a non-finite
`alpha` or ids outside the vocabulary give an `InvalidArgument` error that says
what was received.

Without tensorflow-text (which stock TF Serving links in), `Translator(model,
None)` (`export --ids-only`) exports only signatures that take token ids
(`serving_default` and `translate_ids`). Outputs hold at most
`source tokens + extra_length` tokens (EOS included) and `max_output_length`.
"""

import dataclasses

import tensorflow as tf

from keras_transformer import serving_search
from keras_transformer import serving_shapes
from keras_transformer import serving_text
from keras_transformer.decoding_config import DecodingConfig
from keras_transformer.decoding_config import REQUEST_SETTING_DTYPES
from keras_transformer.token_ids import BOS_ID
from keras_transformer.token_ids import EOS_ID
from keras_transformer.token_ids import PAD_ID

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
SOURCE_SPEC = tf.TensorSpec([None], tf.string, name="source")
TARGET_SPEC = tf.TensorSpec([None], tf.string, name="target")
IDS_SPEC = tf.TensorSpec([None, None], tf.int32, name="ids")
# The decoding settings a caller may give, after the text or ids.
KNOB_SPECS = tuple(tf.TensorSpec([], dtype, name=name)
                   for name, dtype in REQUEST_SETTING_DTYPES.items())


class Translator(tf.Module):
    """Translates text with a Transformer, as TensorFlow graphs that export.

    Args:
        model: a `keras_transformer.Transformer` (anything with `config`,
            `initial_cache`, `decode_step` and the functional call).
        tokenizer: the `SubwordTokenizer` shared by source and target; None
            for an ids-only translator (`translate_ids`, and `serve` taking
            ids), whose export needs no tensorflow-text ops.
        config: a `DecodingConfig` (default: the paper's decoding, Sec. 6.1).
            Its "auto" settings are chosen for this machine, its max lengths
            for the model, and with a `precision` the model is cast to it.
        name: module name.
        **settings: `DecodingConfig` fields that replace the config's
            (`Translator(model, tokenizer, beam_sizes=(4,))`).

    Attributes:
        config: the resolved `DecodingConfig`.
        shapes: the `serving_shapes.RequestShapes` of its searches.

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

    def __init__(self, model, tokenizer, config=None, *, name=None, **settings):
        super().__init__(name=name)
        config = _for_model(_decoding_config(config, settings), model.config, tokenizer)
        if config.precision not in (None, model.precision):
            model = model.with_dtype(config.precision)
        config = dataclasses.replace(config, precision=model.precision)
        # Keras variables wrap tf.Variables. Saved through the model, each would
        # get two handles in the SavedModel's TF1 graph, one never restored, on
        # which TF Serving fails: the module tracks the tf.Variables, not the model.
        object.__setattr__(self, "model", model)
        self.model_variables = [variable.value for variable in model.variables]
        self.tokenizer = tokenizer
        self.config = config
        self.shapes = serving_shapes.RequestShapes(config)
        self.text = serving_text.RequestText(tokenizer, config.max_batch_size,
                                             config.max_input_chars, config.recase_capitals)
        # In the layout the logits' product reads fastest; made once per
        # translator, not per search (`benchmarks/serving_latency.py`).
        dtype = model.embedding.compute_dtype
        self.output_kernel = tf.Variable(tf.cast(tf.transpose(model.embedding.embeddings),
                                                 dtype), trainable=False)
        # Zeros that make the 16-bit product oneDNN's fused kernel (`Transformer.decode`):
        # a bfloat16 search 7% faster on a 2-core Zen 5, two searches side by side
        # (benchmarks/decode_throughput.py); a float32 one gains nothing.
        self.output_bias = (tf.Variable(tf.zeros([model.config.vocab_size], dtype),
                                        trainable=False)
                            if dtype in ("bfloat16", "float16") else None)
        # Which pieces start a word, for blocking a run of words repeated right
        # after itself, and which are letters inside a word, for blocking a stutter.
        word_starts = stutters = None
        if config.block_adjacent_repeats:
            pieces = tokenizer.id_to_token(tf.range(model.config.vocab_size))
            word_starts = tf.strings.regex_full_match(pieces, "\u2581.*")
            stutters = tf.strings.regex_full_match(pieces, r"\pL+")
        self.search = serving_search.BeamSearches(model, config, self.output_kernel,
                                                  self.output_bias, self.shapes, word_starts,
                                                  stutters)

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
        """The decoding settings, as JSON-ready values: the resolved config
        (`DecodingConfig.from_dict` reads them back), with `jit_compile` a bool,
        and the padded shapes."""
        return dict(
            self.config.to_dict(),
            jit_compile=self.shapes.xla,
            xla_max_batch_size=self.shapes.xla_max_batch_size,
            padded_batch_sizes=list(self.shapes.batch_sizes),
            padded_source_lengths=list(self.shapes.source_lengths),
            ids_only=self.ids_only,
        )

    # Signatures --------------------------------------------------------------

    def _with_knobs(self, body, input_spec):
        """`body(inputs, beam_size, alpha, extra_length, no_repeat_ngram_size)`
        as a `tf.function` whose knobs are optional inputs defaulting to this
        translator's settings, which become the SignatureDef's defaults."""
        beam_size = tf.constant(self.config.beam_size, tf.int32)
        alpha = tf.constant(self.config.alpha, tf.float32)
        extra_length = tf.constant(self.config.extra_length, tf.int32)
        no_repeat_ngram_size = tf.constant(self.config.no_repeat_ngram_size, tf.int32)
        if input_spec.name == "ids":
            def function(ids, beam_size=beam_size, alpha=alpha, extra_length=extra_length,
                         no_repeat_ngram_size=no_repeat_ngram_size):
                return body(ids, beam_size, alpha, extra_length, no_repeat_ngram_size)
        else:
            def function(text, beam_size=beam_size, alpha=alpha, extra_length=extra_length,
                         no_repeat_ngram_size=no_repeat_ngram_size):
                return body(text, beam_size, alpha, extra_length, no_repeat_ngram_size)
        function.__doc__ = body.__doc__
        return tf.function(function, input_signature=[input_spec, *KNOB_SPECS], autograph=False)

    def _translate(self, text, *settings):
        """Best translation and its score: `{"translation": (B,), "score": (B,),
        "truncated": (B,)}`, the last whether the source was longer than
        `max_input_length` pieces (only its first ones were translated)."""
        tokens = self.text.tokens(text)
        ids, scores, lengths = self.search(tokens, *settings)
        empty = tf.equal(lengths, 0)  # (B,)
        return {
            "translation": tf.where(empty, "", self.text.in_source_case(
                text, self.text.detokenize(ids[:, 0]))),
            "score": tf.where(empty, 0.0, scores[:, 0]),
            "truncated": self._truncated(tokens),
        }

    def _translate_nbest(self, text, *settings):
        """The K best: `{"translations": (B, K), "scores": (B, K)}`, best first,
        and `"truncated"` as `translate`'s."""
        tokens = self.text.tokens(text)
        ids, scores, lengths = self.search(tokens, *settings)
        shape = tf.shape(ids)  # (B, K, T)
        texts = self.text.detokenize(tf.reshape(ids, [-1, shape[2]]))
        texts = self.text.in_source_case(text, tf.reshape(texts, shape[:2]))  # (B, K)
        empty = tf.equal(lengths, 0)[:, tf.newaxis]  # (B, 1)
        first = tf.range(shape[1]) == 0  # (K,)
        # An empty source has one hypothesis, the empty one.
        return {
            "translations": tf.where(empty | (scores == float("-inf")), "", texts),
            "scores": tf.where(empty, tf.where(first, 0.0, float("-inf")), scores),
            "truncated": self._truncated(tokens),
        }

    def _translate_aligned(self, text, *settings):
        """The best translation, its score, `truncated` (as `translate`'s), and
        each of its pieces' source piece."""
        tokens = self.text.tokens(text)
        ids, scores, lengths = self.search(tokens, *settings)
        best = ids[:, 0]  # (B, T): the pieces, EOS, padding
        outputs = self._forced(tokens, best)
        empty = tf.equal(lengths, 0)
        return {
            "translation": tf.where(empty, "", self.text.in_source_case(
                text, self.text.detokenize(best))),
            "score": tf.where(empty, 0.0, scores[:, 0]),
            "truncated": self._truncated(tokens),
            "target_tokens": outputs["target_tokens"],
            "alignment": outputs["alignment"],
            "source_tokens": outputs["source_tokens"],
        }

    def _score(self, source, target):
        """Forced decoding: log P(target | source), per sentence and per piece."""
        source_tokens = self.text.tokens(source)
        target_ids = tf.cast(self.text.tokens(target), tf.int32)
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
        source_ids = tf.cast(source_tokens, tf.int32)[:, : self.config.max_input_length]
        source_ids = source_ids.to_tensor(PAD_ID)  # (B, S)
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
            "target_tokens": tf.where(real, self.text.pieces(predicted), ""),
            "alignment": alignment,
            "source_tokens": tf.where(source_real, self.text.pieces(source_ids), ""),
        }

    def _translate_ids(self, ids, *settings):
        """Ids in, ids out: `{"ids": (B, T), "score": (B,)}`, without BOS/EOS,
        and `"truncated"` as `translate`'s."""
        vocab_size = self.model.config.vocab_size
        ids = self.text.within_batch_limit(ids)
        tf.debugging.assert_greater_equal(
            ids, 0, message="translate_ids: ids must be >= 0 (0 is padding)")
        tf.debugging.assert_less(
            ids, vocab_size, message=f"translate_ids: ids must be < vocab_size={vocab_size}"
        )
        tokens = tf.RaggedTensor.from_tensor(ids, padding=PAD_ID)
        best, scores, lengths = self.search(tokens, *settings)
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
            "truncated": self._truncated(tokens),
        }

    def _truncated(self, tokens):
        """bool `(B,)`: which rows of ragged `tokens` are longer than
        `max_input_length`, of which the search reads the first ones."""
        return tokens.row_lengths() > self.config.max_input_length


def _decoding_config(config, settings):
    """`config` (default `DecodingConfig()`) with the fields `settings` replaced."""
    if config is None:
        config = DecodingConfig()
    if not isinstance(config, DecodingConfig):
        raise TypeError(
            "Translator: config must be a DecodingConfig; pass settings by name "
            f"(beam_size=4) or in one. Received: config={config!r}")
    return dataclasses.replace(config, **settings) if settings else config


def _for_model(config, model_config, tokenizer):
    """`config` resolved for this machine (`DecodingConfig.resolved`) and for the
    model: its max lengths and precision set, checked against the model's."""
    if config.block_adjacent_repeats and tokenizer is None:
        raise ValueError("Translator: block_adjacent_repeats needs the tokenizer, which says "
                         "which pieces start a word; an ids-only translator cannot block them")
    if tokenizer is None:  # no text to recase
        config = dataclasses.replace(config, recase_capitals=False)
    if tokenizer is not None and tokenizer.vocab_size != model_config.vocab_size:
        raise ValueError(
            f"Translator: the tokenizer has {tokenizer.vocab_size} ids but the model "
            f"was built for vocab_size={model_config.vocab_size}; pass the vocabulary the "
            "model was trained with"
        )
    config, _ = config.resolved()
    learned = model_config.positional_encoding == "learned"
    max_input_length = config.max_input_length or model_config.max_positions
    max_output_length = config.max_output_length or (
        model_config.max_positions if learned else max_input_length + config.extra_length)
    if learned and max_output_length > model_config.max_positions:
        raise ValueError(
            f"Translator: max_output_length={max_output_length} exceeds the "
            f"{model_config.max_positions} learned decoder positions of the model"
        )
    return dataclasses.replace(config, max_input_length=max_input_length,
                               max_output_length=max_output_length)
