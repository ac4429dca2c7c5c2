"""What int8 weights would buy a decoding step on this CPU, with the quantized
matrix multiply that stock TensorFlow runs, printed as one JSON object.

CTranslate2's int8 decodes faster than its float32 on every CPU we measured, and on
CPUs without fast bfloat16 it beats our best (float32) export. This benchmark times
the products of one decoder step of the base model, float32 (`tf.matmul`) against
the two int8 products stock TensorFlow (and so TF Serving) runs: `onednn_int8`,
`tf.raw_ops.QuantizedMatMulWithBiasAndDequantize` (oneDNN's kernel), with the
activations shifted by 128 into uint8 and the shift's product taken back through
the bias; and `xla_int8`, an int8 `tf.linalg.matmul` into int32 under XLA. Weights
are quantized once, per tensor; activations on each call, per tensor and symmetric,
timed with the product. The environment is the decoding commands' for searches side
by side (`cli.common.start_decoding`): one intra-op thread, oneDNN on, weights frozen.

Held to AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2`, the AVX2-only CPU's stand-in), float32 and
`onednn_int8` run oneDNN's AVX2 kernels, as on that CPU; `xla_int8` does not: XLA
runs its int8 dot with YNNPACK, which picks its kernel for the CPU it finds
(`ynn::dot_int8_int8_int32_..._avx512bw` on an AVX-512 CPU, under that limit and under
`XLA_FLAGS=--xla_cpu_max_isa=AVX2` alike, 2026-11-27), so its figure there is the
AVX-512 CPU's. bfloat16 is left out where oneDNN may not use bfloat16 instructions.

    python benchmarks/int8_matmul.py                 # base model, 64 rows (32 x beam 4 / 2 searches)
    python benchmarks/int8_matmul.py --rows 128

The report gives each product's seconds and relative error against float32, and
`step_speedup_<variant>`: the decoder step's products (`--layers` blocks and
the output layer), float32 time over int8 time. That bounds what int8 weights could gain a
search whose step is all products; `decode_throughput.py --compare-ctranslate2`
gives the speedup CTranslate2's int8 has over our float32.
"""

import argparse
import json
import sys
import time

from machine import VERBOSE_HELP
from machine import set_decoding_environment

# As a search side by side runs: oneDNN on, weights reordered once, one intra-op thread.
ENVIRONMENT = set_decoding_environment(parallel_searches=2)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer.hardware import has_bfloat16_instructions  # noqa: E402
from machine import cpu_flags  # noqa: E402


# The int8 products timed: oneDNN's quantized kernel, and XLA's int8 dot.
# bfloat16 (oneDNN's, as a bfloat16 export multiplies) is timed too where the CPU
# has bfloat16 instructions (hardware.has_bfloat16_instructions): there it is the
# product int8 must beat.
VARIANTS = ("onednn_int8", "xla_int8", "bfloat16")


def variants(flags):
    """The variants timed on a CPU of `flags` (`cpu_flags()`): bfloat16 only where
    oneDNN may use bfloat16 instructions. Held below them (`ONEDNN_MAX_CPU_ISA=AVX2`,
    the AVX2 stand-in) TensorFlow still hands oneDNN a bfloat16 product, which it
    refuses by aborting the process."""
    return VARIANTS if has_bfloat16_instructions(flags) else VARIANTS[:2]


def decoder_step_products(d_model, d_ff, vocab_size, layers):
    """`[(name, inputs, outputs, count)]`: the weight products of one decoder step
    (the encoder's keys and values are computed once per search, not per step)."""
    return [
        ("self_attention_qkv", d_model, 3 * d_model, layers),
        ("attention_output", d_model, d_model, 2 * layers),  # self and cross
        ("cross_attention_query", d_model, d_model, layers),
        ("feed_forward_in", d_model, d_ff, layers),
        ("feed_forward_out", d_ff, d_model, layers),
        ("output_layer", d_model, vocab_size, 1),
    ]


def quantized_product(weights):
    """`{variant: function}` for "float32" and each of `VARIANTS`: functions
    multiplying `[rows, inputs]` by `weights`, the int8 ones through int8 weights
    and activations, bfloat16's with activations cast on each call. Each adds
    a bias, as a search's products do (the layers' own, and the output layer's
    zeros, `serving.Translator.output_bias`): oneDNN then runs its fused kernel,
    which keeps a packed kernel across calls, where a plain product packs it
    again on every call (a 512 x 37000 bfloat16 product: 8.2 ms plain, 5.9 ms
    with a bias, on a Zen 5 core)."""
    weights_scale = float(np.abs(weights).max()) / 127.0
    integers = np.clip(np.round(weights / weights_scale), -127, 127).astype(np.int32)
    kernel = tf.constant(weights)
    kernel_int8 = tf.cast(tf.constant(integers), tf.qint8)
    column_sums = tf.constant(integers.sum(axis=0).astype(np.float32))
    weights_max = 127.0 * weights_scale

    bias = tf.Variable(tf.zeros([weights.shape[1]]))  # a variable: a constant is folded away

    @tf.function
    def float32(x):
        return tf.matmul(x, kernel) + bias

    @tf.function
    def onednn_int8(x):
        scale = tf.maximum(tf.reduce_max(tf.abs(x)), 1e-12) / 127.0
        shifted = tf.bitcast(tf.cast(tf.round(x / scale) + 128.0, tf.uint8), tf.quint8)
        # (x/s + 128) W = x W / s + 128 colsum(W): the bias takes the shift back.
        bias = column_sums * (-128.0 * scale * weights_scale)
        return tf.raw_ops.QuantizedMatMulWithBiasAndDequantize(
            a=shifted, b=kernel_int8, bias=bias, min_a=0.0, max_a=255.0 * scale,
            min_b=-weights_max, max_b=weights_max, min_freezed_output=-1.0,
            max_freezed_output=1.0, Toutput=tf.float32, input_quant_mode="SCALED")

    kernel_xla = tf.constant(integers.astype(np.int8))

    @tf.function(jit_compile=True)
    def xla_int8(x):
        scale = tf.maximum(tf.reduce_max(tf.abs(x)), 1e-12) / 127.0
        product = tf.linalg.matmul(tf.cast(tf.round(x / scale), tf.int8), kernel_xla,
                                   output_type=tf.int32)
        return tf.cast(product, tf.float32) * (scale * weights_scale)

    kernel_bfloat16 = tf.cast(kernel, tf.bfloat16)
    bias_bfloat16 = tf.Variable(tf.zeros([weights.shape[1]], tf.bfloat16))

    @tf.function
    def bfloat16(x):
        return tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), kernel_bfloat16) + bias_bfloat16,
                       tf.float32)

    return {"float32": float32, "onednn_int8": onednn_int8, "xla_int8": xla_int8,
            "bfloat16": bfloat16}


def seconds_per_call(fn, x, repeats, min_seconds):
    """The best of `repeats` timings of calling `fn(x)` over at least `min_seconds`."""
    fn(x)
    best = float("inf")
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn(x)
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        best = min(best, elapsed / calls)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=64,
                        help="rows of a step's products: sentences x beam / searches side by side")
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--d-ff", type=int, default=2048)
    parser.add_argument("--vocab-size", type=int, default=37000)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=0.3,
                        help="each timing calls a product for at least this long")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    flags = cpu_flags()
    timed = variants(flags)
    products, totals = [], dict.fromkeys(("float32",) + timed, 0.0)
    for name, inputs, outputs, count in decoder_step_products(
            args.d_model, args.d_ff, args.vocab_size, args.layers):
        weights = (rng.standard_normal((inputs, outputs)) / np.sqrt(inputs)).astype(np.float32)
        x = tf.constant(rng.standard_normal((args.rows, inputs)).astype(np.float32))
        functions = {variant: function for variant, function in quantized_product(weights).items()
                     if variant in totals}
        exact = functions["float32"](x)
        seconds = {variant: seconds_per_call(fn, x, args.repeats, args.min_seconds)
                   for variant, fn in functions.items()}
        product = {"name": name, "shape": [args.rows, inputs, outputs], "per_step": count,
                   "float32_seconds": round(seconds["float32"], 7)}
        for variant in timed:
            approximate = functions[variant](x)
            totals[variant] += count * seconds[variant]
            product[variant] = {
                "seconds": round(seconds[variant], 7),
                "speedup": round(seconds["float32"] / seconds[variant], 3),
                "relative_error": round(float(tf.norm(approximate - exact) / tf.norm(exact)), 4),
            }
        totals["float32"] += count * seconds["float32"]
        products.append(product)
        print(f"int8_matmul: {name} {args.rows}x{inputs}x{outputs}: " + ", ".join(
            f"{variant} {product[variant]['speedup']:.2f}x" for variant in timed),
            file=sys.stderr, flush=True)
    report = {
        "benchmark": "int8_matmul",
        "settings": {key: getattr(args, key) for key in
                     ("rows", "d_model", "d_ff", "vocab_size", "layers", "repeats")},
        "machine": {**flags, "tensorflow": tf.__version__, **ENVIRONMENT},
        "products": products,
        "step_seconds": {variant: round(total, 6) for variant, total in totals.items()},
        **{f"step_speedup_{variant}": round(totals["float32"] / totals[variant], 3)
           for variant in timed},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
