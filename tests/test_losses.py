import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import LabelSmoothedCrossEntropy
from keras_transformer import Perplexity
from keras_transformer import TokenAccuracy

V = 7
RNG = np.random.RandomState(0)
LOGITS = RNG.randn(3, 5, V).astype("float32") * 3
TARGETS = np.array([[4, 5, 6, 3, 0], [1, 3, 0, 0, 0], [2, 2, 2, 2, 3]], "int32")
REAL = TARGETS != 0


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_equals_keras_categorical_cross_entropy_with_one_hot(epsilon):
    reference = keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=epsilon, reduction=None
    )
    per_token = np.asarray(reference(np.eye(V)[TARGETS], LOGITS))  # (B, T)
    expected = per_token[REAL].mean()
    loss = LabelSmoothedCrossEntropy(label_smoothing=epsilon)
    np.testing.assert_allclose(float(loss(TARGETS, LOGITS)), expected, rtol=1e-5)


def test_padding_carries_no_loss_and_sample_weights_apply():
    loss = LabelSmoothedCrossEntropy()
    changed = LOGITS.copy()
    changed[~REAL] = 100.0 * RNG.randn(int((~REAL).sum()), V)
    np.testing.assert_allclose(float(loss(TARGETS, changed)), float(loss(TARGETS, LOGITS)),
                               rtol=1e-6)
    # Weights multiply the token losses; the divisor is still the token count.
    weights = RNG.rand(*TARGETS.shape)
    per_token = np.asarray(keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=0.1, reduction=None)(np.eye(V)[TARGETS], LOGITS))
    np.testing.assert_allclose(float(loss(TARGETS, LOGITS, sample_weight=weights)),
                               (per_token * weights)[REAL].sum() / REAL.sum(), rtol=1e-5)
    rows = np.array([[2.0], [0.0], [1.0]])  # (B, 1): one weight a sentence
    np.testing.assert_allclose(float(loss(TARGETS, LOGITS, sample_weight=rows)),
                               (per_token * rows)[REAL].sum() / REAL.sum(), rtol=1e-5)


def test_metrics_on_non_padding_tokens():
    accuracy, perplexity = TokenAccuracy(), Perplexity()
    accuracy.update_state(TARGETS, LOGITS)
    perplexity.update_state(TARGETS, LOGITS)
    predictions = LOGITS.argmax(-1)
    np.testing.assert_allclose(float(accuracy.result()),
                               (predictions == TARGETS)[REAL].mean(), rtol=1e-6)
    log_probs = LOGITS - np.log(np.exp(LOGITS).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, TARGETS[..., None], -1)[..., 0]
    np.testing.assert_allclose(float(perplexity.result()), np.exp(nll[REAL].mean()), rtol=1e-5)


def test_accuracy_counts_a_target_tied_for_the_largest_logit_as_right():
    logits = np.zeros((1, 3, 4), "float32")
    logits[0, 0, [1, 2]] = 5.0  # target 2 ties with 1 for the largest: right
    logits[0, 1, 3] = 5.0       # target 1, below the largest: wrong
    logits[0, 2, 1] = 5.0       # target 1: right
    accuracy = TokenAccuracy()
    accuracy.update_state(np.array([[2, 1, 1]], "int32"), logits)
    np.testing.assert_allclose(float(accuracy.result()), 2 / 3, rtol=1e-6)


def test_target_tokens_counts_the_non_padding_tokens_of_each_epoch_apart():
    from keras_transformer import TargetTokens
    from keras_transformer import training

    tokens = TargetTokens()
    tokens.update_state(TARGETS, LOGITS)
    tokens.update_state(TARGETS, LOGITS)
    assert float(tokens.result()) == 2 * REAL.sum()
    # In fit, the train epoch's count must not be the dev pass's, which reuses the metric.
    model = kt.build_transformer(kt.TransformerConfig.tiny(60, d_model=16, d_ff=32))
    training.compile_for_training(model)
    rng = np.random.RandomState(0)

    def pairs(rows, length, padding):
        inputs = {name: rng.randint(4, 60, (rows, length)).astype("int32")
                  for name in ("encoder_inputs", "decoder_inputs")}
        targets = rng.randint(4, 60, (rows, length)).astype("int32")
        targets[:, length - padding:] = 0
        return inputs, targets

    logged = {}
    model.fit(*pairs(8, 12, 2), batch_size=4, epochs=1, validation_data=pairs(4, 6, 0),
              verbose=0, callbacks=[keras.callbacks.LambdaCallback(
                  on_epoch_end=lambda epoch, logs: logged.update(logs))])
    assert float(logged["target_tokens"]) == 8 * 10
    assert float(logged["val_target_tokens"]) == 4 * 6


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_gradient_equals_autodiff_of_keras_loss(epsilon):
    import tensorflow as tf

    logits = tf.constant(LOGITS)
    reference = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=epsilon)
    loss = LabelSmoothedCrossEntropy(label_smoothing=epsilon)
    one_hot = np.eye(V)[TARGETS] * REAL[..., None]  # padding rows carry no target
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        ours = loss(TARGETS, logits)
        # Keras's mean over all B*T positions, rescaled to the non-padding tokens.
        expected = reference(one_hot, logits, sample_weight=REAL) * REAL.size / REAL.sum()
    np.testing.assert_allclose(float(ours), float(expected), rtol=1e-5)
    np.testing.assert_allclose(tape.gradient(ours, logits), tape.gradient(expected, logits),
                               atol=1e-6)
