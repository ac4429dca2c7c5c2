"""Exports a training run as a SavedModel that TensorFlow Serving runs.

    keras-transformer export --run runs/demo --out exports/demo            # exports/demo/1/
    keras-transformer export --run runs/demo --out exports/demo --weights final --version 7

Writes EXPORT_DIR/<version>/ (saved_model.pb, variables/, assets/, and
assets.extra/ with config.json and tf_serving_warmup_requests). The signatures:
serving_default (text -> translation, score), translate and translate_nbest (text
and optional beam_size, alpha, extra_length, no_repeat_ngram_size), translate_ids
(ids -> ids, score).
Before the version directory appears, the export is reloaded in a separate
process that imports only tensorflow and tensorflow_text, and must translate a
few sentences exactly as the in-memory model does.
"""

import dataclasses
import os
import sys

from keras_transformer import ctranslate2_model
from keras_transformer import run_files
from keras_transformer.cli.common import OneLineErrorParser
from keras_transformer.cli.common import WEIGHTS_HELP
from keras_transformer.cli.common import add_decoding_flags
from keras_transformer.cli.common import check_not_swapped
from keras_transformer.cli.common import choose_run_decoding
from keras_transformer.cli.common import corpus_split
from keras_transformer.cli.common import decoding_config
from keras_transformer.cli.common import decoding_line
from keras_transformer.cli.common import os_error_line
from keras_transformer.cli.common import run_translators
from keras_transformer.cli.common import say_checkpoints
from keras_transformer.cli.common import says_warnings
from keras_transformer.cli.common import start_decoding
from keras_transformer.decoding_config import PAPER_DECODING
from keras_transformer.decoding_config import REQUEST_SETTINGS
from keras_transformer.decoding_config import RUN_PRECISION


# How messages name the command (the clone's export.py passes its own name).
PROG = "keras-transformer export"
# The `DecodingConfig` fields an export takes as flags (--beam-size, ...).
DECODING_FLAGS = (*REQUEST_SETTINGS, "block_adjacent_repeats", "recase_capitals",
                  "beam_sizes", "max_input_length", "max_batch_size",
                  "max_input_chars", "jit_compile", "xla_max_batch_size", "precision",
                  "parallel_searches")
# The decoding a run chose on its dev set (`runs.Run.decoding_settings`): an
# absent flag leaves it to the run.
RUN_CHOSEN = ("alpha", "no_repeat_ngram_size", "block_adjacent_repeats")
# The export chooses XLA for the machine it runs on, and decodes in the precision
# of a run's translations (float32) unless --precision says otherwise.
FLAG_DEFAULTS = {"jit_compile": "auto", "precision": RUN_PRECISION, **dict.fromkeys(RUN_CHOSEN)}


def parse_args(argv, prog=PROG):
    parser = OneLineErrorParser(
        prog=prog, description=__doc__.split("\n")[0],
    )
    parser.add_argument("--run", required=True, help="the training run directory")
    parser.add_argument("--out", required=True,
                        help="the export base directory (TF Serving's model_base_path); "
                             "with --format ctranslate2, the model directory (new)")
    parser.add_argument("--format", choices=("savedmodel", "ctranslate2"), default="savedmodel",
                        help="a SavedModel for TF Serving, or a CTranslate2 model with its "
                             "sentencepiece model (needs pip install ctranslate2)")
    parser.add_argument("--quantization", choices=ctranslate2_model.QUANTIZATIONS, default="float32",
                        help="--format ctranslate2: the weights' type (float16, bfloat16 "
                             "and int8_float16/int8_bfloat16 for a GPU)")
    parser.add_argument("--weights", choices=run_files.WEIGHT_CHOICES,
                        default=run_files.WEIGHT_CHOICES[0], help=WEIGHTS_HELP)
    parser.add_argument("--version", type=int, default=None,
                        help="version directory (a new one); default: one more than the "
                             "largest there")
    add_decoding_flags(parser, DECODING_FLAGS, defaults=FLAG_DEFAULTS, reads="a run")
    parser.add_argument("--model-name", default=None,
                        help="the model's name in the model server's models.config "
                             "(default: the base name of --out)")
    parser.add_argument("--ids-only", action="store_true",
                        help="export only signatures that take token ids "
                             "(serving_default and translate_ids), for TensorFlow without "
                             "tensorflow-text ops")
    parser.add_argument("--warmup-file", default=None,
                        help="sentences (one a line) for the TF Serving warm-up requests "
                             "and the reload check; default: two built-in sentences (those "
                             "that fit the request limits)")
    parser.add_argument("--no-check", action="store_true",
                        help="skip reloading the export in a separate process")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.run):
        parser.error(f"--run {args.run} is not a directory")
    check_not_swapped(parser, run=args.run)
    if args.warmup_file is not None and not os.path.isfile(args.warmup_file):
        parser.error(f"--warmup-file {args.warmup_file} does not exist")
    if args.format == "ctranslate2" and args.precision != RUN_PRECISION:
        parser.error("--precision is for SavedModel exports; a CTranslate2 export takes "
                     "--quantization")
    try:  # without --alpha or --no-repeat-ngram-size, the run's (main)
        args.decoding = decoding_config(args, [
            name for name in DECODING_FLAGS
            if name not in RUN_CHOSEN or getattr(args, name) is not None])
    except ValueError as error:
        parser.error(str(error))
    if args.version is not None and args.version < 1:
        parser.error(f"--version must be >= 1. Received: {args.version}")
    return args


@says_warnings
def main(argv=None, prog=PROG):
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    start_decoding(args.verbose)
    # Imported after the flags are checked: a typo should not wait for TensorFlow.
    from keras_transformer import runs
    from keras_transformer import saved_model
    from keras_transformer import serving

    try:
        run = runs.Run(args.run)
        model, tokenizer, run_config = run.load(args.weights)
        say_checkpoints(prog, args.run, run_config)
        chosen = run.decoding_settings()  # what the run chose on its dev set
        # A run that stopped before its end (or is still training) has chosen none; a
        # run's own weights (averaged, final) keep what it chose, the paper's for runs
        # that ended before runs chose (2026-11-26), as their exports did.
        if args.weights == "checkpoints" and not run.decoding_chosen() and any(
                getattr(args, name) is None for name in RUN_CHOSEN):
            chosen = decoding_chosen_now(run, run_config, model, tokenizer, prog)
        if args.ids_only and chosen.pop("block_adjacent_repeats", False):
            print(f"{prog}: the run blocks words repeated back to back, which an --ids-only "
                  "export cannot (it has no pieces to tell words by); it blocks the rest",
                  flush=True)
        decoding = dataclasses.replace(args.decoding, **{
            name: value for name, value in chosen.items() if getattr(args, name) is None})
        run_config = dict(run_config, weights=args.weights, run_dir=os.path.abspath(args.run))
        if args.format == "ctranslate2":
            return export_ctranslate2(model, tokenizer, decoding, run_config, args, prog)
        config, notes = decoding.resolved()
        for note in notes:
            print(f"{prog}: {note}", flush=True)
        translator = serving.Translator(model, None if args.ids_only else tokenizer, config)
        warmup = None  # the built-in sentences that fit the request limits
        if args.warmup_file is not None:
            with open(args.warmup_file, encoding="utf-8") as f:
                warmup = [line.rstrip("\n") for line in f if line.strip()][:32]
        path = saved_model.export_translator(
            translator, args.out, args.version, config=run_config, warmup_texts=warmup,
            check=not args.no_check,
        )
    except (ValueError, FileNotFoundError) as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    except saved_model.ExportError as error:
        print(f"{prog}: the export failed its check: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: no stack; a version is whole or absent
        return 130
    except OSError as error:  # a full disk, say
        print(f"{prog}: {os_error_line(error)} Nothing was exported.", file=sys.stderr)
        return 1
    try:
        server_files = saved_model.write_model_server_files(args.out, translator, args.model_name)
    except OSError as error:  # the version is whole: say so
        print(f"{prog}: wrote {path}, but not TF Serving's files beside it: "
              f"{os_error_line(error)}", file=sys.stderr)
        return 1
    checked = "" if args.no_check else ", checked in a separate process"
    print(f"{prog}: wrote {path}{checked}")
    shapes = translator.shapes
    if shapes.xla:
        count = len(shapes.batch_sizes) * len(shapes.source_lengths)
        larger = "; larger requests run without XLA" if shapes.xla_small_requests_only else ""
        print(f"  XLA: requests padded to {count} shapes (rows {shapes.batch_sizes}, "
              f"source tokens {shapes.source_lengths}), compiled by the warm-up requests "
              f"when the model server loads the version{larger}")
    searches = translator.config.parallel_searches
    threads = (f" --tensorflow_intra_op_parallelism=1 (its {searches} searches side by side, "
               "a core each)" if searches > 1 else "")
    print(f"  saved_model_cli show --dir {path} --all")
    print(f"  TF Serving: --model_config_file={os.path.basename(server_files[0])} "
          f"--enable_batching --batching_parameters_file={os.path.basename(server_files[1])}"
          f"{threads} (both files in {args.out}; see docs/export-and-serving.md)")
    return 0


def decoding_chosen_now(run, run_config, model, tokenizer, prog):
    """The decoding of `run`'s translations (`model`, as `run.load` gave it), for a
    run that has not chosen its own (`runs.Run.decoding_chosen`: it stopped before
    its end): chosen now, on its dev pairs, as the run would have as it ended.
    The paper's (`{}`) where they cannot be read; it says which."""
    from keras_transformer.config import TrainingConfig

    training = TrainingConfig.from_dict(run_config.get("training", {}))
    print(f"{prog}: {run.directory} has not chosen the decoding of its translations (a run "
          "chooses it as it ends): choosing it now, on its first "
          f"{training.alpha_sentences} dev pairs", flush=True)
    try:
        dev_pairs = corpus_split(training.data, "dev", training.seed, training.source_language,
                                 training.target_language, download=False)
        settings, scores, sentences = choose_run_decoding(
            run_translators(model, tokenizer), dev_pairs, training.alpha_sentences)
    except (ValueError, OSError) as error:  # moved, or a TFDS corpus not prepared here
        print(f"{prog}: the dev pairs of --data {training.data!r} cannot be read "
              f"({error}); the export decodes as the paper does ({PAPER_DECODING}) unless "
              "--alpha and --no-repeat-ngram-size say otherwise", flush=True)
        return {}
    if sentences:
        line = decoding_line(settings, scores, sentences, whose="this export's")
        print(f"{prog}: {line}", flush=True)
    return settings


def export_ctranslate2(model, tokenizer, decoding, run_config, args, prog):
    """Writes --out as a CTranslate2 export of `model` with the `decoding` (a
    `DecodingConfig`: the run's, or the flags') its translations take."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        print(f"{prog}: --format ctranslate2 needs the ctranslate2 package: "
              "pip install ctranslate2 (or the package's [ctranslate2] extra)", file=sys.stderr)
        return 2
    if decoding.block_adjacent_repeats:
        print(f"{prog}: the run blocks words repeated back to back, which CTranslate2 cannot; "
              "its translations block the rest", flush=True)
    path = ctranslate2_model.export_ctranslate2(model, tokenizer, args.out, args.quantization,
                                                config=decoding, run=run_config)
    print(f"{prog}: wrote {path} (CTranslate2, {args.quantization})")
    print(f"  keras-transformer translate --export {path} input.txt (or evaluate --export "
          f"{path}); from Python: keras_transformer.ctranslate2_model.translate_ctranslate2"
          f"({path!r}, sentences)")
    return 0
