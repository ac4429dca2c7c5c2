"""One update from N accumulated batches against one step on their concatenation,
from the same weights, printed as JSON.

Run as a script under MirroredStrategy (logical devices must be set up before
TensorFlow starts), or call `compare` in-process:
    python tests/accumulation_equivalence.py 2        # 2 replicas
"""

import functools
import json
import sys

import tensorflow as tf

ACCUMULATE = 3


def compare(strategy, accumulate_steps=ACCUMULATE):
    import keras
    import numpy as np

    import keras_transformer as kt
    from keras_transformer import data
    from keras_transformer import training

    pairs = data.load_parallel("bundled", "dev")
    tokenizer = data.SubwordTokenizer.train(pairs, vocab_size=600)
    # One bucket, so one shape to trace; the batches' token counts still differ.
    batches = data.TrainingBatches(pairs, tokenizer, 400, 40, seed=0, bucket_boundaries=[40],
                                   num_replicas=strategy.num_replicas_in_sync)
    group = list(batches.dataset(0, accumulate_steps).take(accumulate_steps))
    config = kt.TransformerConfig.tiny(tokenizer.vocab_size, num_layers=1, dropout_rate=0.0)
    keras.utils.set_random_seed(0)
    initial_weights = kt.build_transformer(config).get_weights()

    def train(strategy, elements, accumulate_steps):
        dataset = functools.reduce(
            tf.data.Dataset.concatenate, [tf.data.Dataset.from_tensors(e) for e in elements])
        with strategy.scope():
            model = kt.build_transformer(config)
            model.set_weights(initial_weights)
            training.compile_for_training(model, 0.1, warmup_steps=10,
                                                     accumulate_steps=accumulate_steps)
        history = model.fit(dataset, epochs=1, verbose=0, shuffle=False)
        return {
            "weights": model.get_weights(),
            # Adam's first momentum is (1 - beta_1) x the gradient it applied.
            "momentum": [v.numpy() for v in model.optimizer.variables if "momentum" in v.path],
            "iterations": int(model.optimizer.iterations.numpy()),
            "learning_rate": float(model.optimizer.learning_rate.numpy()),
            "loss": history.history["loss"][-1],
        }

    accumulated = train(strategy, group, accumulate_steps)
    # The same N batches as one, on one device: padded to the longest and stacked.
    length = max(targets.shape[1] for _, targets, _ in group)

    def pad(batch):
        return np.pad(batch.numpy(), [(0, 0), (0, length - batch.shape[1])])

    concatenated = (
        {name: np.concatenate([pad(inputs[name]) for inputs, _, _ in group])
         for name in ("encoder_inputs", "decoder_inputs")},
        np.concatenate([pad(targets) for _, targets, _ in group]))
    one = train(tf.distribute.OneDeviceStrategy("/cpu:0"), [concatenated], 1)
    # Without the token weights: the mean of the N batches' own means.
    unweighted = train(strategy, [(inputs, targets) for inputs, targets, _ in group],
                       accumulate_steps)

    def largest_relative_difference(first, second):
        """The largest over the variables of each one's difference relative to
        its own scale, so that a variable of small gradients is held to the
        same accuracy as the largest (a global normalization would hide its
        errors). Attention keys' biases get no gradient in exact arithmetic
        (softmax ignores a shift of all scores), only rounding noise (1e-9 of
        the largest momentum here), which Adam's first step turns into lr-sized
        moves; so the momentum is compared, not the weights, and against a
        floor of 1e-3 of the largest scale."""
        floor = 1e-3 * max(float(np.abs(b).max()) for b in second)
        return max(float(np.abs(a - b).max()) / max(float(np.abs(b).max()), floor)
                   for a, b in zip(first, second))

    return {
        "num_replicas": strategy.num_replicas_in_sync,
        "tokens": [int((targets.numpy() != 0).sum()) for _, targets, _ in group],
        "momentum_difference": largest_relative_difference(accumulated["momentum"],
                                                           one["momentum"]),
        "unweighted_momentum_difference": largest_relative_difference(
            unweighted["momentum"], one["momentum"]),
        "iterations": [accumulated["iterations"], one["iterations"]],
        "learning_rate": [accumulated["learning_rate"], one["learning_rate"]],
        "loss": [accumulated["loss"], one["loss"]],
    }


if __name__ == "__main__":
    replicas = int(sys.argv[1])
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    print(json.dumps(compare(strategy)))
