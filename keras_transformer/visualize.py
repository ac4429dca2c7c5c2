"""Attention heatmaps, one panel per head, like the paper's appendix figures.

    weights = cross_attention_weights(model, tokenizer, "In the beginning.", "En el principio.")
    plot_attention(weights, "cross.png")
    # The appendix's figures: encoder self-attention in layer 5 of 6.
    plot_attention(encoder_self_attention_weights(model, tokenizer, "It is in this spirit.",
                                                  layer=4), "self.png")

Needs matplotlib (`pip install matplotlib`, or the package's `plot` extra); the
weights themselves need only the model.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from keras_transformer import serving
from keras_transformer.decoding_config import in_process_settings
from keras_transformer.token_ids import BOS_ID
from keras_transformer.token_ids import EOS_ID


@dataclasses.dataclass
class AttentionWeights:
    """The attention weights of one sentence (pair) in one layer.

    Attributes:
        weights: float32 `(h, Q, K)`: row q is how query position q spreads its
            attention over the K key positions; each row sums to 1.
        query_tokens: the Q pieces of the rows: the predicted target pieces
            (end-of-sequence last) for cross-attention, the source's for
            encoder self-attention.
        key_tokens: the K pieces attended to: the source's.
        layer: the layer's index.
        kind: "cross-attention" or "encoder self-attention".
    """

    weights: np.ndarray
    query_tokens: list
    key_tokens: list
    layer: int
    kind: str = "cross-attention"


def cross_attention_weights(model, tokenizer, source, target=None, *, layer=-1,
                            translator=None, max_input_length=None):
    """Teacher-forces `target` and returns one decoder layer's cross-attention.

    Args:
        model: a `keras_transformer.Transformer`.
        tokenizer: its `SubwordTokenizer`.
        source: the source sentence (str).
        target: the target sentence (str); None to use the model's own
            translation (from `translator`, or a new `Translator` with the
            paper's beam search).
        layer: index of the decoder layer (-1, the last, by default).
        translator: a `keras_transformer.serving.Translator` for `target=None`.
        max_input_length: sources are truncated to this many tokens (default:
            `translator`'s, or the model's `max_positions`, a new translator's).

    Returns:
        An `AttentionWeights`.
    """
    layer = _layer_index(layer, len(model.decoder_layers))
    if target is None:
        if translator is None:
            translator = serving.Translator(model, tokenizer, **in_process_settings())
        outputs = translator.translate(tf.constant([source]))
        target = outputs["translation"].numpy()[0].decode("utf-8")
    if max_input_length is None:  # the source the translator read
        max_input_length = (translator.config.max_input_length if translator is not None
                            else model.config.max_positions)
    source_ids = tokenizer.tokenize(tf.constant([source]))[:, :max_input_length]
    source_ids = tf.cast(source_ids.to_tensor(), tf.int32)  # (1, S)
    target_ids = tf.cast(tokenizer.tokenize(tf.constant([target])).to_tensor(), tf.int32)
    decoder_inputs = tf.concat([[[BOS_ID]], target_ids], axis=1)  # (1, T)
    predicted = tf.concat([target_ids, [[EOS_ID]]], axis=1)  # (1, T)
    if source_ids.shape[1] == 0:
        raise ValueError("the source has no tokens: nothing to attend to")

    weights = decoder_attention(model, source_ids, decoder_inputs)[1][layer]
    return AttentionWeights(
        weights=weights["cross_attention"][0].numpy(),  # (h, T, S)
        query_tokens=_pieces(tokenizer, predicted[0]),
        key_tokens=_pieces(tokenizer, source_ids[0]),
        layer=layer,
    )


def encoder_self_attention_weights(model, tokenizer, source, *, layer=-1, max_input_length=None):
    """One encoder layer's self-attention over `source` (the paper's appendix
    figures show layer 5 of 6).

    Args:
        model: a `keras_transformer.Transformer`.
        tokenizer: its `SubwordTokenizer`.
        source: the source sentence (str).
        layer: index of the encoder layer (-1, the last, by default).
        max_input_length: sources are truncated to this many tokens (default:
            the model's `max_positions`).

    Returns:
        An `AttentionWeights` of kind "encoder self-attention", `(h, S, S)`.
    """
    layer = _layer_index(layer, len(model.encoder_layers))
    max_input_length = max_input_length or model.config.max_positions
    source_ids = tokenizer.tokenize(tf.constant([source]))[:, :max_input_length]
    source_ids = tf.cast(source_ids.to_tensor(), tf.int32)  # (1, S)
    if source_ids.shape[1] == 0:
        raise ValueError("the source has no tokens: nothing to attend to")
    weights = model.encode(source_ids, return_attention_scores=True)[1][layer]
    pieces = _pieces(tokenizer, source_ids[0])
    return AttentionWeights(weights=weights[0].numpy(), query_tokens=pieces, key_tokens=pieces,
                            layer=layer, kind="encoder self-attention")


def _layer_index(layer, num_layers):
    if not -num_layers <= layer < num_layers:
        raise ValueError(
            f"layer must be in [{-num_layers}, {num_layers - 1}] for a model with "
            f"{num_layers} layers. Received: layer={layer}"
        )
    return layer % num_layers


def decoder_attention(model, encoder_inputs, decoder_inputs):
    """Every decoder layer's attention weights for a teacher-forced pass.

    Runs the model's own decoder pass (`Transformer.decode`, no dropout) over
    the encoder's output.

    Returns:
        `(logits, weights)`: the logits `(B, T, vocab_size)`, which equal the
        model's, and a list (one per decoder layer) of dicts
        `{"self_attention": (B, h, T, T), "cross_attention": (B, h, T, S)}`.
    """
    memory = model.initial_cache(tf.convert_to_tensor(encoder_inputs, tf.int32))
    return model.decode(tf.convert_to_tensor(decoder_inputs, tf.int32), memory,
                        return_attention_scores=True, training=False)


def plot_attention(attention, path, *, title=None, columns=4, dpi=120):
    """Draws one heatmap per head (keys across, queries down) into a PNG.

    Args:
        attention: an `AttentionWeights`.
        path: the PNG file to write.
        title: optional figure title; defaults to the layer.
        columns: panels per row.
        dpi: resolution.

    Returns:
        `path`.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        from matplotlib import pyplot
    except ImportError as error:
        raise ImportError(
            "plot_attention needs matplotlib: pip install matplotlib "
            "(or pip install 'keras_transformer[plot]')"
        ) from error

    weights = attention.weights
    num_heads, target_length, source_length = weights.shape  # queries, keys
    columns = max(1, min(columns, num_heads))
    rows = -(-num_heads // columns)
    vmax = max(float(weights.max()), 1e-6)  # one scale for all heads
    cell = 0.28  # inches per token
    panel_width = max(2.5, cell * source_length + 1.0)
    panel_height = max(2.5, cell * target_length + 1.0)
    figure, axes = pyplot.subplots(
        rows, columns, figsize=(columns * panel_width, rows * panel_height),
        squeeze=False, constrained_layout=True,
    )
    for head, axis in enumerate(axes.flat):
        if head >= num_heads:
            axis.axis("off")
            continue
        image = axis.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=vmax,
                            aspect="auto", interpolation="nearest")
        axis.set_title(f"head {head + 1}")
        axis.set_xticks(range(source_length))
        axis.set_xticklabels(attention.key_tokens, rotation=90, fontsize=8)
        axis.set_yticks(range(target_length))
        axis.set_yticklabels(attention.query_tokens, fontsize=8)
        axis.set_xlabel("source")
        axis.set_ylabel("target (predicted)" if attention.kind == "cross-attention" else "source")
    figure.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    where = "decoder" if attention.kind == "cross-attention" else "encoder"
    figure.suptitle(title or f"{attention.kind.capitalize()}, {where} layer {attention.layer + 1}")
    figure.savefig(path, dpi=dpi)
    pyplot.close(figure)
    return path


def _pieces(tokenizer, ids):
    pieces = tokenizer.id_to_token(tf.convert_to_tensor(ids)).numpy()
    return [piece.decode("utf-8", "replace") for piece in pieces]
