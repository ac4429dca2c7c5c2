"""The model as a CTranslate2 model, for serving on CPUs with its int8 kernels.

    export_ctranslate2(model, tokenizer, "exports/demo-ct2", quantization="int8",
                       config=DecodingConfig(alpha=1.0))
    translate_ctranslate2("exports/demo-ct2", ["In the beginning."])
    keras-transformer translate --export exports/demo-ct2 input.en

`export_ctranslate2` builds a `ctranslate2.specs.TransformerSpec` from the
model's weights: the paper's post-norm layers (or pre-norm, with the final layer
norms), shared embeddings scaled by sqrt(d_model) and tied to the output
projection, and our sinusoidal table (sines on even channels, cosines on odd
ones, which is not CTranslate2's built-in layout) as explicit position
encodings. It writes the CTranslate2 model (`model.bin`, `config.json`,
`shared_vocabulary.json`), the sentencepiece model (`sentencepiece.model`) that
tokenizes for it, our tokenizer (`vocab/`, with the casing its recasing reads)
and `keras_transformer.json`: the model, the weights' type, the decoding (the
one the run chose) and the run. Needs the `ctranslate2` package (the
`ctranslate2` extra).

`CTranslate2Translator` translates with such an export as our SavedModel
export does, but for the search: the same request limits and text (whitespace,
invisible characters, recasing and the first capital: `serving_text.RequestText`,
run eagerly), the export's decoding settings, outputs of at most the source's
pieces + `extra_length`; sources and outputs both end at the position table's
`POSITIONS` (1024) pieces. CTranslate2's search differs in two ways: it divides a
hypothesis's log-probability by length^alpha (ours: the paper's
((5 + length) / 6)^alpha; with the length penalty off both search for the same
thing), and it has no blocking of words repeated back to back
(`block_adjacent_repeats`; repeated n-grams it blocks).
"""

import dataclasses
import json
import os

import numpy as np

from keras_transformer.decoding_config import DecodingConfig
from keras_transformer.decoding_config import exported_limits
from keras_transformer.durable import write_atomically
from keras_transformer.export_files import CTRANSLATE2_SETTINGS
from keras_transformer.hardware import available_cores

SENTENCEPIECE_FILENAME = "sentencepiece.model"
# Our tokenizer (`SubwordTokenizer.save`): the same sentencepiece model, and the
# casing that recasing reads.
TOKENIZER_DIRNAME = "vocab"
# The `DecodingConfig` fields a CTranslate2 export records and its translator
# honours (`block_adjacent_repeats` CTranslate2 cannot do).
SETTINGS = ("beam_size", "alpha", "extra_length", "no_repeat_ngram_size", "recase_capitals",
            "max_batch_size", "max_input_chars")
# The weights' storage types CTranslate2's converter writes: the first four compute
# on a CPU, the last four (16-bit activations) on a GPU.
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int16",
                 "float16", "bfloat16", "int8_float16", "int8_bfloat16")
# Rows of the position table: positions a CTranslate2 search can reach.
POSITIONS = 1024


def export_ctranslate2(model, tokenizer, output_dir, quantization=None, *, config=None,
                       run=None):
    """Writes `model` and its tokenizer as a CTranslate2 model directory.

    Args:
        model: a `keras_transformer.Transformer` with sinusoidal positions
            (learned positions are not converted).
        tokenizer: its `SubwordTokenizer`.
        output_dir: the directory to write; must not exist.
        quantization: None or "float32" (as trained), one of the CPU types
            "int8", "int8_float32" and "int16", or one of the GPU types
            "float16", "bfloat16", "int8_float16" and "int8_bfloat16": the
            weights' storage type (CTranslate2 computes in it by default, and
            converts them to the `compute_type` a `Translator` asks for).
        config: the `DecodingConfig` whose `SETTINGS` the export's translations
            take (`CTranslate2Translator`); default: the paper's decoding.
        run: optional JSON-ready dict, the run's config (`keras-transformer
            evaluate` reads the corpus it trained on from it).

    Returns:
        `output_dir`.
    """
    import ctranslate2.specs  # noqa: F401 (fails early without the package)

    _weight_type(quantization)  # refused before anything is written
    if os.path.exists(output_dir):
        raise ValueError(f"{output_dir} exists already; pass a new directory")
    pieces = vocabulary(tokenizer)
    decoding = exported_limits(config or DecodingConfig(), "export_ctranslate2").to_dict()
    recorded = {"model": model.config.to_dict(), "quantization": quantization or "float32",
                "translator": {name: decoding[name] for name in SETTINGS}}
    if run is not None:
        recorded["run"] = run

    def write(temporary):
        write_model(model, pieces, temporary, quantization)
        with open(os.path.join(temporary, SENTENCEPIECE_FILENAME), "wb") as f:
            f.write(tokenizer.model_proto)
        tokenizer.save(os.path.join(temporary, TOKENIZER_DIRNAME))
        with open(os.path.join(temporary, CTRANSLATE2_SETTINGS), "w") as f:
            json.dump(recorded, f, indent=2, sort_keys=True)

    os.makedirs(os.path.dirname(os.path.abspath(output_dir)), exist_ok=True)
    write_atomically(output_dir, write)
    return output_dir


def write_model(model, pieces, directory, quantization=None):
    """Writes the CTranslate2 model of `model` (`transformer_spec`) into a new
    `directory`, its weights stored as `quantization` (see `export_ctranslate2`)."""
    weight_type = _weight_type(quantization)
    spec = transformer_spec(model, pieces)
    spec.validate()
    spec.optimize(quantization=weight_type)
    os.makedirs(directory)
    spec.save(directory)


def _weight_type(quantization):
    """CTranslate2's `optimize` argument for `quantization` (None: as trained)."""
    if quantization not in (None, *QUANTIZATIONS):
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}. "
                         f"Received: quantization={quantization!r}")
    return None if quantization == "float32" else quantization


def vocabulary(tokenizer):
    """The tokenizer's pieces, in id order."""
    ids = np.arange(tokenizer.vocab_size, dtype=np.int32)
    return [piece.decode("utf-8") for piece in tokenizer.id_to_token(ids).numpy()]


def transformer_spec(model, pieces):
    """The `ctranslate2.specs.TransformerSpec` of `model`'s weights, with
    `pieces` (`vocabulary(tokenizer)`) as its shared vocabulary."""
    from ctranslate2.specs import transformer_spec as specs

    config = model.config
    if config.positional_encoding != "sinusoidal":
        raise ValueError("export_ctranslate2 converts sinusoidal positions only. "
                         f"Received: positional_encoding={config.positional_encoding!r}")
    if config.num_heads * config.d_k != config.d_model or config.d_v != config.d_k:
        raise ValueError("CTranslate2 needs num_heads * key_dim == num_heads * value_dim == "
                         f"d_model. Received: num_heads={config.num_heads}, key_dim="
                         f"{config.d_k}, value_dim={config.d_v}, d_model={config.d_model}")
    weights = {v.path: np.asarray(v.numpy(), np.float32) for v in model.weights}
    spec = specs.TransformerSpec.from_config(
        config.num_layers, config.num_heads, pre_norm=config.norm_first)
    spec.config.layer_norm_epsilon = config.layer_norm_epsilon
    embeddings = weights["shared_embedding/embeddings"]  # (V, d)
    positions = np.asarray(model.encoder_position(
        np.zeros((1, POSITIONS, config.d_model), np.float32)), np.float32).reshape(
            POSITIONS, config.d_model)
    for side, stack in (("encoder", spec.encoder), ("decoder", spec.decoder)):
        embedding = stack.embeddings[0] if side == "encoder" else stack.embeddings
        embedding.weight = embeddings
        stack.scale_embeddings = float(np.sqrt(config.d_model))
        stack.position_encodings.encodings = positions
        if config.norm_first:
            _layer_norm(stack.layer_norm, weights, f"{side}_norm")
    spec.decoder.projection.weight = embeddings  # tied output projection, no bias
    for index, layer in enumerate(spec.encoder.layer):
        prefix = f"encoder_layer_{index}"
        _self_attention(layer.self_attention, weights, f"{prefix}/self_attention")
        _layer_norm(layer.self_attention.layer_norm, weights, f"{prefix}/self_attention_norm")
        _feed_forward(layer.ffn, weights, prefix)
    for index, layer in enumerate(spec.decoder.layer):
        prefix = f"decoder_layer_{index}"
        _self_attention(layer.self_attention, weights, f"{prefix}/self_attention")
        _layer_norm(layer.self_attention.layer_norm, weights, f"{prefix}/self_attention_norm")
        cross = f"{prefix}/cross_attention"
        _linear(layer.attention.linear[0], weights, f"{cross}/query")
        _linear(layer.attention.linear[1], weights, f"{cross}/key", f"{cross}/value")
        _output(layer.attention.linear[2], weights, f"{cross}/attention_output")
        _layer_norm(layer.attention.layer_norm, weights, f"{prefix}/cross_attention_norm")
        _feed_forward(layer.ffn, weights, prefix)
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    return spec


def _linear(linear, weights, *names):
    """Our (d, h, k) projections, fused along the output, as CTranslate2's
    (out, in) weight and bias."""
    kernels = [weights[f"{name}/kernel"] for name in names]
    linear.weight = np.concatenate([k.reshape(k.shape[0], -1).T for k in kernels])
    linear.bias = np.concatenate([weights[f"{name}/bias"].reshape(-1) for name in names])


def _self_attention(attention, weights, prefix):
    _linear(attention.linear[0], weights, f"{prefix}/query", f"{prefix}/key", f"{prefix}/value")
    _output(attention.linear[1], weights, f"{prefix}/attention_output")


def _output(linear, weights, name):
    kernel = weights[f"{name}/kernel"]  # (h, k, d)
    linear.weight = kernel.reshape(-1, kernel.shape[-1]).T
    linear.bias = weights[f"{name}/bias"]


def _feed_forward(ffn, weights, prefix):
    for linear, name in ((ffn.linear_0, "inner"), (ffn.linear_1, "output")):
        linear.weight = weights[f"{prefix}/feed_forward/{name}/kernel"].T
        linear.bias = weights[f"{prefix}/feed_forward/{name}/bias"]
    _layer_norm(ffn.layer_norm, weights, f"{prefix}/feed_forward_norm")


def _layer_norm(norm, weights, name):
    norm.gamma = weights[f"{name}/gamma"]
    norm.beta = weights[f"{name}/beta"]


class CTranslate2Translator:
    """A CTranslate2 export (`export_ctranslate2`) as a translator: `translate`
    answers as a SavedModel export's signature of that name does, so that
    `evaluation.translate_sentences` and the commands translate and evaluate
    take either.

    Args:
        model_dir: the export's directory.
        device: CTranslate2's ("auto": a GPU where it sees one).
        compute_type: CTranslate2's ("default": the weights' type).
        **settings: `SETTINGS` that replace the export's (an export from before
            they were recorded has the paper's decoding, and without its `vocab/`
            no recasing).
    """

    def __init__(self, model_dir, device="auto", compute_type="default", **settings):
        try:
            import ctranslate2
        except ImportError:
            raise ImportError(f"{model_dir} is a CTranslate2 export: translating with it "
                              "needs the ctranslate2 package: pip install ctranslate2 (or "
                              "the package's [ctranslate2] extra)") from None
        import tensorflow as tf

        from keras_transformer import export_files
        from keras_transformer.data.tokenizer import SubwordTokenizer
        from keras_transformer.serving_text import RequestText

        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise ValueError(f"CTranslate2Translator takes the settings {', '.join(SETTINGS)}. "
                             f"Received: {', '.join(unknown)}")
        self.recorded_settings = export_files.translator_settings(model_dir)
        tokenizer_dir = os.path.join(model_dir, TOKENIZER_DIRNAME)
        if os.path.isdir(tokenizer_dir):
            tokenizer = SubwordTokenizer.load(tokenizer_dir)
        else:  # exported before 2026-12-02: no casing to recase with
            with open(os.path.join(model_dir, SENTENCEPIECE_FILENAME), "rb") as f:
                tokenizer = SubwordTokenizer(f.read())
            settings.setdefault("recase_capitals", False)
        config = DecodingConfig.from_dict({**self.recorded_settings, **settings})
        # Longer sources are truncated to the positions the export's table holds.
        self.config = dataclasses.replace(config, max_input_length=POSITIONS)
        self.text = RequestText(tokenizer, self.config.max_batch_size,
                                self.config.max_input_chars, self.config.recase_capitals)
        self.pieces = vocabulary(tokenizer)
        self.ids = {piece: index for index, piece in enumerate(self.pieces)}
        self.engine = ctranslate2.Translator(model_dir, device=device, compute_type=compute_type,
                                             inter_threads=1, intra_threads=available_cores())
        # The text's ops traced once, for any batch: 3x faster than eagerly.
        texts = tf.TensorSpec([None], tf.string)
        self._tokens = tf.function(self.text.tokens, input_signature=[texts])
        self._translations = tf.function(
            lambda text, ids: self.text.in_source_case(text, self.text.detokenize(ids)),
            input_signature=[texts, tf.RaggedTensorSpec([None, None], tf.int32, 1, tf.int64)])

    def translate(self, text, beam_size=None, alpha=None, extra_length=None,
                  no_repeat_ngram_size=None):
        """Best translations of `text` (tf.string `(B,)`):
        `{"translation": (B,), "score": (B,), "truncated": (B,)}`, the score
        CTranslate2's (its log-probability over length^alpha), truncated
        whether the source had more than `POSITIONS` pieces, of which the
        first were translated; the settings (Python or tensor
        scalars) are the translator's where None. Raises
        `tf.errors.InvalidArgumentError` for a request over the limits, as an
        export does."""
        import tensorflow as tf

        config = self.config
        search = {
            "beam_size": int(config.beam_size if beam_size is None else beam_size),
            "length_penalty": float(config.alpha if alpha is None else alpha),
            "no_repeat_ngram_size": int(config.no_repeat_ngram_size if no_repeat_ngram_size
                                        is None else no_repeat_ngram_size),
        }
        extra = int(config.extra_length if extra_length is None else extra_length)
        text = tf.convert_to_tensor(text, tf.string)
        sources = self._tokens(text).to_list()  # the limits, the text, recased
        # The position table's rows (`POSITIONS`) bound the source's pieces and
        # the output's: CTranslate2 raises past them.
        limit = config.max_input_length
        truncated = [len(source) > limit for source in sources]
        sources = [source[:limit] for source in sources]
        outputs, scores = [[] for _ in sources], [0.0] * len(sources)
        asked = [index for index, source in enumerate(sources) if source]  # "" for ""
        if asked:
            # One call for the request (3x faster than a call per source length:
            # 500 test sentences in 5 s, not 15), its outputs limited as ours are,
            # each to its source's pieces + extra, end of sequence included, and
            # all to the table's rows.
            longest = max(len(sources[index]) for index in asked)
            results = self.engine.translate_batch(
                [[self.pieces[i] for i in sources[index]] for index in asked],
                max_decoding_length=min(longest + extra, limit),
                max_input_length=limit, return_scores=True, **search)
            for index, result in zip(asked, results):
                outputs[index] = [self.ids[piece] for piece in
                                  result.hypotheses[0][:len(sources[index]) + extra]]
                scores[index] = result.scores[0]
        ids = tf.RaggedTensor.from_row_lengths(
            tf.constant([i for output in outputs for i in output], tf.int32),
            tf.constant([len(output) for output in outputs], tf.int64))
        # An empty output detokenizes to "", and stays so recased.
        return {"translation": self._translations(text, ids),
                "score": tf.constant(scores, tf.float32),
                "truncated": tf.constant(truncated, tf.bool, shape=[len(sources)])}


def translate_ctranslate2(model_dir, texts, **settings):
    """The translations (str) of `texts` with a CTranslate2 export, as its
    `CTranslate2Translator` (`settings`: its) gives them, in requests of at most
    its `max_batch_size` sentences."""
    translator = CTranslate2Translator(model_dir, **settings)
    texts, most = list(texts), translator.config.max_batch_size
    return [translation.decode("utf-8") for start in range(0, len(texts), most)
            for translation in translator.translate(texts[start:start + most])[
                "translation"].numpy()]
