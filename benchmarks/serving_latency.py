"""Serving latency and throughput by request size, ours and CTranslate2; prints JSON.

    python benchmarks/serving_latency.py --run runs/quickstart   # a trained run: minutes
    python benchmarks/serving_latency.py                         # base dims, random weights
    python benchmarks/serving_latency.py --quick                 # tiny model: a smoke check

One client sends requests one after another (a closed loop, as a batch job or
a single caller does), each a batch of B sentences of the bundled test split,
for B in `--batch-sizes` (1, 8, 32, 128). Each engine sees the same requests
in the same order:

- ours: the SavedModel that `keras-transformer export` writes (text in, text
  out, tokenization inside), reloaded with `tf.saved_model.load` and called
  through its `translate` signature, once per `--precisions` entry
  (`export --precision`);
- CTranslate2 (`--no-ctranslate2` to skip): the same weights written by
  `export --format ctranslate2`, in float32 and int8 on a CPU (float32,
  float16 and int8_float16 on a GPU), with the sentencepiece tokenization and
  detokenization in Python counted in its latency.

Beam 4 and the length penalty off in both, so that both engines produce the
same translations (tests/test_ctranslate2.py), hence do the same work. With
`--run`, the run's averaged weights and vocabulary, and the paper's output
limit (source length + 50) with early stop. Without it, `--preset` dimensions
(base by default) with random weights over a vocabulary learned from the
bundled corpus, and every request decodes exactly `--forced-steps` steps (the
end of sequence ignored), as `decode_throughput.py` does.

Per engine and batch size: sentences/s (sentences over the summed latencies),
p50 and p95 latency in milliseconds, and the first request's latency (tracing
or compilation, paid before the timed requests; with XLA, after the export's
warm-up requests are replayed as TF Serving does at load, whose seconds are
`warmup_replay_seconds`; `--xla-max-batch-size N`: XLA for requests of up to N
sentences only). `same_translations_as_...`:
each engine's share of translations of the first 32 sentences identical to
the first engine's. The report goes to `--out-dir`/report.json
(runs/serving_latency) and stdout, then the plot to serving_latency.png beside
it (matplotlib, the `benchmarks` extra; without it one line says so).
"""

import argparse
import math
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import VERBOSE_HELP  # noqa: E402 (imports no TensorFlow)
from machine import require  # noqa: E402
from machine import set_decoding_environment  # noqa: E402

DECODING_ENVIRONMENT = set_decoding_environment()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer import TransformerConfig  # noqa: E402
from keras_transformer import build_transformer  # noqa: E402
from keras_transformer import data  # noqa: E402
from keras_transformer import export_files  # noqa: E402
from keras_transformer import hardware  # noqa: E402
from keras_transformer import runs  # noqa: E402
from keras_transformer import saved_model  # noqa: E402
from keras_transformer import serving  # noqa: E402
from keras_transformer.decoding_config import PAPER_EXTRA_LENGTH  # noqa: E402
from keras_transformer.decoding_config import REQUEST_SETTINGS  # noqa: E402
from machine import cpu_flags  # noqa: E402
from machine import tensorflow_device  # noqa: E402
import reporting  # noqa: E402

BEAM_SIZE = 4
CHECKED_SENTENCES = 32  # translated by every engine, and compared


def log(message):
    print(message, file=sys.stderr, flush=True)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", help="a training run directory (keras-transformer train "
                                      "--out); without it, random weights")
    parser.add_argument("--preset", default="base",
                        help="TransformerConfig preset of the random-weight model")
    parser.add_argument("--vocab-size", type=int, default=8000,
                        help="vocabulary of the random-weight model, learned from the "
                             "bundled corpus")
    parser.add_argument("--forced-steps", type=int, default=48,
                        help="steps every request of the random-weight model decodes")
    parser.add_argument("--batch-sizes", default="1,8,32,128",
                        help="comma-separated request batch sizes")
    parser.add_argument("--sentences", type=int, default=128,
                        help="sentences per batch size and engine (at least "
                             "--min-requests requests each)")
    parser.add_argument("--min-requests", type=int, default=5)
    parser.add_argument("--precisions", default="float32",
                        help="comma-separated export precisions of ours: float32, "
                             "bfloat16, float16")
    parser.add_argument("--jit-compile", default="auto", choices=("auto", "on", "off"),
                        help="ours with XLA (export --jit-compile)")
    parser.add_argument("--xla-max-batch-size", type=int, default=None,
                        help="ours with XLA for requests of at most this many sentences, "
                             "larger ones without (export --xla-max-batch-size)")
    parser.add_argument("--max-input-length", type=int, default=None,
                        help="only sentences of at most this many tokens, and ours exported "
                             "with this max_input_length: an XLA export then compiles fewer "
                             "source lengths (default: the model's max_positions)")
    parser.add_argument("--no-ctranslate2", action="store_true")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    parser.add_argument("--out-dir", default=os.path.join("runs", "serving_latency"))
    parser.add_argument("--quick", action="store_true",
                        help="tiny model, vocabulary 400, batch sizes 1,4: a smoke check")
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.vocab_size, args.forced_steps = "tiny", 400, 8
        args.batch_sizes, args.sentences, args.min_requests = "1,4", 8, 2
    args.batch_sizes = sorted({int(b) for b in args.batch_sizes.split(",") if b.strip()})
    if not args.batch_sizes or args.batch_sizes[0] < 1:
        parser.error("--batch-sizes must be positive integers, e.g. 1,8,32,128")
    args.precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if not args.no_ctranslate2:
        require(parser, "ctranslate2", "benchmarks", "add --no-ctranslate2")
    return args


def load_model(args):
    """(model, tokenizer, translator options) for the run or the random model."""
    if args.run:
        model, tokenizer, _ = runs.Run(args.run).load()
        return model, tokenizer, dict(extra_length=PAPER_EXTRA_LENGTH)
    pairs = data.load_parallel("bundled", "train").take(20000)
    tokenizer = data.SubwordTokenizer.train(pairs, vocab_size=args.vocab_size)
    keras.utils.set_random_seed(0)
    config = TransformerConfig.preset(args.preset, tokenizer.vocab_size,
                                      max_positions=max(256, args.forced_steps + 8))
    # Every output limit (source + extra_length) is past the longest output
    # (max_output_length), so that every request runs exactly forced_steps steps.
    options = dict(extra_length=args.forced_steps, max_output_length=args.forced_steps,
                   ignore_eos=True)
    return build_transformer(config), tokenizer, options


def bundled_test_sources(tokenizer, count, max_input_length=None):
    """The first `count` sources of the bundled test split (of at most
    `max_input_length` tokens, if given: no engine truncates them)."""
    sentences = []
    for pair in data.load_parallel("bundled", "test").as_numpy_iterator():
        if max_input_length is None or len(tokenizer.tokenize(pair["source"])) <= max_input_length:
            sentences.append(pair["source"].decode())
        if len(sentences) == count:
            break
    return sentences


def requests_for(sentences, batch_size, args):
    count = max(args.min_requests, math.ceil(args.sentences / batch_size))
    return [[sentences[(i * batch_size + j) % len(sentences)] for j in range(batch_size)]
            for i in range(count)]


def measure(translate, requests):
    """Latencies of `translate(batch)` over `requests`, after one untimed call."""
    start = time.perf_counter()
    translate(requests[0])
    first = time.perf_counter() - start
    seconds = []
    for batch in requests:
        start = time.perf_counter()
        translate(batch)
        seconds.append(time.perf_counter() - start)
    milliseconds = 1000 * np.array(seconds)
    return {
        "requests": len(requests),
        "sentences_per_second": round(sum(len(b) for b in requests) / sum(seconds), 2),
        "p50_ms": round(float(np.percentile(milliseconds, 50)), 1),
        "p95_ms": round(float(np.percentile(milliseconds, 95)), 1),
        "first_request_ms": round(1000 * first, 1),
    }


def ours(model, tokenizer, options, precision, jit_compile, xla_max_batch_size, max_batch_size,
         max_input_length, directory):
    """`translate(batch)` through the reloaded SavedModel, and its settings. The
    export takes requests of up to `max_batch_size` sentences (the largest timed),
    so that XLA's padded shapes stop there."""
    if precision != "float32":
        model = model.with_dtype(precision)
    translator = serving.Translator(model, tokenizer, beam_size=BEAM_SIZE, alpha=0.0,
                                    beam_sizes=(BEAM_SIZE,), jit_compile=jit_compile,
                                    xla_max_batch_size=xla_max_batch_size,
                                    max_batch_size=max_batch_size,
                                    max_input_length=max_input_length, **options)
    # With XLA, the warm-up requests compile every padded shape (serving_shapes).
    compiles = " (XLA: the warm-up compiles every padded shape)" if jit_compile else ""
    log(f"ours-{precision}: exporting{compiles}...")
    start = time.perf_counter()
    path = saved_model.export_translator(
        translator, os.path.join(directory, f"ours-{precision}"),
        warmup_texts=saved_model.WARMUP_TEXTS if jit_compile else (), check=False)
    log(f"ours-{precision}: exported in {time.perf_counter() - start:.0f} s")
    loaded = tf.saved_model.load(path)
    signature = loaded.signatures["serving_default"]
    replay_seconds = replay_warmup(loaded, path, translator.settings()) if jit_compile else None
    if replay_seconds is not None:
        log(f"ours-{precision}: warm-up replayed in {replay_seconds:.0f} s")

    def translate(batch):
        return signature(text=tf.constant(batch))["translation"].numpy()

    return translate, replay_seconds


def replay_warmup(loaded, path, settings):
    """Seconds to replay the export's warm-up requests as TF Serving does when it
    loads a version (knobs a request leaves out take the export's defaults)."""
    from tensorflow_serving.apis import prediction_log_pb2

    defaults = {name: tf.constant(settings[name])
                for name in REQUEST_SETTINGS}
    start = time.perf_counter()
    for record in tf.data.TFRecordDataset(
            os.path.join(path, export_files.ASSETS_EXTRA, export_files.WARMUP_FILENAME)):
        request = prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
        signature = loaded.signatures[request.model_spec.signature_name]
        inputs = {name: tf.constant(tf.make_ndarray(proto))
                  for name, proto in request.inputs.items()}
        wanted = signature.structured_input_signature[1]
        signature(**{name: value for name, value in defaults.items() if name in wanted}, **inputs)
    return time.perf_counter() - start


def ctranslate2_engine(model, tokenizer, options, compute_type, device, directory):
    """`translate(batch)` through CTranslate2, tokenization included."""
    import ctranslate2
    import sentencepiece

    from keras_transformer import ctranslate2_model

    quantization = None if compute_type == "float32" else compute_type
    path = os.path.join(directory, f"ct2-{compute_type}")
    if not os.path.exists(path):
        ctranslate2_model.export_ctranslate2(model, tokenizer, path, quantization)
    processor = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(path, ctranslate2_model.SENTENCEPIECE_FILENAME))
    engine = ctranslate2.Translator(path, device=device, compute_type=compute_type,
                                    inter_threads=1, intra_threads=os.cpu_count())
    forced = options.get("ignore_eos", False)

    def translate(batch):
        pieces = processor.encode([" ".join(text.split()) for text in batch], out_type=str)
        longest = max(len(p) for p in pieces)
        steps = options["max_output_length"] if forced else longest + options["extra_length"]
        results = engine.translate_batch(
            pieces, beam_size=BEAM_SIZE, length_penalty=0.0, max_decoding_length=steps,
            min_decoding_length=steps if forced else 0, max_batch_size=len(batch))
        return [processor.decode(result.hypotheses[0]) for result in results]

    return translate, None


def engines(model, tokenizer, options, args, directory):
    """(name, factory) of each engine to time; a factory builds it when called."""
    small = args.xla_max_batch_size
    jit_compile = hardware.decoding_jit_compile(args.jit_compile, small)
    suffix = "" if not jit_compile else "_xla" if small is None else f"_xla_up_to_{small}"
    listed = [(f"ours_{precision}{suffix}",
               lambda p=precision: ours(model, tokenizer, options, p, jit_compile, small,
                                        max(args.batch_sizes), args.max_input_length,
                                        directory))
              for precision in args.precisions]
    if not args.no_ctranslate2:
        import ctranslate2

        on_gpu = ctranslate2.get_cuda_device_count() > 0
        types = ("float32", "float16", "int8_float16") if on_gpu else ("float32", "int8")
        listed += [(f"ctranslate2_{compute_type}",
                    lambda t=compute_type: ctranslate2_engine(
                        model, tokenizer, options, t, "cuda" if on_gpu else "cpu", directory))
                   for compute_type in types]
    return listed


def over_ctranslate2(results):
    """Each of ours' sentences/s over each CTranslate2 type's, by batch size
    (> 1: ours is faster), e.g. "ours_float32/ctranslate2_int8"."""
    ratios = {}
    for mine in (name for name in results if name.startswith("ours")):
        for theirs in (name for name in results if name.startswith("ctranslate2")):
            ratios[f"{mine}/{theirs}"] = {
                size: round(record["sentences_per_second"]
                            / results[theirs][size]["sentences_per_second"], 3)
                for size, record in results[mine].items()}
    return ratios


def plot(report, path):
    """Sentences/s and p95 latency against the request's batch size, per engine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (speed, latency) = plt.subplots(1, 2, figsize=(10, 4))
    for name, record in report["engines"].items():
        sizes = sorted(record, key=int)
        style = dict(marker="o", label=name, linestyle="-" if name.startswith("ours") else "--")
        speed.plot([int(b) for b in sizes], [record[b]["sentences_per_second"] for b in sizes],
                   **style)
        latency.plot([int(b) for b in sizes], [record[b]["p95_ms"] for b in sizes], **style)
    for axes, label in ((speed, "sentences/s"), (latency, "p95 latency (ms)")):
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xticks(report["batch_sizes"], [str(b) for b in report["batch_sizes"]])
        axes.minorticks_off()
        axes.set_xlabel("sentences per request")
        axes.set_ylabel(label)
        axes.grid(alpha=0.3, which="both")
    speed.legend(fontsize=8)
    machine = report["machine"]
    device = machine["device"]["name"]
    if machine["device"]["type"] == "CPU":
        extensions = [name for name, flag in (("AMX", "amx"), ("AVX512-BF16", "avx512_bf16"),
                                              ("AVX-512", "avx512f"), ("AVX2", "avx2"))
                      if machine[flag]]
        device += f" ({machine['cpus']} cores, {extensions[0] if extensions else 'no AVX2'})"
    figure.suptitle(f"{report['model']['description']}, beam {BEAM_SIZE}; {device}", fontsize=9)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    model, tokenizer, options = load_model(args)
    sentences = bundled_test_sources(
        tokenizer, max(max(args.batch_sizes) * 2, CHECKED_SENTENCES), args.max_input_length)
    config = model.config
    dims = (f"{config.num_layers}+{config.num_layers} layers, d_model {config.d_model}, "
            f"vocabulary {config.vocab_size}")
    described = (f"run {os.path.basename(os.path.normpath(args.run))} ({dims})" if args.run else
                 f"{args.preset} ({dims}), random weights, {args.forced_steps} steps a request")
    report = {
        "model": {"description": described, "parameters": model.count_params(),
                  "vocab_size": model.config.vocab_size, "beam_size": BEAM_SIZE,
                  "length_penalty": 0.0},
        "machine": {"device": tensorflow_device(), **cpu_flags(), "tensorflow": tf.__version__,
                    **DECODING_ENVIRONMENT},
        "batch_sizes": args.batch_sizes,
        "max_input_length": args.max_input_length,
        "engines": {},
    }
    outputs = {}
    with tempfile.TemporaryDirectory() as directory:
        for name, factory in engines(model, tokenizer, options, args, directory):
            translate, replay_seconds = factory()
            record = report["engines"][name] = {}
            if replay_seconds is not None:
                report.setdefault("warmup_replay_seconds", {})[name] = round(replay_seconds, 1)
            for batch_size in args.batch_sizes:
                record[str(batch_size)] = measure(
                    translate, requests_for(sentences, batch_size, args))
                log(f"{name} batch {batch_size}: {record[str(batch_size)]}")
            # In requests no larger than the largest timed (the export's max_batch_size).
            largest, checked = max(args.batch_sizes), sentences[:CHECKED_SENTENCES]
            outputs[name] = [text.decode() if isinstance(text, bytes) else text
                             for start in range(0, len(checked), largest)
                             for text in translate(checked[start:start + largest])]
    # The engines do the same work when they give the same translations.
    first = next(iter(outputs))
    report["same_translations_as_" + first] = {
        name: round(np.mean([a == b for a, b in zip(texts, outputs[first])]), 3)
        for name, texts in outputs.items() if name != first}
    report["over_ctranslate2"] = over_ctranslate2(report["engines"])
    reporting.write_report(report, args.out_dir,
                           os.path.join(args.out_dir, "serving_latency.png"), plot, log)


if __name__ == "__main__":
    main()
