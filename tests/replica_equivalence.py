"""Trains two steps with model.fit on one device and under a distribution strategy,
from the same weights on the same global batches, and prints the largest weight
difference as JSON.

Run as a script (logical devices and collectives must be set up before TensorFlow
starts):
    python tests/replica_equivalence.py mirrored 8
        MirroredStrategy over 8 logical CPUs.
    python tests/replica_equivalence.py multi_worker INDEX HOST:PORT,HOST:PORT
        MultiWorkerMirroredStrategy, this process being worker INDEX of the
        cluster; start one process per worker.
    python tests/replica_equivalence.py mirrored_gpu 2 nccl|hierarchical
        MirroredStrategy over 2 GPUs with NCCL all-reduce, or over 2 logical GPUs
        carved from the first GPU with hierarchical-copy all-reduce (NCCL refuses
        two replicas on one GPU: "invalid usage", seen on an H200); the one device
        is the first GPU, TF32 off.
Any of them with a last argument `--xla`: both models compiled with
jit_compile=True (on the strategy, XLA compiles each replica's step:
`distributed.MultiWorkerModel.compile`). With `--adam` as well: the paper's
optimizer (`optimizers.Adam`, its epsilon raised, see `main`) instead of SGD, its
update compiled with the steps (on the strategy, one XLA program per device).
"""

import json
import os
import sys

import tensorflow as tf

GLOBAL_BATCH = 16


def make_strategy(mode, args):
    if mode == "mirrored_gpu":
        num_replicas, reduce = int(args[0]), args[1]
        # Float32 matmuls in float32: TF32 would round each replica's differently.
        tf.config.experimental.enable_tensor_float_32_execution(False)
        if reduce == "hierarchical":  # NCCL refuses two replicas on one GPU: it gets one each
            gpu = tf.config.list_physical_devices("GPU")[0]
            tf.config.set_logical_device_configuration(
                gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=2048)] * num_replicas)
        cross_device_ops = {"nccl": tf.distribute.NcclAllReduce,
                            "hierarchical": tf.distribute.HierarchicalCopyAllReduce}[reduce]()
        return tf.distribute.MirroredStrategy(
            [f"/gpu:{i}" for i in range(num_replicas)], cross_device_ops=cross_device_ops)
    if mode == "mirrored":
        num_replicas = int(args[0])
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * num_replicas
        )
        return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(num_replicas)])
    index, workers = int(args[0]), args[1].split(",")
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
    )
    return tf.distribute.MultiWorkerMirroredStrategy()


def main(mode, args, xla=False, adam=False):
    # The strategy first: collectives must be configured before any other op runs.
    strategy = make_strategy(mode, args)
    import keras
    import numpy as np

    import keras_transformer as kt
    from keras_transformer import optimizers

    rng = np.random.RandomState(0)
    # 32 pairs of very different lengths: replicas see different token counts.
    source = np.zeros((32, 12), "int32")
    decoder_inputs = np.zeros((32, 10), "int32")
    targets = np.zeros((32, 10), "int32")
    for row in range(32):
        n, m = rng.randint(1, 13), rng.randint(1, 10)
        source[row, :n] = rng.randint(4, 50, n)
        decoder_inputs[row, : m + 1] = np.concatenate([[2], rng.randint(4, 50, m)])
        targets[row, : m + 1] = np.concatenate([decoder_inputs[row, 1 : m + 1], [3]])
    inputs = {"encoder_inputs": source, "decoder_inputs": decoder_inputs}
    config = kt.TransformerConfig.tiny(50, d_model=32, d_ff=64, dropout_rate=0.0)
    keras.utils.set_random_seed(0)
    initial_weights = kt.build_transformer(config).get_weights()

    def train(strategy):
        # Global batches, as train.py feeds them; the strategy splits each one
        # among its replicas (and workers).
        batches = tf.data.Dataset.from_tensor_slices((inputs, targets)).batch(GLOBAL_BATCH)
        with strategy.scope():
            model = kt.build_transformer(config)
            model.set_weights(initial_weights)
            # SGD, not Adam: Adam's first updates are about lr * sign(gradient), which
            # turns rounding-level gradients into lr-sized steps and hides what we
            # compare, the gradients. With --adam, an epsilon of 1e-3 (the paper's
            # 1e-9 would do that) to compare the update itself.
            schedule = kt.TransformerSchedule(32, 10, scale=50.0 if not adam else 0.5)
            optimizer = (optimizers.Adam(schedule, jit_compile=xla, epsilon=1e-3) if adam
                         else keras.optimizers.SGD(schedule))
            model.compile(
                optimizer=optimizer,
                loss=kt.LabelSmoothedCrossEntropy(),
                jit_compile=xla,
            )
        # The dev pass on the same batches: the strategy's test step too.
        history = model.fit(batches, epochs=1, validation_data=batches, verbose=0,
                            shuffle=False)
        return model.get_weights(), history.history, model

    distributed, distributed_logs, model = train(strategy)
    one, one_logs, _ = train(tf.distribute.OneDeviceStrategy(
        "/gpu:0" if mode == "mirrored_gpu" else "/cpu:0"))
    num_replicas = strategy.num_replicas_in_sync
    # Tokens each replica sees in each global batch: Keras's own per-replica mean
    # would weight these unevenly.
    tokens_per_row = (targets != 0).sum(-1)
    shard_tokens = tokens_per_row.reshape(-1, num_replicas, GLOBAL_BATCH // num_replicas).sum(-1)
    print(json.dumps({
        "num_replicas": num_replicas,
        "largest_update": max(float(np.abs(a - b).max()) for a, b in zip(one, initial_weights)),
        "largest_difference": max(float(np.abs(a - b).max()) for a, b in zip(one, distributed)),
        "tokens_per_replica": shard_tokens.tolist(),
        # The epoch's mean loss as fit logs it, and the dev pass's: one device's, and
        # the strategy's.
        "loss": [one_logs["loss"][-1], distributed_logs["loss"][-1]],
        "val_loss": [one_logs["val_loss"][-1], distributed_logs["val_loss"][-1]],
        # How the strategy's step was compiled: by replica with --xla.
        "replica_jit_compile": model.replica_jit_compile,
        "jit_compile": model.jit_compile,
        # With --adam --xla: the devices whose update XLA compiled, one program each.
        "compiled_updates": [function.experimental_get_tracing_count() for function in
                             getattr(model.optimizer, "_device_updates", {}).values()],
    }))


if __name__ == "__main__":
    arguments = [argument for argument in sys.argv[2:] if argument not in ("--xla", "--adam")]
    main(sys.argv[1], arguments, xla="--xla" in sys.argv[2:], adam="--adam" in sys.argv[2:])
