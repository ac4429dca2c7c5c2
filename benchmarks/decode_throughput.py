"""Beam-search decoding throughput through the exported SavedModel; prints JSON.

    python benchmarks/decode_throughput.py            # base config, vocab 37000: minutes
    python benchmarks/decode_throughput.py --quick    # tiny config: under a minute

The model has random weights (base config, vocabulary 37000 by default). It is
exported ids-only (`translate_ids`, no tokenizer, so the vocabulary size is
free) three ways: graph mode with the key/value cache, XLA with the cache, and
graph mode without the self-attention cache (every step re-runs the decoder on
the full prefix); `--precisions float32,bfloat16` adds each variant exported
in bfloat16 (`export --precision`; "graph-bfloat16", ...). Each export is
reloaded with `tf.saved_model.load` and timed on one batch of `--batch-size`
sources of `--source-length` random tokens, beam `--beam-size`. With `--forced-steps N` (default 48) the end-of-sequence token
is ignored and every search runs exactly N steps (extra_length = N - source
length), so runs with random weights are comparable; `--forced-steps 0` uses
the paper's settings (input length + 50, early stop).

Reported per variant: seconds per batch (median of `--repeats` timed calls,
after one untimed call that pays for tracing or XLA compilation; the variants'
and CTranslate2's timed calls take turns, so that a shared machine's changing
load falls on all alike), sentences/s,
generated tokens/s (tokens of the best hypotheses) and the first call's
seconds. `cached_speedup` is uncached seconds over cached (graph) seconds.
`profile` times the pieces of one decoding step in-process: the encoder and
cross-attention projections (once per batch), one cached decoder step with its
output projection, the output projection alone, and the selection of the
beam's candidates (block-wise, as the search runs it, and as `top_k` over the
whole table); `flops_per_step` and `achieved_gflops` set the step against the
machine's arithmetic. `mfu` is each variant's model FLOPs utilization: the
matrix-multiply FLOPs a cached search needs (`decode_flops`) over its seconds,
against the square-matmul peak of its dtype measured in the same run, with XLA
for the XLA variants and TensorFlow's own kernels for the others (the uncached variant does
more arithmetic than it is credited with).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import VERBOSE_HELP  # noqa: E402 (imports no TensorFlow)
from machine import require  # noqa: E402
from machine import set_decoding_environment  # noqa: E402


def _parallel_searches(argv):
    """--parallel-searches, read before TensorFlow starts (it sets the threads);
    by default the exports' own on a CPU (`hardware.cpu_parallel_searches`)."""
    from keras_transformer.hardware import cpu_parallel_searches

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--parallel-searches", type=int, default=cpu_parallel_searches())
    return max(1, parser.parse_known_args(argv)[0].parallel_searches)


PARALLEL_SEARCHES = _parallel_searches(sys.argv[1:])
DECODING_ENVIRONMENT = set_decoding_environment(PARALLEL_SEARCHES)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer import TransformerConfig  # noqa: E402
from keras_transformer import build_transformer  # noqa: E402
from keras_transformer import beam_candidates  # noqa: E402
from keras_transformer import hardware  # noqa: E402
from keras_transformer import saved_model  # noqa: E402
from keras_transformer import serving  # noqa: E402
from keras_transformer.data import BOS_ID  # noqa: E402
from keras_transformer.decoding_config import PAPER_ALPHA  # noqa: E402
from keras_transformer.decoding_config import PAPER_EXTRA_LENGTH  # noqa: E402
from machine import cpu_flags  # noqa: E402
from machine import matmul_peak  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="base", help="TransformerConfig preset")
    parser.add_argument("--vocab-size", type=int, default=37000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--source-length", type=int, default=24)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--forced-steps", type=int, default=48,
                        help="decode exactly this many steps, EOS ignored; 0 for the "
                             "paper's settings (input length + 50, early stop)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per variant")
    parser.add_argument("--uncached-repeats", type=int, default=1,
                        help="timed calls of the (slow) uncached variant")
    parser.add_argument("--variants", default="graph,xla,uncached",
                        help="comma-separated subset of graph, xla, uncached")
    parser.add_argument("--precisions", default="float32",
                        help="comma-separated export precisions: float32, bfloat16, float16 "
                             "(export --precision); each but float32 adds variants named "
                             "VARIANT-PRECISION, e.g. graph-bfloat16")
    parser.add_argument("--parallel-searches", type=int, default=PARALLEL_SEARCHES,
                        help="the graph exports' searches side by side "
                             "(export --parallel-searches; default: one per core); with more "
                             "than 1 the process runs one intra-op thread, as the decoding "
                             "commands do for such an export, every variant included")
    parser.add_argument("--no-profile", action="store_true", help="skip the step profile")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    parser.add_argument("--compare-ctranslate2", action="store_true",
                        help="also time the same weights in CTranslate2 (float32 and int8), "
                             "same sources, beam and steps")
    parser.add_argument("--quick", action="store_true",
                        help="tiny config, vocabulary 8000, batch 8: a smoke check")
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.vocab_size, args.batch_size = "tiny", 8000, 8
        args.repeats = min(args.repeats, 2)
    if args.forced_steps and args.forced_steps < args.source_length:
        parser.error("--forced-steps must be 0 or at least --source-length")
    if args.compare_ctranslate2:
        require(parser, "ctranslate2", "benchmarks", "leave out --compare-ctranslate2")
    return args


def build_model(args):
    keras.utils.set_random_seed(0)
    config = TransformerConfig.preset(
        args.preset, args.vocab_size, max_positions=max(256, args.source_length + 64)
    )
    return build_transformer(config)


def translator_for(model, args, variant):
    forced = args.forced_steps > 0
    return serving.Translator(
        model,
        None,  # ids only: the benchmark needs no vocabulary
        beam_size=args.beam_size,
        beam_sizes=(args.beam_size,),
        extra_length=args.forced_steps - args.source_length if forced else PAPER_EXTRA_LENGTH,
        max_input_length=args.source_length,
        max_output_length=(args.forced_steps if forced
                           else args.source_length + PAPER_EXTRA_LENGTH),
        jit_compile=variant == "xla",
        use_cache=variant != "uncached",
        ignore_eos=forced,
        parallel_searches=None if variant == "xla" else args.parallel_searches,
    )


class Engine:
    """One way of translating the batch, to time: `call()` translates it, and
    `tokens_and_length(outputs)` reads (generated tokens, longest output) from
    what it returns; `repeats` timed calls."""

    def __init__(self, call, tokens_and_length, repeats):
        self.call, self.tokens_and_length, self.repeats = call, tokens_and_length, repeats


def time_in_turns(engines, batch_size):
    """Reports of `engines` (a dict of `Engine`s): each is called once untimed (its
    tracing or loading), then their timed calls take turns (A, B, C, A, B, C, ...),
    so that a shared machine's changing load falls on all of them alike and their
    ratios hold within a run."""
    first, outputs, seconds = {}, {}, {name: [] for name in engines}
    for name, engine in engines.items():
        start = time.perf_counter()
        outputs[name] = engine.call()
        first[name] = time.perf_counter() - start
    for turn in range(max(engine.repeats for engine in engines.values())):
        for name, engine in engines.items():
            if turn < engine.repeats:
                start = time.perf_counter()
                outputs[name] = engine.call()
                seconds[name].append(time.perf_counter() - start)
    return {name: timing_report(seconds[name], first[name], batch_size,
                                *engine.tokens_and_length(outputs[name]))
            for name, engine in engines.items()}


def timing_report(seconds, first_call, batch_size, tokens, length):
    median = statistics.median(seconds)
    return {
        "seconds_per_batch": round(median, 3),
        "all_seconds": [round(s, 3) for s in seconds],
        "sentences_per_second": round(batch_size / median, 3),
        "generated_tokens_per_second": round(tokens / median, 1),
        "generated_tokens": tokens,
        "output_length": int(length),
        "first_call_seconds": round(first_call, 2),
    }


def ctranslate2_engines(model, args, source_ids, directory, quantization):
    """CTranslate2 on the same weights: sources as pieces of a made-up vocabulary
    (ids are all it sees), exactly `forced_steps` steps (min = max decoding length).
    An `Engine` for each of its thread layouts on this process's cores, as ours
    runs in either: one translation over all cores (inter_threads 1), and one per
    core (intra_threads 1) over shares of the batch (`ctranslate2_result` keeps
    the faster)."""
    import ctranslate2

    from keras_transformer import ctranslate2_model
    from keras_transformer.hardware import available_cores

    pieces = ["<pad>", "<unk>", "<s>", "</s>"] + [
        f"t{i}" for i in range(4, model.config.vocab_size)]
    path = os.path.join(directory, f"ct2-{quantization}")
    ctranslate2_model.write_model(model, pieces, path, quantization)
    sources = [[pieces[i] for i in row] for row in source_ids.numpy().tolist()]
    steps = args.forced_steps or args.source_length + PAPER_EXTRA_LENGTH
    cores = available_cores()
    layouts = {"inter_threads 1": (1, cores, args.batch_size)}
    if cores > 1:
        layouts["intra_threads 1"] = (cores, 1, -(-args.batch_size // cores))
    engines = {}
    for name, (inter, intra, batch) in layouts.items():
        translator = ctranslate2.Translator(path, device="cpu", inter_threads=inter,
                                            intra_threads=intra)
        options = dict(beam_size=args.beam_size, max_decoding_length=steps,
                       min_decoding_length=steps if args.forced_steps else 0,
                       max_batch_size=batch)
        engines[f"ctranslate2_{quantization} {name}"] = Engine(
            lambda translator=translator, options=options: translator.translate_batch(
                sources, **options),
            lambda results: (sum(len(result.hypotheses[0]) for result in results),
                             max(len(result.hypotheses[0]) for result in results)),
            args.repeats)
    return engines


def ctranslate2_result(reports, quantization):
    """The faster layout's report of CTranslate2 `quantization`, from
    `time_in_turns`' reports of `ctranslate2_engines`."""
    import ctranslate2

    prefix = f"ctranslate2_{quantization} "
    reports = {name[len(prefix):]: report for name, report in reports.items()
               if name.startswith(prefix)}
    fastest = min(reports, key=lambda name: reports[name]["seconds_per_batch"])
    return {**reports[fastest], "layout": fastest,
            "layouts": {name: report["seconds_per_batch"] for name, report in reports.items()},
            "ctranslate2": ctranslate2.__version__}


def decode_flops(config, batch_size, source_length, beam_size, steps):
    """Matrix-multiply FLOPs (2 per multiply-add) of one cached beam search that
    runs `steps` steps: the encoder and the cross-attention keys and values once
    per source, then per step and hypothesis, each decoder layer's projections,
    feed-forward network and attention over the cache and the source, and the
    output projection."""
    d, d_ff, layers = config.d_model, config.d_ff, config.num_layers
    source_tokens = batch_size * source_length
    encoder = source_tokens * layers * (4 * d * d + 2 * d * d_ff + 2 * source_length * d)
    cross_keys_values = source_tokens * layers * 2 * d * d
    rows = batch_size * beam_size
    per_step = rows * (layers * (6 * d * d + 2 * d * d_ff + 2 * d * (steps + source_length))
                       + d * config.vocab_size)
    return 2 * (encoder + cross_keys_values + steps * per_step)


def export_engine(model, args, variant, source_ids, directory):
    """`(Engine, export seconds)` of an export; `variant` is graph, xla or
    uncached, with `-PRECISION` for a reduced export."""
    variant, _, precision = variant.partition("-")
    if precision:
        model = model.with_dtype(precision)
    translator = translator_for(model, args, variant)
    start = time.perf_counter()
    path = saved_model.export_translator(
        translator, os.path.join(directory, f"{variant}-{model.precision}"), warmup_texts=(),
        check=False
    )
    export_seconds = time.perf_counter() - start
    loaded = tf.saved_model.load(path)
    translate = loaded.signatures["translate_ids"]
    inputs = dict(
        ids=source_ids,
        beam_size=tf.constant(args.beam_size),
        alpha=tf.constant(PAPER_ALPHA),
        extra_length=tf.constant(translator.config.extra_length),
        no_repeat_ngram_size=tf.constant(0),
    )
    repeats = args.uncached_repeats if variant == "uncached" else args.repeats
    engine = Engine(lambda: {name: value.numpy() for name, value in translate(**inputs).items()},
                    lambda outputs: (int(np.sum(outputs["ids"] != 0)), outputs["ids"].shape[1]),
                    repeats)
    return engine, export_seconds


def profile_step(model, args, source_ids):
    """Times the pieces of one decoding step, in-process, graph mode."""
    rows = args.batch_size * args.beam_size
    steps = args.forced_steps or args.source_length + PAPER_EXTRA_LENGTH
    config = model.config
    @tf.function(autograph=False)
    def encode():  # once per batch: the K hypotheses of a source share its cache
        return model.initial_cache(source_ids, max_output_length=steps,
                                   beam_size=args.beam_size)

    cache = encode()
    step = tf.constant(steps // 2)

    # As the search does: the embedding transposed once, the layout the logits' matmul reads fastest.
    output_kernel = tf.transpose(model.embedding.embeddings)

    # As the search's steps: the decoder's kernels transposed, here once for all calls.
    step_fn = model.step_function(output_kernel=output_kernel,
                                  transposed_kernels=hardware.decoding_transposed_kernels())
    ids = tf.fill([rows, steps + 1], BOS_ID)

    @tf.function(autograph=False)
    def decode_step(cache):
        return step_fn(ids, step, cache)[0]

    # (rows, d): the search's logits are a 2-D MatMul (Keras folds (B, 1, d) into it);
    # a (B, 1, d) BatchMatMul would time oneDNN's batched kernel, 5x slower here.
    hidden = tf.random.normal([rows, config.d_model])

    @tf.function(autograph=False)
    def output_projection():
        return tf.matmul(hidden, output_kernel)

    @tf.function(autograph=False)
    def output_projection_from_the_table():  # (V, d), as training computes the logits
        return model.embedding(hidden, reverse=True)

    logits = tf.random.normal([rows, config.vocab_size])
    alive_log_probs = -tf.random.uniform([args.batch_size, args.beam_size])
    candidates = 2 * args.beam_size

    @tf.function(autograph=False)
    def selection():  # as the search selects its candidates
        return beam_candidates.best_extensions(logits, alive_log_probs, candidates,
                                         beam_candidates.block_size(config.vocab_size, candidates))

    @tf.function(autograph=False)
    def full_table_top_k():  # the same, as top_k over the whole (B, K * V) table
        return beam_candidates.best_extensions(logits, alive_log_probs, candidates, None)

    def median_seconds(fn, *fn_args, repeats=5):
        fn(*fn_args)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            tf.nest.map_structure(lambda t: t.numpy(), fn(*fn_args))
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    encoder = median_seconds(encode)
    step_seconds = median_seconds(decode_step, cache)
    projection = median_seconds(output_projection)
    table_projection = median_seconds(output_projection_from_the_table)
    selection_seconds = median_seconds(selection)
    full_table_seconds = median_seconds(full_table_top_k)
    # Multiply-adds of one cached step per row: per decoder layer, the
    # self-attention projections (4 d^2), the cross-attention query and output
    # projections (2 d^2), the feed-forward network (2 d d_ff), attention over
    # the cache and the source; then the output projection (d V).
    d, layers = config.d_model, config.num_layers
    per_layer = 4 * d * d + 2 * d * d + 2 * d * config.d_ff + 2 * d * (steps + args.source_length)
    flops = 2 * rows * (layers * per_layer + d * config.vocab_size)
    return {
        "rows_per_step": rows,
        "encoder_and_cross_projections_seconds": round(encoder, 4),
        "decode_step_seconds": round(step_seconds, 4),
        "output_projection_seconds": round(projection, 4),
        "output_projection_from_the_table_seconds": round(table_projection, 4),
        "selection_seconds": round(selection_seconds, 4),
        "full_table_top_k_seconds": round(full_table_seconds, 4),
        "output_projection_share_of_step": round(projection / step_seconds, 3),
        "flops_per_step": flops,
        "achieved_gflops_in_step": round(flops / step_seconds / 1e9, 1),
        "estimated_seconds_per_batch": round(
            encoder + steps * (step_seconds + selection_seconds), 2),
    }


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    load_before = os.getloadavg()[0]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    variants += [f"{v}-{p}" for p in precisions if p != "float32" for v in variants]
    if "float32" not in precisions:
        variants = [v for v in variants if "-" in v]
    # Each variant's MFU is against the matrix-multiply peak of its dtype and path.
    peaks = {}
    for variant in variants:
        path, _, dtype = variant.partition("-")
        key = f"{'xla' if path == 'xla' else 'graph'}-{dtype or 'float32'}"
        if key not in peaks:
            peaks[key] = matmul_peak(dtype or "float32", jit_compile=path == "xla",
                                     side_by_side=PARALLEL_SEARCHES)
    model = build_model(args)
    rng = np.random.default_rng(0)
    source_ids = tf.constant(
        rng.integers(4, args.vocab_size, (args.batch_size, args.source_length)), tf.int32
    )
    result = {
        "config": {
            "preset": args.preset,
            "vocab_size": args.vocab_size,
            "parameters": model.count_params(),
            "batch_size": args.batch_size,
            "source_length": args.source_length,
            "beam_size": args.beam_size,
            "forced_steps": args.forced_steps,
            "precisions": precisions,
            "path": "exported SavedModel, translate_ids signature",
        },
        "machine": {
            **cpu_flags(),
            "tensorflow": tf.__version__,
            "load_average_before": round(load_before, 2),
            **DECODING_ENVIRONMENT,
        },
    }
    result["machine"]["matmul_peak_flops"] = {path: round(peak) for path, peak in peaks.items()}
    with tempfile.TemporaryDirectory() as directory:
        engines, export_seconds = {}, {}
        for variant in variants:
            engines[variant], export_seconds[variant] = export_engine(
                model, args, variant, source_ids, directory)
        quantizations = ("float32", "int8") if args.compare_ctranslate2 else ()
        for quantization in quantizations:
            engines.update(ctranslate2_engines(model, args, source_ids, directory, quantization))
        reports = time_in_turns(engines, args.batch_size)
        for variant in variants:
            result[variant] = {**reports[variant],
                               "export_seconds": round(export_seconds[variant], 2)}
            steps = result[variant]["output_length"] if not args.forced_steps else args.forced_steps
            flops = decode_flops(model.config, args.batch_size, args.source_length,
                                 args.beam_size, steps)
            result[variant]["flops_per_batch"] = flops
            path, _, dtype = variant.partition("-")
            peak = peaks[f"{'xla' if path == 'xla' else 'graph'}-{dtype or 'float32'}"]
            result[variant]["mfu"] = round(flops / result[variant]["seconds_per_batch"] / peak, 4)
            print(f"{variant}: {result[variant]}", file=sys.stderr)
        if args.compare_ctranslate2:
            for quantization in quantizations:
                name = f"ctranslate2_{quantization}"
                result[name] = ctranslate2_result(reports, quantization)
                print(f"{name}: {result[name]}", file=sys.stderr)
            ours = {v: result[v]["seconds_per_batch"] for v in variants
                    if not v.startswith("uncached")}
            best = min(ours, key=ours.get)
            result["over_ctranslate2"] = {
                # > 1: ours is faster.
                f"{v}_over_ctranslate2_float32": round(
                    result["ctranslate2_float32"]["seconds_per_batch"] / seconds, 3)
                for v, seconds in ours.items()}
            result["over_ctranslate2"][f"best_ours_{best}_over_ctranslate2_int8"] = round(
                result["ctranslate2_int8"]["seconds_per_batch"] / ours[best], 3)
    if "graph" in result and "uncached" in result:
        result["cached_speedup"] = round(
            result["uncached"]["seconds_per_batch"] / result["graph"]["seconds_per_batch"], 2
        )
    if "graph" in result and "xla" in result:
        result["xla_speedup"] = round(
            result["graph"]["seconds_per_batch"] / result["xla"]["seconds_per_batch"], 2
        )
    if not args.no_profile:
        result["profile"] = profile_step(model, args, source_ids)
    result["machine"]["load_average_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
