"""Training throughput of the Transformer: seconds per step, target tokens per
second and model FLOPs utilization, printed as JSON.

    python benchmarks/train_throughput.py                          # base, float32, no XLA
    python benchmarks/train_throughput.py --implementations ours,keras_hub \
        --precisions float32,mixed_bfloat16 --xla off,on       # the whole matrix
    python benchmarks/train_throughput.py --model tiny --steps 5   # a quick smoke run
    python benchmarks/train_throughput.py --tokens-per-batch 25000 --length 100 \
        --precisions mixed_bfloat16 --xla on --real-batches bundled --compare-torch  # on a GPU

A fixed batch of `--batch-size` x `--length` tokens (64 x 64 = 4096 by default; or
`--tokens-per-batch` // `--length` rows) for source and target, random ids from the
vocabulary (37000 by default), the paper's optimizer and label-smoothed loss. The
first `--warmup-steps` steps (graph build, XLA compilation) are timed apart from the
measured steps, which alternate between the implementations so that a shared
machine's load falls on all alike.

MFU is the analytic FLOPs of a training step (3x the forward matmul FLOPs,
`forward_flops`) over the step time, against a peak for the compute dtype (the
matrix-multiply dtype: float32 runs as TF32 on an Ampere-or-newer GPU, as TensorFlow
does by default) that each result names in `peak`: on a GPU in the datasheet table
(benchmarks/machine.py), its dense datasheet figure; otherwise the matmul peak
measured in this run (on a GPU a chain of 8192-size matmuls kept on the device, on
the CPU a 2048-size one; with XLA or without, as the step ran). On a GPU `mfu_datasheet` and
`mfu_measured` give both where both exist. `device` records the GPU (name, compute
capability, TF32, TensorFlow's CUDA build, nvidia-smi's memory and driver) or the CPU.

Our runs carry `speedup_over_keras_hub` (the same-size model from keras-hub's layers,
same precision and XLA setting), for mixed precision `speedup_over_float32`, and with
`--compare-torch` `speedup_over_torch`: our tokens/s over those of torch.nn.Transformer
at the same shape (benchmarks/torch_transformer.py, run in its own process) for the
matching precision (float32 against float32, TF32 allowed on a GPU; mixed_bfloat16
against bf16 autocast), against its torch.compile run where that ran, else eager.

`--real-batches CORPUS` (any train.py --data value; "bundled" is the bundled
English-Spanish corpus) also times our model on the batches train.py would feed it:
`TrainingBatches` over the corpus's train split with a vocabulary of `--vocab-size`
learned from it, `--tokens-per-batch` (or batch size x length) tokens a batch and
sentences up to `--max-sentence-tokens`. The model (for the fixed batch too) then
has the learned vocabulary's size. Its `real_batches` report non-padding and padded
target tokens/s over the steps on shapes already seen (sustained), the distinct
batch shapes, the time of each new shape's first step (under XLA every shape is
compiled before, side by side, as train does: `compile_ahead_seconds`), the ratio of the
sustained real-batch tokens/s to the fixed batch's, and with `--fit-steps N` the rates of
`model.fit` over N real batches an epoch, without callbacks, with train.py's, and on a
twin of the model made and compiled as train.py makes it (its strategy and metrics).

`--profile-steps N` profiles N more steps on the fixed batch after the timed ones (and
as many of torch's with `--compare-torch`): each result's `profile` sums the GPU's
kernels by kind, per step, in one shape for both frameworks (benchmarks/kernel_profile.py).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:  # keras_transformer and the command lines' corpus flags
    sys.path.append(ROOT)

from machine import cpu_flags  # noqa: E402
from machine import mfu_fields  # noqa: E402
from machine import tensorflow_device  # noqa: E402
from machine import tensorflow_peaks  # noqa: E402

from keras_transformer.cli.common import use_command_environment  # noqa: E402
from keras_transformer.cli.common import use_xla_gpu_flags  # noqa: E402

# As train: TensorFlow quiet, its BFC allocator (TF_CPU_ALLOCATOR_USE_BFC=false
# measures without it).
use_command_environment()

use_xla_gpu_flags()  # as train.py: XLA's GEMMs from cuBLAS on a GPU (XLA_FLAGS overrides)

# Our precision -> torch_transformer.py's, for speedup_over_torch.
TORCH_PRECISIONS = {"float32": "float32", "mixed_bfloat16": "bf16"}


def forward_flops(config, batch_size, source_length, target_length):
    """Matrix-multiply FLOPs of one forward pass (2 per multiply-add)."""
    d, h, dk, dv, ff = config.d_model, config.num_heads, config.d_k, config.d_v, config.d_ff
    source_tokens, target_tokens = batch_size * source_length, batch_size * target_length

    def attention(query_tokens, key_tokens, key_length):
        projections = 2 * d * h * (query_tokens * dk + key_tokens * (dk + dv) + query_tokens * dv)
        scores = 2 * query_tokens * key_length * h * (dk + dv)  # Q K^T and weights V
        return projections + scores

    feed_forward = 2 * 2 * d * ff
    encoder = attention(source_tokens, source_tokens, source_length) + source_tokens * feed_forward
    decoder = (attention(target_tokens, target_tokens, target_length)
               + attention(target_tokens, source_tokens, source_length)
               + target_tokens * feed_forward)
    logits = 2 * target_tokens * d * config.vocab_size
    return config.num_layers * (encoder + decoder) + logits


def build_ours(config):
    import keras_transformer as kt

    return kt.build_transformer(config)


def build_keras_hub(config):
    """The same-size encoder-decoder from keras-hub's layers: shared reversible
    embedding, sinusoidal positions, post-norm encoder and decoder blocks."""
    import keras
    import keras_hub

    encoder_inputs = keras.Input((None,), dtype="int32", name="encoder_inputs")
    decoder_inputs = keras.Input((None,), dtype="int32", name="decoder_inputs")
    embedding = keras_hub.layers.ReversibleEmbedding(
        config.vocab_size, config.d_model, mask_zero=True, name="shared_embedding")
    positions = keras_hub.layers.SinePositionEncoding()

    def embed(ids):
        x = embedding(ids) * config.d_model**0.5
        return keras.layers.Dropout(config.dropout_rate)(x + positions(x))

    def block_args():
        return dict(intermediate_dim=config.d_ff, num_heads=config.num_heads,
                    dropout=config.dropout_rate, layer_norm_epsilon=config.layer_norm_epsilon)

    x = embed(encoder_inputs)
    for _ in range(config.num_layers):
        x = keras_hub.layers.TransformerEncoder(**block_args())(x)
    encoded = x
    y = embed(decoder_inputs)
    for _ in range(config.num_layers):
        y = keras_hub.layers.TransformerDecoder(**block_args())(y, encoded)
    logits = keras.layers.Activation("linear", dtype="float32")(embedding(y, reverse=True))
    return keras.Model({"encoder_inputs": encoder_inputs, "decoder_inputs": decoder_inputs},
                       logits)


STARTED = time.perf_counter()


def progress(message):
    """A line on stderr with the seconds since the start: a run stopped by a
    timeout before its report still tells how far it got, and what each part took."""
    print(f"[{time.perf_counter() - STARTED:.0f} s] {message}", file=sys.stderr, flush=True)


def fixed_batch(vocab_size, rows, length):
    """The fixed batch the steps are timed on: random ids (seed 0) from the vocabulary,
    past the special ones, `(inputs, targets)` as `fit` takes them."""
    import numpy as np

    rng = np.random.RandomState(0)
    shape = (rows, length)
    inputs = {"encoder_inputs": rng.randint(4, vocab_size, shape).astype("int32"),
              "decoder_inputs": rng.randint(4, vocab_size, shape).astype("int32")}
    return inputs, rng.randint(4, vocab_size, shape).astype("int32")


def measure(implementations, config, precision, jit_compile, args, peaks, real=None):
    """Results for each implementation at one precision and XLA setting.

    The models are built and warmed up one after the other, then their measured
    steps alternate (A, B, A, B, ...), so that a shared machine's changing load
    falls on all of them alike and their ratio stays fair. With `real` (a
    `TrainingBatches`), our model then trains `--real-steps` steps on its batches.
    """
    import keras
    import numpy as np

    import keras_transformer as kt

    shape = (args.batch_size, args.length)
    inputs, targets = fixed_batch(config.vocab_size, *shape)
    models, warmup_seconds = {}, {}
    keras.config.set_dtype_policy(precision)
    for implementation in implementations:
        keras.utils.set_random_seed(0)
        model = (build_ours if implementation == "ours" else build_keras_hub)(config)
        model.compile(optimizer=kt.transformer_optimizer(config.d_model),
                      loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing),
                      jit_compile=jit_compile)
        start = time.perf_counter()
        for _ in range(args.warmup_steps):
            model.train_on_batch(inputs, targets)
        warmup_seconds[implementation] = time.perf_counter() - start
        models[implementation] = model
        progress(f"{implementation}: {args.warmup_steps} first steps at {args.batch_size} x "
                 f"{args.length} in {warmup_seconds[implementation]:.1f} s")
    keras.config.set_dtype_policy("float32")
    times = {implementation: [] for implementation in implementations}
    for _ in range(args.steps):
        for implementation, model in models.items():
            start = time.perf_counter()
            model.train_on_batch(inputs, targets)
            times[implementation].append(time.perf_counter() - start)
    progress(f"{args.steps} timed steps each")
    profiles = {}
    if args.profile_steps and "ours" in models:  # after the timed steps, as torch's
        profiles["ours"] = profile_steps(models["ours"], inputs, targets, args)
        progress(f"{args.profile_steps} steps profiled")
    results = []
    for implementation, model in models.items():
        seconds = float(np.median(times[implementation]))
        flops = 3 * forward_flops(config, args.batch_size, args.length, args.length)
        result = {
            "implementation": implementation,
            "precision": precision,
            "xla": jit_compile,
            "parameters": model.count_params(),
            "first_steps_seconds": round(warmup_seconds[implementation], 2),
            "seconds_per_step": round(seconds, 4),
            "step_seconds": [round(t, 3) for t in times[implementation]],
            "target_tokens_per_second": round(args.batch_size * args.length / seconds, 1),
            "train_flops_per_step": flops,
            **mfu_fields(flops, seconds, peaks),
            **({"profile": profiles[implementation]} if implementation in profiles else {}),
        }
        if real is not None and implementation == "ours":
            compile_seconds = None
            if jit_compile:  # every real shape compiled side by side first, as train does
                from keras_transformer import training

                start = time.perf_counter()
                training.compile_ahead(model, [real.example_batch(s) for s in real.shapes])
                compile_seconds = round(time.perf_counter() - start, 2)
                progress(f"{len(real.shapes)} real batch shapes compiled in {compile_seconds} s")
            result["real_batches"] = time_real_batches(
                model, real, config, args, peaks, fixed_shape=(*shape, args.length),
                fixed_tokens_per_second=args.batch_size * args.length / seconds)
            result["real_batches"]["compile_ahead_seconds"] = compile_seconds
            progress(f"{args.real_steps} real-batch steps")
            if args.fit_steps:
                result["real_batches"]["fit"] = time_fit(
                    model, real, args, result["real_batches"].get("target_tokens_per_second"),
                    precision)
        results.append(result)
    return results


def profile_steps(model, inputs, targets, args):
    """`--profile-steps` more steps of `model` under TensorFlow's profiler, its trace
    written under `--profile-dir` and summed by kind (benchmarks/kernel_profile.py)."""
    import tensorflow as tf

    from kernel_profile import find_xspace
    from kernel_profile import summarize_xspace

    directory = args.profile_dir or tempfile.mkdtemp(prefix="train_throughput_profile_")
    tf.profiler.experimental.start(directory, options=tf.profiler.experimental.ProfilerOptions(
        host_tracer_level=1, python_tracer_level=0, device_tracer_level=1))
    start = time.perf_counter()
    for _ in range(args.profile_steps):
        model.train_on_batch(inputs, targets)  # returns the loss: each step synchronized
    wall = time.perf_counter() - start
    tf.profiler.experimental.stop()
    path = find_xspace(directory)
    return {"xplane": path, **summarize_xspace(path, args.profile_steps, wall)}


def time_real_batches(model, batches, config, args, peaks, fixed_shape,
                      fixed_tokens_per_second):
    """`--real-steps` steps of `model` on `batches` (a `TrainingBatches`) from its
    first step, each called as `fit` calls it: the model's step function on an
    iterator over the batches, whose shapes it does not know. (`train_on_batch`
    hands it each batch's known shape, a step traced and compiled anew for each,
    beside the ones `compile_ahead` and `fit` use: 7 more compilations of about
    47 s each for the base model on an H200.)

    A step on a shape the model has not run yet (the fixed batch's counts as run)
    is timed apart: without XLA it traces the step again (Keras relaxes the traced
    shapes after a few); under XLA every shape was compiled before
    (`compile_ahead`, as train does, its seconds in `compile_ahead_seconds`). The
    others are sustained training: their tokens/s are the ones to compare with the
    fixed batch's.
    """
    import numpy as np

    seen, shapes, new_shapes = {tuple(fixed_shape)}, {}, []
    sustained = {"steps": 0, "seconds": 0.0, "target_tokens": 0, "padded_target_tokens": 0,
                 "flops": 0}
    dataset = batches.dataset(0)
    steps = iter(model.distribute_strategy.experimental_distribute_dataset(dataset))
    iterator = dataset.as_numpy_iterator()  # the same batches again, for their shapes
    model.make_train_function()
    for _ in range(args.real_steps):
        inputs, targets = next(iterator)
        shape = (*inputs["encoder_inputs"].shape, targets.shape[1])  # (B, S, T)
        start = time.perf_counter()
        float(model.train_function(steps)["loss"])  # waits for the step's result
        seconds = time.perf_counter() - start
        key = "x".join(map(str, shape))
        shapes[key] = shapes.get(key, 0) + 1
        if shape not in seen:
            seen.add(shape)
            new_shapes.append({"shape": key, "seconds": round(seconds, 3)})
            continue
        sustained["steps"] += 1
        sustained["seconds"] += seconds
        sustained["target_tokens"] += int(np.count_nonzero(targets))
        sustained["padded_target_tokens"] += int(targets.size)
        sustained["flops"] += 3 * forward_flops(config, *shape)
    report = {
        "steps": args.real_steps,
        "distinct_shapes": len(shapes),
        "shapes": dict(sorted(shapes.items(), key=lambda item: -item[1])),
        "new_shape_steps": len(new_shapes),
        "new_shape_first_steps": new_shapes,
        "new_shape_seconds": round(sum(shape["seconds"] for shape in new_shapes), 2),
        "sustained_steps": sustained["steps"],
    }
    if sustained["steps"]:
        seconds = sustained["seconds"]
        real = sustained["target_tokens"] / seconds
        padded = sustained["padded_target_tokens"] / seconds
        report.update({
            "sustained_seconds_per_step": round(seconds / sustained["steps"], 4),
            "target_tokens_per_second": round(real, 1),
            "padded_target_tokens_per_second": round(padded, 1),
            "padding_fraction": round(
                1 - sustained["target_tokens"] / sustained["padded_target_tokens"], 4),
            "real_over_fixed": round(real / fixed_tokens_per_second, 3),
            "padded_over_fixed": round(padded / fixed_tokens_per_second, 3),
        })
        # MFU of the padded shapes' FLOPs (what the device computed).
        report.update({key: value for key, value in mfu_fields(
            sustained["flops"] / sustained["steps"], seconds / sustained["steps"], peaks).items()
            if key.startswith("mfu")})
    return report


def time_fit(model, batches, args, real_steps_tokens_per_second, precision):
    """`model.fit` on the real batches, as train.py runs it, `--fit-steps` steps an
    epoch: without callbacks, then with train.py's callbacks (`training.run_callbacks`:
    NaN check, checkpoints, the clock, the progress line, TensorBoard, log.csv), then
    (`as_train`) with those callbacks on a twin of the model with its weights, made as
    train makes its model: under train's strategy (`distributed.make_strategy("auto")`:
    `OneDeviceStrategy` on a GPU), compiled by `training.compile_for_training` (train's
    metrics: token accuracy, perplexity, target tokens), its shapes compiled ahead. Each
    timed epoch follows an untimed one over the same steps' shapes (their traces and
    compilations), and is timed from its first step to its last (a callback listed
    first; Keras waits for the device before the epoch ends), its checkpoint and dev
    pass left out. Where this and the real-batch steps (`time_real_batches`) differ,
    the time goes to `fit`'s per-step work: callbacks that read each step's logs
    wait for the device."""
    import contextlib
    import tempfile

    import keras
    import numpy as np

    from keras_transformer import budget
    from keras_transformer import training
    from keras_transformer.config import TrainingConfig

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds = time.perf_counter() - self.start
            self.logs = dict(logs or {})

    steps = args.fit_steps
    start_step = args.real_steps  # past the batches time_real_batches read
    tokens = sum(int(np.count_nonzero(targets)) for _, targets in
                 batches.dataset(start_step + steps).take(steps).as_numpy_iterator())
    report = {"steps": steps, "target_tokens": tokens}
    with tempfile.TemporaryDirectory() as directory:
        config = TrainingConfig(steps=10 * steps, checkpoint_every=steps, keep_checkpoints=1,
                                average_last=1)
        with contextlib.redirect_stdout(sys.stderr):  # the progress line: stdout is the JSON
            run_callbacks = training.run_callbacks(
                os.path.join(directory, "run"), config, budget.TrainingClock())
        for name, callbacks in (("no_callbacks", []), ("train_callbacks", run_callbacks),
                                ("as_train", run_callbacks)):
            if name == "as_train":
                model = train_twin(model, batches, precision)
            timer = EpochTimer()
            model.fit(batches.dataset(start_step), steps_per_epoch=steps, epochs=2,
                      callbacks=[timer, *callbacks], shuffle=False, verbose=0)
            real = tokens / timer.seconds
            report[name] = {"seconds_per_step": round(timer.seconds / steps, 4),
                            "target_tokens_per_second": round(real, 1)}
            if name == "as_train":  # what the twin is
                report[name]["strategy"] = type(model.distribute_strategy).__name__
                report[name]["logs"] = sorted(timer.logs)
            progress(f"fit, {name}: 2 epochs of {steps} steps")
            if real_steps_tokens_per_second:
                report[name]["over_real_steps"] = round(real / real_steps_tokens_per_second, 3)
    return report


def train_twin(model, batches, precision):
    """A model with `model`'s weights, made and compiled as train makes and compiles
    its own, every batch shape compiled ahead under XLA (`time_fit`)."""
    import keras

    import keras_transformer as kt
    from keras_transformer import distributed
    from keras_transformer import training

    strategy = distributed.make_strategy("auto")
    keras.config.set_dtype_policy(precision)
    with strategy.scope():
        twin = kt.build_transformer(model.config)
        twin.set_weights(model.get_weights())
        training.compile_for_training(twin, jit_compile=model.jit_compile)
    keras.config.set_dtype_policy("float32")
    if model.jit_compile:
        start = time.perf_counter()
        training.compile_ahead(twin, [batches.example_batch(s) for s in batches.shapes])
        progress(f"as train: {len(batches.shapes)} shapes compiled in "
                 f"{time.perf_counter() - start:.1f} s")
    return twin


def load_real_batches(corpus, tokens_per_batch, args):
    """`(TrainingBatches, report)`: train.py's batches of CORPUS's train split."""
    from keras_transformer import data
    from keras_transformer.config import TrainingConfig

    from keras_transformer import hardware
    from keras_transformer.cli.common import corpus_source
    from keras_transformer.cli.common import corpus_splits

    start = time.perf_counter()
    pairs = data.load_parallel(corpus_source(corpus), corpus_splits(corpus)["train"])
    tokenizer = data.SubwordTokenizer.train(
        pairs, vocab_size=args.vocab_size, max_sentences=TrainingConfig.vocab_sentences,
        seed=args.seed)
    vocabulary_seconds = time.perf_counter() - start
    start = time.perf_counter()
    # As train.py's --length-buckets 0: few fitted lengths on a GPU, the fine ones on a CPU.
    num_buckets = args.length_buckets
    if num_buckets is None:
        import tensorflow as tf

        gpu = bool(tf.config.list_physical_devices("GPU"))
        num_buckets = hardware.ACCELERATOR_LENGTH_BUCKETS if gpu else 0
    batches = data.TrainingBatches(pairs, tokenizer, tokens_per_batch, args.max_sentence_tokens,
                                   seed=args.seed, num_buckets=num_buckets or None)
    return batches, {
        "corpus": corpus,
        "vocab_size": tokenizer.vocab_size,
        "tokens_per_batch": tokens_per_batch,
        "max_sentence_tokens": args.max_sentence_tokens,
        "pairs": batches.pairs,
        "pairs_too_long": batches.pairs_too_long,
        "batches_per_epoch": batches.batches_per_epoch,
        "shapes": batches.shapes,
        "padding": batches.padding,
        "vocabulary_seconds": round(vocabulary_seconds, 2),
        "tokenize_seconds": round(time.perf_counter() - start, 2),
    }


def compare_torch(config, precisions, args):
    """torch_transformer.py's JSON at our shape, from its own process (the two
    frameworks never share one), or `{"error": ...}`."""
    torch_precisions = [TORCH_PRECISIONS[p] for p in precisions if p in TORCH_PRECISIONS]
    if not torch_precisions:
        return {"error": f"no torch mode matches --precisions {','.join(precisions)}"}
    command = [sys.executable, os.path.join(HERE, "torch_transformer.py"),
               "--model", args.model, "--vocab-size", str(config.vocab_size),
               "--batch-size", str(args.batch_size), "--length", str(args.length),
               "--warmup-steps", str(args.warmup_steps), "--steps", str(args.steps),
               "--precisions", ",".join(torch_precisions), "--compile", args.torch_compile]
    if args.torch_threads:
        command += ["--threads", str(args.torch_threads)]
    if args.profile_steps:
        command += ["--profile-steps", str(args.profile_steps)]
    print("Running " + " ".join(command), file=sys.stderr, flush=True)
    try:
        finished = subprocess.run(command, capture_output=True, text=True,
                                  timeout=args.torch_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"torch_transformer.py ran over --torch-timeout {args.torch_timeout} s",
                "command": command}
    if finished.returncode:
        return {"error": finished.stderr[-3000:], "returncode": finished.returncode,
                "command": command}
    return json.loads(finished.stdout)


def torch_match(result, torch_report):
    """The torch run our `result` compares with: same precision, torch.compile
    where it ran, else eager; None if there is none."""
    precision = TORCH_PRECISIONS.get(result["precision"])
    candidates = [run for run in torch_report.get("results", ())
                  if run["precision"] == precision and run.get("status") == "ok"]
    candidates.sort(key=lambda run: not run["compile"])  # compiled first
    return candidates[0] if candidates else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="base", help="TransformerConfig preset")
    parser.add_argument("--vocab-size", type=int, default=37000,
                        help="the random batch's vocabulary; with --real-batches, the size "
                             "asked of the learned vocabulary")
    parser.add_argument("--batch-size", type=int, default=None, help="rows (default 64)")
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--tokens-per-batch", type=int, default=None,
                        help="instead of --batch-size: tokens // length rows (e.g. 25000 "
                             "with --length 100: 250 rows); with --real-batches also their "
                             "token budget (default: batch size x length)")
    parser.add_argument("--precisions", default="float32")
    parser.add_argument("--xla", default="off", help="off, on, or off,on")
    parser.add_argument("--implementations", default="ours", help="comma-separated: ours, keras_hub")
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5,
                        help="measured steps per implementation (the median is reported)")
    parser.add_argument("--real-batches", metavar="CORPUS", default=None,
                        help="also time our model on train.py's batches of CORPUS (a train.py "
                             "--data value, e.g. bundled)")
    parser.add_argument("--real-steps", type=int, default=100,
                        help="steps on real batches (new shapes' first steps included)")
    parser.add_argument("--fit-steps", type=int, default=0,
                        help="with --real-batches: also time model.fit over this many real "
                             "batches an epoch, without callbacks and with train.py's")
    parser.add_argument("--length-buckets", type=int, default=None,
                        help="with --real-batches: as train.py's (default: 8 lengths fitted "
                             "to the corpus on a GPU, the fine buckets on a CPU)")
    parser.add_argument("--max-sentence-tokens", type=int, default=128,
                        help="with --real-batches: the longest pair kept (train.py's default)")
    parser.add_argument("--seed", type=int, default=0, help="with --real-batches: the "
                        "vocabulary's and the batches' seed")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="then this many steps of ours (and of torch's with "
                             "--compare-torch) under the profiler: where the GPU's time "
                             "goes, summed by benchmarks/kernel_profile.py (`profile`)")
    parser.add_argument("--profile-dir", default=None,
                        help="where TensorFlow's profiler writes its trace (default a new "
                             "temporary folder, named in the result's `xplane`); the "
                             "`.xplane.pb` in it reads with benchmarks/kernel_profile.py")
    parser.add_argument("--compare-torch", action="store_true",
                        help="also run benchmarks/torch_transformer.py at the same shape")
    parser.add_argument("--torch-compile", default="off,on",
                        help="with --compare-torch: torch.compile off, on, or off,on")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="with --compare-torch: torch_transformer.py --threads")
    parser.add_argument("--torch-timeout", type=int, default=3600,
                        help="with --compare-torch: seconds before the torch run is given up")
    args = parser.parse_args()
    if args.tokens_per_batch is not None:
        if args.batch_size is not None:
            parser.error("give --batch-size or --tokens-per-batch, not both")
        if args.tokens_per_batch < args.length:
            parser.error("--tokens-per-batch must be at least --length")
        args.batch_size = args.tokens_per_batch // args.length
    elif args.batch_size is None:
        args.batch_size = 64

    import keras_transformer as kt

    real, real_report = None, None
    if args.real_batches:
        real, real_report = load_real_batches(
            args.real_batches, args.tokens_per_batch or args.batch_size * args.length, args)
        print(json.dumps({"real_batches": real_report}), file=sys.stderr, flush=True)
    vocab_size = real_report["vocab_size"] if real_report else args.vocab_size
    config = kt.TransformerConfig.preset(args.model, vocab_size=vocab_size)
    device = tensorflow_device()
    peaks = {}
    results = []
    precisions = args.precisions.split(",")
    for precision in precisions:
        compute = "bfloat16" if "bfloat16" in precision else (
            "float16" if "float16" in precision else "float32")
        for xla in args.xla.split(","):
            # XLA:CPU and oneDNN run bfloat16 matrix multiplies at different speeds.
            path = f"{compute}/{'xla' if xla == 'on' else 'graph'}"
            if path not in peaks:
                peaks[path] = tensorflow_peaks(device, compute, jit_compile=xla == "on")
                progress(f"the {compute} matmul peak measured ({path})")
            for result in measure(args.implementations.split(","), config, precision,
                                  xla == "on", args, peaks[path], real):
                results.append(result)
                print(json.dumps(result), file=sys.stderr, flush=True)  # progress

    def speedup(result, **other):
        """result's tokens/s over those of the run that differs from it in `other`."""
        keys = ("implementation", "precision", "xla")
        for candidate in results:
            if all(candidate[k] == other.get(k, result[k]) for k in keys):
                return round(result["target_tokens_per_second"]
                             / candidate["target_tokens_per_second"], 3)
        return None

    torch_report = compare_torch(config, precisions, args) if args.compare_torch else None
    for result in results:
        if result["implementation"] == "ours":
            ratios = {"speedup_over_keras_hub": speedup(result, implementation="keras_hub")}
            if result["precision"] != "float32":
                ratios["speedup_over_float32"] = speedup(result, precision="float32")
            match = torch_match(result, torch_report) if torch_report else None
            if match:
                ratios["speedup_over_torch"] = round(
                    result["target_tokens_per_second"] / match["target_tokens_per_second"], 3)
                ratios["torch_compared"] = match["mode"]
            result.update({k: v for k, v in ratios.items() if v is not None})
    report = {
        "benchmark": "train_throughput",
        "model": args.model,
        "vocab_size": vocab_size,
        "batch_size": args.batch_size,
        "length": args.length,
        "tokens_per_batch": args.batch_size * args.length,
        "device": device,
        "machine": cpu_flags(),
        "tf_cpu_allocator_use_bfc": os.environ["TF_CPU_ALLOCATOR_USE_BFC"],
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "peaks": {path: {kind: peak and {"flops": round(peak["flops"]), "source": peak["source"]}
                         for kind, peak in sources.items()} for path, sources in peaks.items()},
        "matmul_peak_flops": {path: round(sources["measured"]["flops"])
                              for path, sources in peaks.items()},
    }
    if device["type"] == "GPU":
        import tensorflow as tf

        report["gpu_peak_memory_gib"] = round(
            tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**30, 2)
    if real_report:
        report["real_batches"] = real_report
    report["results"] = results
    if torch_report is not None:
        report["torch"] = torch_report
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
