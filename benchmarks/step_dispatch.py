"""How much of a training step the host costs: the model compiled as `train` compiles it
(`training.compile_for_training`, XLA), on a fixed batch, its steps run several ways,
printed as JSON.

    python benchmarks/step_dispatch.py                  # on a GPU: the base model, 520 x 48
    python benchmarks/step_dispatch.py --batch-sizes 260,520 --strategy default,one_device
    python benchmarks/step_dispatch.py --model tiny --vocab-size 300 --batch-sizes 8 \\
        --length 16 --steps 10 --repeats 2                # a quick smoke run

For each strategy and batch size (rows of `--length` tokens):
- `sync`: each step's loss read before the next step starts (as `train_on_batch`, or
  `fit` with a callback that reads every step's logs, as `train`'s do): the host's
  work between two steps is added to each step.
- `async`: `--steps` steps started back to back and one loss read at the end:
  `dispatch_seconds` is the host's time to start one step. Where it is shorter than
  the step, the device sets the pace; where it is as long, either the host's work per
  step is as long as the device's, or something makes the host wait for the device
  each step. How the step's time changes with the batch tells which: the host's work
  hardly depends on the batch, the device's does.
Then, for the first strategy at the first batch size:
- `fit`: `model.fit` over the batch repeated, no callback reading the steps' logs;
- `fit_steps_per_execution`: the same with `steps_per_execution=--steps-per-execution`
  (Keras runs that many steps in one call, a loop in the graph; 1: not run).

Strategies: `default` (no strategy: the batches reach the step from the host's memory,
copied in each step) and `one_device` (`tf.distribute.OneDeviceStrategy` on the first
GPU, as `train --strategy auto` on one GPU, its dataset distributed: the batches are
prefetched to the device). Seconds are per step, the medians of `--repeats` timed
runs after an untimed one. Set XLA_FLAGS (e.g. `--xla_gpu_enable_command_buffer=` to
launch each kernel apart instead of through CUDA graphs) to compare XLA's settings,
one process each.
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.append(ROOT)

from machine import cpu_flags  # noqa: E402
from machine import tensorflow_device  # noqa: E402
from train_throughput import fixed_batch  # noqa: E402  (and train.py's XLA flags)

from keras_transformer.cli.common import use_command_environment  # noqa: E402

use_command_environment()  # as the commands: TensorFlow quiet, its BFC allocator

STRATEGIES = ("default", "one_device")


def make_strategy(name):
    """`default`: TensorFlow's default strategy (no distribution: a distributed dataset
    is the dataset itself); `one_device`: as `train` makes it."""
    import tensorflow as tf

    from keras_transformer import distributed

    return tf.distribute.get_strategy() if name == "default" else distributed.make_strategy(name)


def time_ways(model, iterator, args):
    """`sync` and `async` (see the module's doc) on `iterator`."""
    def sync_run():
        start = time.perf_counter()
        for _ in range(args.steps):
            float(model.train_function(iterator)["loss"])
        return (time.perf_counter() - start) / args.steps, None

    def async_run():
        dispatch = 0.0
        start = time.perf_counter()
        for _ in range(args.steps):
            before = time.perf_counter()
            logs = model.train_function(iterator)
            dispatch += time.perf_counter() - before
        float(logs["loss"])
        return (time.perf_counter() - start) / args.steps, dispatch / args.steps

    ways = {}
    for name, run in (("sync", sync_run), ("async", async_run)):
        run()  # untimed
        timed = [run() for _ in range(args.repeats)]
        ways[name] = {"seconds_per_step": round(statistics.median([t for t, _ in timed]), 5)}
        if timed[0][1] is not None:
            ways[name]["dispatch_seconds"] = round(statistics.median([d for _, d in timed]), 5)
    return ways


def time_fit(model, dataset, args):
    """`fit` and `fit_steps_per_execution` (see the module's doc)."""
    import keras

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.start)

    def fit_runs():
        timer = EpochTimer()
        model.fit(dataset, steps_per_epoch=args.steps, epochs=args.repeats + 1,
                  callbacks=[timer], shuffle=False, verbose=0)
        return [seconds / args.steps for seconds in timer.seconds[1:]]

    ways = {"fit": {"seconds_per_step": round(statistics.median(fit_runs()), 5)}}
    if args.steps_per_execution > 1:
        # Keras reads it when it makes the train function and when fit makes its iterator.
        model.steps_per_execution = args.steps_per_execution
        model.make_train_function(force=True)
        start = time.perf_counter()
        ways["fit_steps_per_execution"] = {
            "steps_per_execution": args.steps_per_execution,
            "seconds_per_step": round(statistics.median(fit_runs()), 5),
            "seconds_with_compilation": round(time.perf_counter() - start, 2)}
    return ways


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batch-sizes", default="520",
                        help="comma-separated rows a batch (each shape compiles once)")
    parser.add_argument("--length", type=int, default=48)
    parser.add_argument("--precision", default="mixed_bfloat16")
    parser.add_argument("--strategy", default="default",
                        help=f"comma-separated: {', '.join(STRATEGIES)}")
    parser.add_argument("--steps", type=int, default=40, help="steps a timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each way")
    parser.add_argument("--steps-per-execution", type=int, default=8)
    args = parser.parse_args()
    batch_sizes = [int(rows) for rows in args.batch_sizes.split(",")]
    strategies = args.strategy.split(",")
    unknown = sorted(set(strategies) - set(STRATEGIES))
    if unknown:
        parser.error(f"--strategy: {', '.join(unknown)} is none of {', '.join(STRATEGIES)}")

    import keras
    import tensorflow as tf

    import keras_transformer as kt
    from keras_transformer import training

    config = kt.TransformerConfig.preset(args.model, vocab_size=args.vocab_size)
    report = {"benchmark": "step_dispatch", "model": args.model, "vocab_size": config.vocab_size,
              "length": args.length, "precision": args.precision,
              "xla_flags": os.environ.get("XLA_FLAGS", ""), "device": tensorflow_device(),
              "machine": cpu_flags(), "steps": args.steps, "repeats": args.repeats, "runs": []}
    for strategy_name in strategies:
        strategy = make_strategy(strategy_name)
        with strategy.scope():
            keras.config.set_dtype_policy(args.precision)
            keras.utils.set_random_seed(0)
            model = kt.Transformer(config)
            keras.config.set_dtype_policy("float32")
            training.compile_for_training(model, jit_compile=True)
        model.make_train_function()
        for rows in batch_sizes:
            dataset = tf.data.Dataset.from_tensors(
                fixed_batch(config.vocab_size, rows, args.length)).repeat()
            iterator = iter(strategy.experimental_distribute_dataset(dataset))
            start = time.perf_counter()
            float(model.train_function(iterator)["loss"])
            run = {"strategy": strategy_name, "strategy_class": type(strategy).__name__,
                   "batch_size": rows,
                   "target_tokens": rows * args.length,
                   "first_step_seconds": round(time.perf_counter() - start, 2),
                   **time_ways(model, iterator, args)}
            if not report["runs"]:  # fit, for the first strategy and batch size
                run.update(time_fit(model, dataset, args))
            report["runs"].append(run)
            print(json.dumps(run), file=sys.stderr, flush=True)  # progress
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
