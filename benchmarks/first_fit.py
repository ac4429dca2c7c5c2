"""How long `model.fit` takes to its first step as a library user calls it (one
device, no distribution strategy), and how many times it traces the training step;
printed as JSON.

    python benchmarks/first_fit.py                            # base model, 16 x 24 tokens
    python benchmarks/first_fit.py --xla on                   # with XLA (its compilation too)
    python benchmarks/first_fit.py --model tiny --steps 2     # a smoke run

In one process: importing TensorFlow and the package, building the model and
`training.compile_for_training`, then `model.fit` over a fixed random batch for one
step (`first_fit_seconds`: tracing the step, building or loading its XLA program
where XLA is on, running it) and for `--steps` more (`seconds_per_step`). A step
whose first trace creates variables (an optimizer's slots, metrics) is traced again
by TensorFlow; `train_step_traces` counts the traces, and `train_step_graph_ops` the
ops of the last (what a run builds in Python, and XLA converts, at every start).
"""

import argparse
import json
import os
import sys
import time

START = time.monotonic()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

from keras_transformer.cli.common import use_command_environment  # noqa: E402
from keras_transformer.cli.common import use_xla_gpu_flags  # noqa: E402

use_command_environment()  # as the commands: TensorFlow quiet, its BFC allocator

use_xla_gpu_flags()  # as train.py


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="base", help="TransformerConfig preset")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--length", type=int, default=24)
    parser.add_argument("--xla", default="off", choices=("off", "on"))
    parser.add_argument("--steps", type=int, default=5, help="steps timed after the first")
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf

    import keras_transformer as kt
    from keras_transformer import training
    from machine import cpu_flags
    from machine import tensorflow_device

    imported = time.monotonic()
    model = kt.build_transformer(kt.TransformerConfig.preset(args.model,
                                                             vocab_size=args.vocab_size))
    training.compile_for_training(model, jit_compile=args.xla == "on")
    built = time.monotonic()
    traces = []
    train_step = type(model).train_step

    graphs = []

    def counted(self, data):
        traces.append(len(self.optimizer.variables))
        graphs.append(tf.compat.v1.get_default_graph())  # the step's, being traced
        return train_step(self, data)

    type(model).train_step = counted
    rng = np.random.default_rng(0)
    ids = lambda: rng.integers(3, args.vocab_size, (args.batch_size, args.length))  # noqa: E731
    batch = ({"encoder_inputs": ids().astype("int32"), "decoder_inputs": ids().astype("int32")},
             ids().astype("int32"))
    batches = tf.data.Dataset.from_tensors(batch).repeat()
    model.fit(batches, steps_per_epoch=1, epochs=1, verbose=0, shuffle=False)
    first = time.monotonic()
    model.fit(batches, steps_per_epoch=args.steps, epochs=1, verbose=0, shuffle=False)
    done = time.monotonic()
    print(json.dumps({
        "benchmark": "first_fit", "model": args.model, "vocab_size": args.vocab_size,
        "batch": [args.batch_size, args.length], "xla": args.xla == "on",
        "import_seconds": round(imported - START, 2), "build_seconds": round(built - imported, 2),
        "first_fit_seconds": round(first - built, 2),
        "seconds_per_step": round((done - first) / args.steps, 4),
        "train_step_traces": len(traces), "optimizer_variables_at_each_trace": traces,
        "train_step_graph_ops": len(graphs[-1].get_operations()),
        "device": tensorflow_device(), "machine": cpu_flags(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "tf_xla_flags": os.environ.get("TF_XLA_FLAGS", ""),
    }, indent=2))


if __name__ == "__main__":
    main()
