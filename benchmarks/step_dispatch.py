"""How much of a training step the host costs: the model compiled as `train` compiles it
(`training.compile_for_training`, XLA), on one fixed batch, its steps run four ways,
printed as JSON.

    python benchmarks/step_dispatch.py --model base --vocab-size 8000 --batch-size 520 \\
        --length 48 --precision mixed_bfloat16          # on a GPU
    python benchmarks/step_dispatch.py --model tiny --vocab-size 300 --batch-size 8 \\
        --length 16 --steps 10                          # a quick smoke run

- `sync`: each step's loss read before the next step starts (as `train_on_batch`, or
  `fit` with a callback that reads every step's logs, as `train`'s do): the host's
  work between two steps is added to each step.
- `async`: `--steps` steps started back to back and one loss read at the end:
  `dispatch_seconds` is the host's time to start one step (it returns before the device
  finishes); where it is shorter than the step, the device sets the pace.
- `fit`: `model.fit` over the batch repeated, no callback reading the steps' logs.
- `fit_steps_per_execution`: the same with `steps_per_execution=--steps-per-execution`
  (Keras runs that many steps in one call, a loop in the graph).

Seconds are per step, the medians of `--repeats` timed runs after an untimed one. Set
XLA_FLAGS (e.g. `--xla_gpu_enable_command_buffer=` to launch each kernel apart instead
of through CUDA graphs) to compare XLA's settings, one process each.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.append(ROOT)

from machine import cpu_flags  # noqa: E402
from machine import tensorflow_device  # noqa: E402

from keras_transformer.cli.common import use_xla_gpu_flags  # noqa: E402

use_xla_gpu_flags()  # as train.py


def median(values):
    values = sorted(values)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batch-size", type=int, default=520)
    parser.add_argument("--length", type=int, default=48)
    parser.add_argument("--precision", default="mixed_bfloat16")
    parser.add_argument("--steps", type=int, default=40, help="steps a timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each way")
    parser.add_argument("--steps-per-execution", type=int, default=8)
    args = parser.parse_args()

    import keras
    import numpy as np
    import tensorflow as tf

    import keras_transformer as kt
    from keras_transformer import training

    config = kt.TransformerConfig.preset(args.model, vocab_size=args.vocab_size)
    rng = np.random.RandomState(0)
    shape = (args.batch_size, args.length)
    inputs = {"encoder_inputs": rng.randint(4, config.vocab_size, shape).astype("int32"),
              "decoder_inputs": rng.randint(4, config.vocab_size, shape).astype("int32")}
    targets = rng.randint(4, config.vocab_size, shape).astype("int32")
    dataset = tf.data.Dataset.from_tensors((inputs, targets)).repeat()
    report = {"benchmark": "step_dispatch", "model": args.model, "vocab_size": config.vocab_size,
              "batch_size": args.batch_size, "length": args.length, "precision": args.precision,
              "xla_flags": os.environ.get("XLA_FLAGS", ""), "device": tensorflow_device(),
              "machine": cpu_flags(), "steps": args.steps, "repeats": args.repeats}

    keras.config.set_dtype_policy(args.precision)
    keras.utils.set_random_seed(0)
    model = kt.Transformer(config)
    keras.config.set_dtype_policy("float32")
    training.compile_for_training(model, jit_compile=True)
    model.make_train_function()
    iterator = iter(dataset)
    start = time.perf_counter()
    float(model.train_function(iterator)["loss"])
    report["first_step_seconds"] = round(time.perf_counter() - start, 2)
    print(f"[first step] {report['first_step_seconds']} s", file=sys.stderr, flush=True)

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

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.start)

    def fit_runs():
        timer = EpochTimer()
        timer.seconds = []
        model.fit(dataset, steps_per_epoch=args.steps, epochs=args.repeats + 1,
                  callbacks=[timer], verbose=0)
        return [seconds / args.steps for seconds in timer.seconds[1:]]

    ways = {}
    for name, run in (("sync", sync_run), ("async", async_run)):
        run()  # untimed
        timed = [run() for _ in range(args.repeats)]
        ways[name] = {"seconds_per_step": round(median([t for t, _ in timed]), 5)}
        if timed[0][1] is not None:
            ways[name]["dispatch_seconds"] = round(median([d for _, d in timed]), 5)
        print(f"[{name}] {ways[name]}", file=sys.stderr, flush=True)
    ways["fit"] = {"seconds_per_step": round(median(fit_runs()), 5)}
    print(f"[fit] {ways['fit']}", file=sys.stderr, flush=True)
    if args.steps_per_execution > 1:
        # Keras reads it when it makes the train function and when fit makes its iterator.
        model.steps_per_execution = args.steps_per_execution
        model.make_train_function(force=True)
        start = time.perf_counter()
        ways["fit_steps_per_execution"] = {
            "steps_per_execution": args.steps_per_execution,
            "seconds_per_step": round(median(fit_runs()), 5),
            "seconds_with_compilation": round(time.perf_counter() - start, 2)}
        print(f"[fit_steps_per_execution] {ways['fit_steps_per_execution']}",
              file=sys.stderr, flush=True)
    report["ways"] = ways
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
