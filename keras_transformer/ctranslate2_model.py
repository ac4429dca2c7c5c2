"""The model as a CTranslate2 model, for serving on CPUs with its int8 kernels.

    export_ctranslate2(model, tokenizer, "exports/demo-ct2", quantization="int8")
    translate_ctranslate2("exports/demo-ct2", ["In the beginning."])

`export_ctranslate2` builds a `ctranslate2.specs.TransformerSpec` from the
model's weights: the paper's post-norm layers (or pre-norm, with the final layer
norms), shared embeddings scaled by sqrt(d_model) and tied to the output
projection, and our sinusoidal table (sines on even channels, cosines on odd
ones, which is not CTranslate2's built-in layout) as explicit position
encodings. It writes the CTranslate2 model (`model.bin`, `config.json`,
`shared_vocabulary.json`) and the sentencepiece model (`sentencepiece.model`)
that tokenizes for it. Needs the `ctranslate2` package (the `ctranslate2` extra).

Decoding settings differ between the engines: CTranslate2 divides a
hypothesis's log-probability by length^alpha (ours: the paper's
((5 + length) / 6)^alpha) and limits the output length per batch, not per
sentence. With the length penalty off both search for the same thing; see
`translate_ctranslate2`.
"""

import json
import os

import numpy as np

from keras_transformer.decoding_config import PAPER_BEAM_SIZE
from keras_transformer.decoding_config import PAPER_EXTRA_LENGTH
from keras_transformer.durable import write_atomically

SENTENCEPIECE_FILENAME = "sentencepiece.model"
# The weights' storage types CTranslate2's converter writes: the first four compute
# on a CPU, the last four (16-bit activations) on a GPU.
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int16",
                 "float16", "bfloat16", "int8_float16", "int8_bfloat16")
# Rows of the position table: positions a CTranslate2 search can reach.
POSITIONS = 1024


def export_ctranslate2(model, tokenizer, output_dir, quantization=None):
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

    Returns:
        `output_dir`.
    """
    import ctranslate2.specs  # noqa: F401 (fails early without the package)

    _weight_type(quantization)  # refused before anything is written
    if os.path.exists(output_dir):
        raise ValueError(f"{output_dir} exists already; pass a new directory")
    pieces = vocabulary(tokenizer)

    def write(temporary):
        write_model(model, pieces, temporary, quantization)
        with open(os.path.join(temporary, SENTENCEPIECE_FILENAME), "wb") as f:
            f.write(tokenizer.model_proto)
        with open(os.path.join(temporary, "keras_transformer.json"), "w") as f:
            json.dump({"model": model.config.to_dict(), "quantization": quantization or "float32"},
                      f, indent=2, sort_keys=True)

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


def translate_ctranslate2(model_dir, texts, beam_size=PAPER_BEAM_SIZE, length_penalty=0.0,
                          extra_length=PAPER_EXTRA_LENGTH, max_batch_size=32, **options):
    """Translates `texts` with a CTranslate2 export and returns the translations.

    The sources are tokenized with the export's sentencepiece model; outputs are
    limited as ours are, to the source's pieces + `extra_length` (end of sequence
    included), by translating sources of each length together with
    `max_decoding_length` set for them. With `length_penalty=0` (CTranslate2's
    normalization is length^alpha, ours the paper's) this gives what our
    `Translator(alpha=0.0)` gives. `options` go to `translate_batch`.
    """
    import ctranslate2
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(model_dir, SENTENCEPIECE_FILENAME))
    translator = ctranslate2.Translator(model_dir, device="cpu")
    pieces = [processor.encode(" ".join(text.split()), out_type=str) for text in texts]
    by_length = {}
    for index, source in enumerate(pieces):
        by_length.setdefault(len(source), []).append(index)
    translations = [""] * len(texts)
    for length, indices in by_length.items():
        if not length:
            continue  # an empty source translates to "", as ours does
        results = translator.translate_batch(
            [pieces[i] for i in indices], beam_size=beam_size, length_penalty=length_penalty,
            max_decoding_length=length + extra_length, max_batch_size=max_batch_size, **options)
        for index, result in zip(indices, results):
            translations[index] = processor.decode(result.hypotheses[0])
    return translations
