"""A tiny model learns to copy its source: gradients reach every part of the model."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import TransformerConfig
from keras_transformer import build_transformer

VOCAB, LENGTH, BOS, EOS = 16, 8, 2, 3


def copy_batch(rng, batch_size):
    lengths = rng.randint(3, LENGTH + 1, batch_size)
    source = np.zeros((batch_size, LENGTH), "int32")
    decoder_inputs = np.zeros((batch_size, LENGTH + 1), "int32")
    targets = np.zeros((batch_size, LENGTH + 1), "int32")
    for row, length in enumerate(lengths):
        tokens = rng.randint(4, VOCAB, length)
        source[row, :length] = tokens
        decoder_inputs[row, : length + 1] = np.concatenate([[BOS], tokens])
        targets[row, : length + 1] = np.concatenate([tokens, [EOS]])
    return {"encoder_inputs": source, "decoder_inputs": decoder_inputs}, targets


def test_every_weight_gets_a_gradient():
    model = build_transformer(TransformerConfig.tiny(VOCAB, d_model=32, d_ff=64))
    inputs, targets = copy_batch(np.random.RandomState(0), 8)
    with tf.GradientTape() as tape:
        logits = model(inputs, training=True)
        loss = keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True)
    gradients = tape.gradient(loss, model.trainable_variables)
    for variable, gradient in zip(model.trainable_variables, gradients):
        assert gradient is not None and np.any(np.asarray(gradient) != 0), variable.path


@pytest.mark.slow
def test_tiny_model_learns_to_copy():
    rng = np.random.RandomState(0)
    model = build_transformer(
        TransformerConfig.tiny(VOCAB, num_layers=2, d_model=64, d_ff=128, dropout_rate=0.0)
    )
    model.compile(
        optimizer=keras.optimizers.Adam(2e-3, beta_1=0.9, beta_2=0.98, epsilon=1e-9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0),
    )
    inputs, targets = copy_batch(rng, 64 * 300)
    model.fit(inputs, targets, batch_size=64, epochs=1, verbose=0)

    inputs, targets = copy_batch(rng, 256)
    predictions = np.argmax(model.predict(inputs, verbose=0), axis=-1)
    real = targets != 0
    accuracy = np.mean(predictions[real] == targets[real])
    assert accuracy > 0.95, accuracy
