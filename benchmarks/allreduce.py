"""What `MirroredStrategy`'s gradient all-reduce costs a training step, measured over
logical devices carved from one GPU (or CPU), and the step of 8 GPUs projected from it.
JSON on stdout, progress on stderr.

    python benchmarks/allreduce.py                        # base model, 2 logical devices
    python benchmarks/allreduce.py --model tiny --tokens-per-batch 2048 --steps 5

In one process, TensorFlow's first GPU (else the CPU) split into `--replicas`
logical devices:

1. **The all-reduce alone**: per-replica tensors shaped like the model's trainable
   variables (float32, as Keras's optimizer sums the gradients), summed with
   `ReplicaContext.all_reduce` as `TensorFlowOptimizer` does, under the cross-device
   reduction train.py's `--strategy mirrored` would use there (on logical GPUs of one
   card `HierarchicalCopyAllReduce`: NCCL refuses two replicas on one GPU).
2. **Training steps** on one global batch of `--tokens-per-batch` // `--length` rows
   (random ids), each called as `fit` calls it (`model.train_function` on an iterator
   over the distributed dataset), the first steps (their compilations) of all setups
   side by side, then the timed steps of all setups taking turns: the
   replicas; one device on the whole batch; and one device on a replica's share of the
   batch of `--project-gpus` GPUs. `--xla on` (as train runs: on the replicas XLA
   compiles each replica's step, `distributed.MultiWorkerModel.compile`), `off`, or
   `both`.
   On one card the replicas share its cores, so the replicas' step less one device's
   on the same batch is what splitting the batch and reducing its gradients cost.
3. **The optimizer's update alone** on one device (`time_update`): under XLA on each
   replica it runs outside the compiled step, once on every GPU at the same time, as
   one XLA program of its own (`optimizers.Adam`'s `jit_compile`, which train sets
   with XLA); also timed as Keras alone runs it, without XLA (`uncompiled_seconds`).
4. **8 GPUs on paper**, each with its own card: a replica's step on its share of the
   batch (measured, with XLA unless `--xla off`), plus the update outside the step
   (with XLA: its own program), plus a ring all-reduce of the gradient bytes over
   `--link-gb-s` (NVLink 4 on an H100 SXM: 450 GB/s each way, the datasheet's 900 GB/s
   in both): 2 (n - 1) / n x bytes / bandwidth; nothing of it overlapping, so an upper
   bound. Both ways of using 8 GPUs: the paper's (its batch split 8 ways) and train's
   (`--tokens-per-batch` is per replica: 8 whole batches a step).
   On the one card, the replicas' step less the replicas' shares run one after the
   other on one device (`on_one_card`) checks what the all-reduce and the update add
   there; it is no projection, since the replicas share the card.
"""

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.append(ROOT)

from machine import cpu_flags  # noqa: E402
from machine import tensorflow_device  # noqa: E402

from keras_transformer.cli.common import use_command_environment  # noqa: E402
from keras_transformer.cli.common import use_xla_gpu_flags  # noqa: E402

use_command_environment()  # as the commands: TensorFlow quiet, its BFC allocator

use_xla_gpu_flags()  # as train.py: XLA's GEMMs from cuBLAS on a GPU


def progress(started, message):
    print(f"[{time.perf_counter() - started:.0f} s] {message}", file=sys.stderr, flush=True)


def gpu_memory_mb():
    """The first GPU's memory in MiB from nvidia-smi, or None."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True).stdout
        return int(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def logical_devices(replicas, memory_mb):
    """Splits the first GPU (else the CPU) into `replicas` logical devices; returns
    their names and kind. Must run before TensorFlow starts its devices."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        memory_mb = memory_mb or int(0.85 * (gpu_memory_mb() or 16000) / replicas)
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=memory_mb)] * replicas)
        return [f"/gpu:{i}" for i in range(replicas)], "gpu"
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    return [f"/cpu:{i}" for i in range(replicas)], "cpu"


def time_allreduce(strategy, shapes, repeats):
    """Median seconds of one all-reduce (sum) of float32 tensors of `shapes`, one
    set per replica, as Keras's optimizer sums gradients."""
    import numpy as np
    import tensorflow as tf

    values = strategy.experimental_distribute_values_from_function(
        lambda context: [tf.fill(shape, float(context.replica_id_in_sync_group + 1))
                         for shape in shapes])

    @tf.function
    def reduce_all(values):
        def per_replica(values):
            summed = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, values)
            # Every sum feeds the result, so none is pruned.
            return tf.add_n([tf.reshape(value, [-1])[-1] for value in summed])

        return strategy.experimental_local_results(strategy.run(per_replica, args=(values,)))

    expected = len(shapes) * sum(range(1, strategy.num_replicas_in_sync + 1))
    results = [float(x) for x in reduce_all(values)]  # traces; checks the sums
    if any(abs(result - expected) > 1e-3 * expected for result in results):
        raise AssertionError(f"all-reduce gave {results}, expected {expected} on each replica")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        [float(x) for x in reduce_all(values)]
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def time_update(strategy, config, precision, repeats, jit_compile=True):
    """Median seconds of one optimizer update on one device: the paper's Adam applied
    to every trainable variable in a `tf.function`, compiled by XLA as each replica
    applies it when XLA compiles only its forward and backward pass
    (`distributed.MultiWorkerModel`, `optimizers.Adam`), or without XLA as Keras
    alone would; on several GPUs each applies its own at once."""
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_transformer as kt

    keras.config.set_dtype_policy(precision)
    with strategy.scope():
        model = kt.build_transformer(config)
        optimizer = kt.transformer_optimizer(config.d_model)
        optimizer.build(model.trainable_variables)
        gradients = [tf.fill(variable.shape, 1e-3) for variable in model.trainable_variables]
    keras.config.set_dtype_policy("float32")

    @tf.function(jit_compile=jit_compile)
    def update():
        def apply():
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return tf.identity(optimizer.iterations)

        return strategy.run(apply)

    int(update())  # traces
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        int(update())  # waits for the update
        times.append(time.perf_counter() - start)
    return float(np.median(times))


class Setup:
    """A model under `strategy` with a step function over its batch, as `fit` runs it."""

    def __init__(self, name, strategy, config, batch, precision, jit_compile):
        import keras
        import tensorflow as tf

        import keras_transformer as kt

        self.name, self.strategy = name, strategy
        self.rows, self.length = batch[1].shape
        keras.config.set_dtype_policy(precision)
        with strategy.scope():
            keras.utils.set_random_seed(0)
            self.model = kt.build_transformer(config)
            self.model.compile(  # as train compiles it: with XLA, the update too
                optimizer=kt.transformer_optimizer(config.d_model, jit_compile=jit_compile),
                loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing),
                jit_compile=jit_compile)
            # The optimizer's and metrics' variables, before the step is traced (as
            # fit builds them: distributed.MultiWorkerModel._maybe_symbolic_build).
            self.model._symbolic_build(data_batch=batch)
        keras.config.set_dtype_policy("float32")
        dataset = tf.data.Dataset.from_tensors(batch).repeat()
        self.iterator = iter(strategy.experimental_distribute_dataset(dataset))
        self.model.make_train_function()
        self.times = []

    def step(self):
        start = time.perf_counter()
        float(self.model.train_function(self.iterator)["loss"])  # waits for the step
        return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--model", default="base", help="a TransformerConfig preset")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--tokens-per-batch", type=int, default=25000,
                        help="the global batch, in source (and target) tokens")
    parser.add_argument("--length", type=int, default=48)
    parser.add_argument("--precision", default="mixed_bfloat16")
    parser.add_argument("--steps", type=int, default=30, help="timed steps of each setup")
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--reduce-repeats", type=int, default=30)
    parser.add_argument("--project-gpus", type=int, default=8)
    parser.add_argument("--link-gb-s", type=float, default=450.0,
                        help="each GPU's link bandwidth each way, GB/s (NVLink 4: 450)")
    parser.add_argument("--memory-mb", type=int, default=0,
                        help="each logical GPU's memory (default: 85%% of the card's, shared)")
    parser.add_argument("--xla", choices=("on", "off", "both"), default="on",
                        help="the steps with XLA (on the replicas, each replica's step "
                             "compiled apart, as train does), without it, or both")
    args = parser.parse_args()
    started = time.perf_counter()

    import tensorflow as tf

    devices, kind = logical_devices(args.replicas, args.memory_mb)
    import numpy as np

    import keras_transformer as kt

    cross_device_ops = tf.distribute.HierarchicalCopyAllReduce() if kind == "gpu" else None
    mirrored = tf.distribute.MirroredStrategy(devices, cross_device_ops=cross_device_ops)
    one = tf.distribute.OneDeviceStrategy(devices[0])
    config = getattr(kt.TransformerConfig, args.model)(args.vocab_size)
    rows = args.tokens_per_batch // args.length
    rows -= rows % args.replicas
    share = max(1, rows // args.project_gpus)
    rng = np.random.RandomState(0)

    def batch(rows):
        def ids():
            return rng.randint(4, config.vocab_size, (rows, args.length)).astype("int32")

        return {"encoder_inputs": ids(), "decoder_inputs": ids()}, ids()

    with mirrored.scope():
        shapes = [tuple(w.shape) for w in kt.build_transformer(config).trainable_weights]
    gradient_bytes = 4 * sum(int(np.prod(shape)) for shape in shapes)
    reduce_seconds = time_allreduce(mirrored, shapes, args.reduce_repeats)
    progress(started, f"all-reduce of {len(shapes)} tensors, {gradient_bytes / 1e6:.0f} MB: "
                      f"{reduce_seconds * 1e3:.2f} ms")

    update_seconds = time_update(one, config, args.precision, args.reduce_repeats)
    uncompiled_seconds = time_update(one, config, args.precision, args.reduce_repeats,
                                     jit_compile=False)
    progress(started, f"the optimizer's update alone: {update_seconds * 1e3:.2f} ms as one XLA "
                      f"program, {uncompiled_seconds * 1e3:.2f} ms without XLA")

    half = rows // args.replicas  # a replica's share here
    batches = {rows: batch(rows), half: batch(half), share: batch(share)}
    setups = []
    for xla in {"on": [True], "off": [False], "both": [False, True]}[args.xla]:
        suffix = "_xla" * xla
        setups += [Setup(f"{args.replicas}_replicas{suffix}", mirrored, config, batches[rows],
                         args.precision, xla),
                   Setup(f"one_device{suffix}", one, config, batches[rows], args.precision, xla)]
        setups += [Setup(f"one_device_{part}_rows{suffix}", one, config, batches[part],
                         args.precision, xla) for part in sorted({half, share})]
    # The first steps compile (about a minute each for the base model on an H200, one
    # after another 4 minutes); side by side, as train compiles its shapes, in one.
    def warm_up(setup):
        first = sum(setup.step() for _ in range(args.warmup_steps))
        setup.first_steps_seconds = round(first, 2)
        progress(started, f"{setup.name}: {args.warmup_steps} first steps in {first:.1f} s")

    with concurrent.futures.ThreadPoolExecutor(min(len(setups), os.cpu_count() or 1)) as pool:
        for done in [pool.submit(warm_up, setup) for setup in setups]:
            done.result()
    for _ in range(args.steps):  # in turns: a shared machine's load falls on all alike
        for setup in setups:
            setup.times.append(setup.step())
    progress(started, f"{args.steps} timed steps each")

    step = {setup.name: float(np.median(setup.times)) for setup in setups}
    results = {setup.name: {"rows": setup.rows, "length": setup.length,
                            "first_steps_seconds": setup.first_steps_seconds,
                            "seconds_per_step": round(step[setup.name], 5),
                            "target_tokens_per_second": round(
                                setup.rows * setup.length / step[setup.name], 1)}
               for setup in setups}
    n = args.project_gpus
    ring_seconds = 2 * (n - 1) / n * gradient_bytes / (args.link_gb_s * 1e9)
    xla = args.xla != "off"
    suffix = "_xla" * xla  # what train runs: XLA where measured
    # Under XLA each replica's update runs outside its compiled step; without XLA it
    # is in the step measured.
    outside = update_seconds if xla else 0.0
    one_gpu = step[f"one_device{suffix}"]

    def on_gpus(step_seconds, rows_each):
        projected = step_seconds + outside + ring_seconds
        return {"rows_per_gpu": rows_each,
                "gpu_step_seconds": round(step_seconds, 5),
                "update_seconds": round(outside, 6),
                "ring_allreduce_seconds": round(ring_seconds, 9),
                "step_seconds": round(projected, 5),
                "target_tokens_per_second": round(n * rows_each * args.length / projected, 1),
                # Against one GPU on the whole global batch, with XLA where measured.
                "speedup_over_one_gpu": round(
                    n * rows_each * one_gpu / (rows * projected), 2),
                "outside_step_share": round((outside + ring_seconds) / projected, 3)}

    replicas_seconds = step[f"{args.replicas}_replicas{suffix}"]
    shares_seconds = args.replicas * step[f"one_device_{half}_rows{suffix}"]
    report = {
        "benchmark": "allreduce",
        "date": time.strftime("%Y-%m-%d"),
        "device": tensorflow_device() if kind == "gpu" else {"cpu": cpu_flags()},
        "versions": {"tensorflow": tf.__version__},
        "logical_devices": devices,
        "cross_device_ops": type(mirrored.extended._cross_device_ops
                                 or mirrored.extended._inferred_cross_device_ops).__name__,
        "model": args.model, "vocab_size": config.vocab_size, "precision": args.precision,
        "global_batch": [rows, args.length],
        "allreduce": {"tensors": len(shapes), "bytes": gradient_bytes,
                      "seconds": round(reduce_seconds, 6),
                      "gb_per_second": round(gradient_bytes / reduce_seconds / 1e9, 1)},
        "steps": results,
        # What splitting the batch over replicas and summing their gradients cost a
        # step on one card, against one device on the same batch (XLA as measured).
        "replicas_over_one_device": round(
            step[f"{args.replicas}_replicas{suffix}"] / step[f"one_device{suffix}"], 3),
        "xla_speedup_one_device": (round(step["one_device"] / step["one_device_xla"], 3)
                                   if args.xla == "both" else None),
        "xla_speedup_replicas": (
            round(step[f"{args.replicas}_replicas"] / step[f"{args.replicas}_replicas_xla"], 3)
            if args.xla == "both" else None),
        "update": {"variables": len(shapes), "seconds": round(update_seconds, 6),
                   "uncompiled_seconds": round(uncompiled_seconds, 6)},
        # The replicas' step on the one card, against their shares of the batch run
        # one after the other on one device: what the all-reduce, the update outside
        # XLA and the split add there, less what overlaps (negative where the
        # replicas' steps overlap on the card).
        "on_one_card": {"replicas_step_seconds": round(replicas_seconds, 5),
                        "shares_one_after_another_seconds": round(shares_seconds, 5),
                        "added_seconds": round(replicas_seconds - shares_seconds, 5)},
        "projection": {
            "gpus": n,
            "link_gb_per_second": args.link_gb_s,
            "xla": xla,
            # The paper's: one batch of --tokens-per-batch split over the GPUs.
            "batch_split": on_gpus(step[f"one_device_{share}_rows{suffix}"], share),
            # train's: --tokens-per-batch on each GPU.
            "batch_per_gpu": on_gpus(one_gpu, rows),
        },
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
