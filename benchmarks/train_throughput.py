"""Training throughput of the Transformer: seconds per step, target tokens per
second and model FLOPs utilization, printed as JSON.

    python benchmarks/train_throughput.py                          # base, float32, no XLA
    python benchmarks/train_throughput.py --implementations ours,keras_hub \
        --precisions float32,mixed_bfloat16 --xla off,on       # the whole matrix
    python benchmarks/train_throughput.py --model tiny --steps 5   # a quick smoke run

A fixed batch of `--batch-size` x `--length` tokens (64 x 64 = 4096 by default) for
source and target, random ids from the vocabulary (37000 by default), the paper's
optimizer and label-smoothed loss. The first `--warmup-steps` steps (graph build,
XLA compilation) are timed apart from the measured steps, which alternate between the
implementations so that a shared machine's load falls on all alike. MFU is the analytic FLOPs of
a training step (3x the forward matmul FLOPs) over the step time, against the
matrix-multiply peak measured on this machine in the same run (for each compute
dtype, with XLA or without as the step ran). Our runs carry `speedup_over_keras_hub`
(the same-size model from keras-hub's layers, same precision and XLA setting) and, for
mixed precision,
`speedup_over_float32`.
"""

import argparse
import json
import os
import resource
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# As train.py: TensorFlow's BFC allocator keeps freed CPU buffers for the next step
# (set TF_CPU_ALLOCATOR_USE_BFC=false to measure without it).
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

from machine import cpu_flags  # noqa: E402
from machine import matmul_peak  # noqa: E402


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


def measure(implementations, config, precision, jit_compile, args):
    """Results for each implementation at one precision and XLA setting.

    The models are built and warmed up one after the other, then their measured
    steps alternate (A, B, A, B, ...), so that a shared machine's changing load
    falls on all of them alike and their ratio stays fair.
    """
    import keras
    import numpy as np

    import keras_transformer as kt

    rng = np.random.RandomState(0)
    shape = (args.batch_size, args.length)
    inputs = {"encoder_inputs": rng.randint(4, config.vocab_size, shape).astype("int32"),
              "decoder_inputs": rng.randint(4, config.vocab_size, shape).astype("int32")}
    targets = rng.randint(4, config.vocab_size, shape).astype("int32")
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
    keras.config.set_dtype_policy("float32")
    times = {implementation: [] for implementation in implementations}
    for _ in range(args.steps):
        for implementation, model in models.items():
            start = time.perf_counter()
            model.train_on_batch(inputs, targets)
            times[implementation].append(time.perf_counter() - start)
    results = []
    for implementation, model in models.items():
        seconds = float(np.median(times[implementation]))
        results.append({
            "implementation": implementation,
            "precision": precision,
            "xla": jit_compile,
            "parameters": model.count_params(),
            "first_steps_seconds": round(warmup_seconds[implementation], 2),
            "seconds_per_step": round(seconds, 4),
            "step_seconds": [round(t, 3) for t in times[implementation]],
            "target_tokens_per_second": round(args.batch_size * args.length / seconds, 1),
            "train_flops_per_step": 3 * forward_flops(config, args.batch_size, args.length,
                                                      args.length),
        })
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="base", help="TransformerConfig preset")
    parser.add_argument("--vocab-size", type=int, default=37000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--precisions", default="float32")
    parser.add_argument("--xla", default="off", help="off, on, or off,on")
    parser.add_argument("--implementations", default="ours", help="comma-separated: ours, keras_hub")
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5,
                        help="measured steps per implementation (the median is reported)")
    args = parser.parse_args()

    import keras_transformer as kt

    config = kt.TransformerConfig.preset(args.model, vocab_size=args.vocab_size)
    peaks = {}
    results = []
    for precision in args.precisions.split(","):
        compute = "bfloat16" if "bfloat16" in precision else (
            "float16" if "float16" in precision else "float32")
        for xla in args.xla.split(","):
            # XLA:CPU and oneDNN run bfloat16 matrix multiplies at different speeds.
            path = f"{compute}/{'xla' if xla == 'on' else 'graph'}"
            if path not in peaks:
                peaks[path] = matmul_peak(compute, jit_compile=xla == "on")
            for result in measure(args.implementations.split(","), config, precision,
                                  xla == "on", args):
                result["mfu"] = round(
                    result["train_flops_per_step"] / result["seconds_per_step"] / peaks[path], 4)
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

    for result in results:
        if result["implementation"] == "ours":
            ratios = {"speedup_over_keras_hub": speedup(result, implementation="keras_hub")}
            if result["precision"] != "float32":
                ratios["speedup_over_float32"] = speedup(result, precision="float32")
            result.update({k: v for k, v in ratios.items() if v is not None})
    print(json.dumps({
        "benchmark": "train_throughput",
        "model": args.model,
        "vocab_size": args.vocab_size,
        "tokens_per_batch": args.batch_size * args.length,
        "machine": cpu_flags(),
        "tf_cpu_allocator_use_bfc": os.environ["TF_CPU_ALLOCATOR_USE_BFC"],
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "matmul_peak_flops": {k: round(v) for k, v in peaks.items()},
        "results": results,
    }, indent=2))


if __name__ == "__main__":
    main()
