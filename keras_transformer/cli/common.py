"""What the command lines (`keras-transformer train`, `export`, `translate`,
`evaluate`) share.

Imports no TensorFlow: importing this module sets TensorFlow's environment
(below), which TensorFlow reads when it starts, and `--help` or a bad flag
answers before TensorFlow is imported.
"""

import argparse
import atexit
import contextlib
import dataclasses
import functools
import inspect
import logging
import os
import re
import sys
import threading
import warnings

from keras_transformer import export_files
from keras_transformer import run_files
from keras_transformer.corpus_names import BUNDLED
from keras_transformer.corpus_names import SPLIT_PLACEHOLDER
from keras_transformer.corpus_names import TFDS_PREFIX
from keras_transformer.decoding_config import PAPER_ALPHA
from keras_transformer.decoding_config import PAPER_DECODING
from keras_transformer.decoding_config import TruncatedInputWarning
from keras_transformer.durable import FULL
from keras_transformer.durable import write_atomically

# What every command (and benchmark) sets before TensorFlow starts, unless the
# environment does:
# - TF_CPP_MIN_LOG_LEVEL: TensorFlow's C++ start-up logs drown the output; 0 brings
#   them back.
# - TF_CPU_ALLOCATOR_USE_BFC: TensorFlow's default CPU allocator hands large freed
#   buffers back to the system, so every training step page-faults them in again
#   (the base model's (tokens, vocabulary) logits and their gradient above all;
#   benchmarks/train_throughput.py measures the step); its BFC allocator keeps them
#   for the next step. false turns it off.
# - TF_ENABLE_ONEDNN_OPTS: TensorFlow turns its oneDNN kernels on by itself only on
#   CPUs with AVX-512 VNNI or BF16 or with AMX. On an AVX2-only CPU, train would
#   otherwise multiply with TensorFlow's own kernels and its export, translate and
#   evaluate with oneDNN's (`start_decoding`): float32 sums in another order, so
#   that the decoding train chose and the test BLEU it printed were not those of
#   its export (a near tie ranked the other way). With oneDNN, the small recipe's
#   step also took 0.31 s instead of 0.33 on a 2-core EPYC Zen 2 (AVX2 only,
#   2026-12-07, benchmarks/train_throughput.py). 0 turns it off.
COMMAND_ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_CPU_ALLOCATOR_USE_BFC": "true",
                       "TF_ENABLE_ONEDNN_OPTS": "1"}


def use_command_environment(environ=None):
    """Sets each of `COMMAND_ENVIRONMENT` that `environ` (os.environ) does not."""
    environ = os.environ if environ is None else environ
    for name, value in COMMAND_ENVIRONMENT.items():
        environ.setdefault(name, value)


use_command_environment()  # every command imports this module before TensorFlow


def says_warnings(main):
    """A command's `main(argv, prog)`, within which the package's warnings to
    its user (`TruncatedInputWarning`: which input lines were translated from
    their first pieces only) are said on stderr as the command's own lines,
    "prog: message", each once, instead of in Python's format (a file and line
    of our code, then that line); other warnings as Python says them."""
    default_prog = inspect.signature(main).parameters["prog"].default

    @functools.wraps(main)
    def command(argv=None, prog=default_prog):
        with warnings.catch_warnings():  # as they were, after
            warnings.simplefilter("default", TruncatedInputWarning)
            show, said = warnings.showwarning, set()

            def say(message, category, filename, lineno, file=None, line=None):
                if issubclass(category, TruncatedInputWarning):
                    if str(message) not in said:  # once, from whichever line of ours
                        said.add(str(message))
                        print(f"{prog}: {message}", file=sys.stderr, flush=True)
                else:
                    show(message, category, filename, lineno, file, line)

            warnings.showwarning = say
            return main(argv, prog)
    return command


def start_decoding(verbose, parallel_searches=1):
    """What the decoding commands (translate, evaluate, export) do once their
    flags are checked, before TensorFlow starts: keep the libraries' log lines
    off stderr (unless `verbose`), turn TensorFlow's oneDNN kernels on (as
    every command does, `COMMAND_ENVIRONMENT`), let them keep the weights in
    their own layouts, and for a translator that runs
    `parallel_searches` > 1 searches side by side give each its own core.

    TensorFlow turns oneDNN on by itself only on CPUs with AVX-512 VNNI or BF16
    or with AMX. Elsewhere (AVX2) its own matrix multiply runs beam search's
    output projection, (rows, d_model) x (d_model, V), and so the whole search,
    markedly slower (`benchmarks/decode_throughput.py`).

    With TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1, oneDNN's matrix multiplies reorder a
    weight into the layout their kernel reads once, not at every call: right
    for a process whose weights never change, as a decoding command's (a
    training process does not set it). It made the base model's search a little
    faster, the small models' about even (`benchmarks/decode_throughput.py`,
    alternating processes).

    Searches side by side (`DecodingConfig.parallel_searches`) each run on one
    thread: one intra-op thread (TF_NUM_INTRAOP_THREADS=1), so that no op hands
    work to a pool that the other searches keep busy, and an inter-op thread
    for each search (TF_NUM_INTEROP_THREADS, at least one per core).

    Any of these variables set in the environment wins (e.g.
    TF_ENABLE_ONEDNN_OPTS=0).
    """
    if not verbose:
        quiet_libraries()
    for name, value in decoding_environment(parallel_searches).items():
        os.environ.setdefault(name, value)


@contextlib.contextmanager
def graph_optimizer_off():
    """Within: TensorFlow's graph optimizer (Grappler's meta-optimizer) off for
    the graphs a decoding command (translate, evaluate) runs, on a machine
    without a GPU; as it was, after. A search's graph is optimized when it is
    first called, and there that costs more than it saves: on a 2-core Xeon
    (AMX hidden, 2026-12-01) the base model's export answered its first call in
    10 s instead of 16.5 s (10.7 s instead of 18 s held to AVX2; cpu-small's
    2.8 s instead of 4.4 s), and 32 sentences took the same time after (5.8 s
    with, 5.75 s without; 10.4 s and 10.0 s held to AVX2). On a GPU, where it
    was not measured, it stays on. (TF Serving optimizes the graph as it
    always does, on the warm-up requests before the first.)"""
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        yield
        return
    before = tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer", False)
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": before})


def decoding_environment(parallel_searches=1):
    """The variables `start_decoding` sets (see there), for a translator that
    runs `parallel_searches` searches side by side."""
    environment = dict(DECODING_ENVIRONMENT)
    if parallel_searches > 1:
        from keras_transformer import hardware

        environment["TF_NUM_INTRAOP_THREADS"] = "1"
        environment["TF_NUM_INTEROP_THREADS"] = str(
            max(parallel_searches, hardware.available_cores()))
    return environment


def parallel_searches(export=None, run=None):
    """How many searches side by side the translator of a decoding command
    runs, read before TensorFlow starts: the number an export recorded (1 for
    exports from before the setting), or for a run the default on a CPU
    (`hardware.cpu_parallel_searches`)."""
    from keras_transformer import hardware

    if export is not None:
        try:
            return export_files.translator_settings(export).get("parallel_searches") or 1
        except (OSError, ValueError):  # loading the export reports what is wrong with it
            return 1
    return hardware.cpu_parallel_searches()


def load_command_translator(args, prog):
    """The translator of a decoding command (translate, evaluate): its --export,
    or its --run with --weights. A run's translator traces only the search of
    --beam-size, the one its requests ask for (`decoding_config.in_process_settings`);
    with --weights checkpoints, the command says which it averaged."""
    from keras_transformer import loading
    from keras_transformer import runs
    from keras_transformer.decoding_config import in_process_settings

    if args.run is None:
        return loading.load_export(args.export)
    run = runs.Run(args.run)
    model, tokenizer, run_config = run.load(args.weights)
    say_checkpoints(prog, args.run, run_config, file=sys.stderr)  # stdout: the output
    unchosen = args.weights == "checkpoints" and not run.decoding_chosen()
    if unchosen and (args.alpha is None or args.no_repeat_ngram_size is None):
        print(f"{prog}: {args.run} has not chosen the decoding of its translations (a run "
              f"chooses it on its dev set as it ends): this decodes as the paper does "
              f"({PAPER_DECODING}) unless --alpha and --no-repeat-ngram-size say "
              "otherwise; its export chooses it", file=sys.stderr, flush=True)
    return loading.run_translator(run, model, tokenizer, **in_process_settings(args.beam_size))


def say_checkpoints(prog, run_dir, run_config, file=None):
    """Prints to `file` (stdout where None) which checkpoints of `run_dir` the
    weights are, where `run_config` (from `Run.load`) says: their steps, for
    `--weights checkpoints`."""
    if "checkpoint_steps" in run_config:
        steps = run_config["checkpoint_steps"]
        which = (f"the checkpoint of step {steps[0]}" if len(steps) == 1 else
                 f"the average of the checkpoints of steps {', '.join(map(str, steps))}")
        print(f"{prog}: {which} of {run_dir}", file=file, flush=True)


def check_not_swapped(parser, export=None, run=None):
    """Refuses, before TensorFlow starts, saying which flag it belongs to, an
    `export` that is a training run's directory (its config.json, no SavedModel)
    or a `run` that is an export's (a SavedModel, no config.json: a run may hold
    an export too; or a CTranslate2 export, whose model has a config.json)."""
    if export is not None and not export_files.is_export(export) and run_files.is_run(export):
        parser.refuse(
            f"--export {export} is a training run's directory, not an export: translate "
            f"with the run itself (--run {export}), or export it first (keras-transformer "
            f"export --run {export} --out EXPORT)")
    if run is not None and export_files.is_export(run) and (
            export_files.is_ctranslate2_export(run) or not run_files.is_run(run)):
        parser.refuse(
            f"--run {run} is an export, not a training run's directory: translate and "
            f"evaluate it with --export {run}")


# What `start_decoding` sets, unless the environment does: also for a model
# server and the benchmarks.
# A training process must not inherit FROZEN_WEIGHTS (see `start_decoding`).
FROZEN_WEIGHTS = "TF_ONEDNN_ASSUME_FROZEN_WEIGHTS"
DECODING_ENVIRONMENT = {"TF_ENABLE_ONEDNN_OPTS": "1", FROZEN_WEIGHTS: "1"}


# XLA on a GPU weighs GEMM kernels of its own (Triton) against cuBLAS for each matrix
# product of a training step, compiling and timing the candidates. On an H200 the base
# model's step (520 x 48 tokens, mixed_bfloat16) with cuBLAS alone compiled in 0.65x
# the time and ran in 0.89x (benchmarks/results/gpu/2026-11-26-train_throughput-h200-*).
XLA_GPU_FLAGS = {"--xla_gpu_enable_triton_gemm": "false"}


def use_xla_gpu_flags(environ=None):
    """Adds `XLA_GPU_FLAGS` to XLA_FLAGS in `environ` (os.environ), each one the
    flags do not name already, before TensorFlow starts (it reads them once).
    A CPU ignores them."""
    environ = os.environ if environ is None else environ
    flags = environ.get("XLA_FLAGS", "")
    for name, value in XLA_GPU_FLAGS.items():
        if f"{name}=" not in flags:
            flags = f"{flags} {name}={value}".strip()
    environ["XLA_FLAGS"] = flags


def use_compilation_cache(directory):
    """Keeps what XLA compiles in `directory` (created), for later processes:
    TensorFlow's persistent cache of compiled programs (every device type) and,
    on a GPU, XLA's GEMM autotuning results. Set before TensorFlow starts, which
    reads TF_XLA_FLAGS and XLA_FLAGS once; flags already in the environment win.
    "" keeps nothing."""
    if not directory:
        return
    directory = os.path.abspath(os.path.expanduser(directory))
    os.makedirs(os.path.join(directory, "autotune"), exist_ok=True)
    flags = os.environ.get("TF_XLA_FLAGS", "")
    if "--tf_xla_persistent_cache_directory" not in flags:
        os.environ["TF_XLA_FLAGS"] = (
            f"{flags} --tf_xla_persistent_cache_directory={directory} "
            "--tf_xla_persistent_cache_device_types=CPU,GPU,TPU").strip()
    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_gpu_per_fusion_autotune_cache_dir" not in flags:
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_gpu_per_fusion_autotune_cache_dir="
            f"{os.path.join(directory, 'autotune')}").strip()


def is_named_corpus(data):
    """Whether a corpus flag (train --data, evaluate --test) names the bundled
    corpus or a TFDS one, rather than files."""
    return data == BUNDLED or data.startswith(TFDS_PREFIX)


def corpus_source(data):
    """A corpus flag (train --data, evaluate --test) as the `source` of
    `keras_transformer.data.load_parallel`: 'bundled', 'tfds:NAME[/CONFIG]',
    'SOURCE_FILE,TARGET_FILE' or one tab-separated file; paths may hold '{split}'."""
    if is_named_corpus(data):
        return data
    paths = data.split(",")
    if len(paths) > 2:
        raise ValueError(f"a corpus is one tab-separated file or two files "
                         f"'SOURCE,TARGET'. Received: {data!r}")
    return tuple(paths) if len(paths) == 2 else paths[0]


def has_splits(data):
    """Whether a corpus flag names a corpus with splits of its own: bundled, TFDS,
    or files with a '{split}' placeholder. Files without one are a whole corpus,
    of which train holds out dev and test pairs (`data.hold_out`)."""
    return is_named_corpus(data) or SPLIT_PLACEHOLDER in data


def corpus_splits(data):
    """The split names of a corpus flag with splits (`has_splits`): TFDS's
    train/validation/test, or train/dev/test of the bundled corpus and of files
    with a '{split}' placeholder."""
    if data.startswith(TFDS_PREFIX):
        return {"train": "train", "dev": "validation", "test": "test"}
    return {"train": "train", "dev": "dev", "test": "test"}


def read_splits(data, splits, seed, source_language=None, target_language=None,
                download=True):
    """`(pairs, left_out)`: `{split: pairs}` for each of `splits` of train's --data
    `data`, as train reads them, and how many training pairs were left out (None
    for a corpus with splits of its own). A corpus with splits gives its own
    ("train", "dev" and "test" by train's names, TFDS's "validation" for dev; any
    other name as it is); files without '{split}' give the pairs `data.hold_out`
    holds out of them with the run's `seed` (read once for all; another name is
    a ValueError worded for evaluate's --split). `download`: as for
    `data.load_parallel`."""
    from keras_transformer import data as corpora

    options = {"source_language": source_language, "target_language": target_language,
               "download": download}
    source = corpus_source(data)
    if has_splits(data):
        names = corpus_splits(data)
        return {split: corpora.load_parallel(source, names.get(split, split), **options)
                for split in splits}, None
    pairs = corpora.load_parallel(source, **options)  # its own errors name the files
    try:
        held, left_out = corpora.hold_out(pairs, seed)
    except ValueError as error:  # too few pairs
        problem = str(error)
        raise ValueError(f"--data {data!r}: {problem[0].lower()}{problem[1:]} ('{{split}}' in "
                         "the paths, as in "
                         "'corpus/{split}.en,corpus/{split}.es')") from None
    unknown = [split for split in splits if split not in held]
    if unknown:
        raise ValueError(f"--split {unknown[0]}: the run held dev and test pairs out of "
                         f"--data {data!r}; pass dev or test (or train)")
    return {split: held[split] for split in splits}, left_out


def corpus_split(data, split, seed, source_language=None, target_language=None,
                 download=True):
    """The pairs of one split of train's --data `data`, as train reads them
    (`read_splits`)."""
    pairs, _ = read_splits(data, [split], seed, source_language, target_language, download)
    return pairs[split]


# What train reads each split's files for, and what to do without them.
_SPLIT_USES = {
    "train": "for the pairs it learns from",
    "dev": "for the dev loss and the decoding it chooses as it ends; give dev pairs, or "
           "the training files alone (--data {whole!r}) to hold dev and test pairs out of them",
    "test": "for the test BLEU as it ends; give test pairs, or --test-sentences 0 to skip it",
}


def check_corpus_files(data, splits):
    """Raises ValueError naming the first file of `splits` of a file corpus flag
    (train --data) that does not exist, what train reads it for and what to do:
    checked as the command starts, before the device is probed and described, not
    when the pairs are loaded (a test file, as training ends). The bundled corpus
    and TFDS have no files to check here."""
    if is_named_corpus(data):
        return
    source, names = corpus_source(data), corpus_splits(data)
    paths = source if isinstance(source, tuple) else (source,)
    if not has_splits(data):  # dev and test are held out of these
        for path in paths:
            if not os.path.isfile(path):
                raise ValueError(f"{path} does not exist or is not a file: a file of --data "
                                 f"{data!r}")
        return
    for split in splits:
        for path in paths:
            path = path.replace(SPLIT_PLACEHOLDER, names[split])
            if not os.path.isfile(path):
                whole = data.replace(SPLIT_PLACEHOLDER, names["train"])
                uses = _SPLIT_USES[split].format(whole=whole)
                raise ValueError(f"{path} does not exist or is not a file: the {split} "
                                 f"file of --data {data!r} ({uses})")


def add_config_flags(parser, dataclass, defaults=True, skip=()):
    """A flag for each field of a config dataclass (`--d-model` for `d_model`),
    its help text from the "Args:" section of the class's docstring. With
    `defaults=False` an absent flag leaves no attribute (to tell which were given)."""
    helps = _field_docs(dataclass)
    for field in dataclasses.fields(dataclass):
        if field.name not in skip:
            _add_field_flag(parser, field, field.default if defaults else argparse.SUPPRESS,
                            helps.get(field.name))


# What a run decodes with where a flag leaves it to the run, where that is not
# the `DecodingConfig` field's default.
_RUN_CHOICE = ("the one chosen on its dev set as training ended, or by export for a run that "
               "stopped before; else")
RUN_DECODING = {"alpha": f"{_RUN_CHOICE} {PAPER_ALPHA}", "no_repeat_ngram_size": f"{_RUN_CHOICE} 0",
                "block_adjacent_repeats": f"{_RUN_CHOICE} off"}


def run_translators(model, tokenizer):
    """`{block_adjacent_repeats: Translator}` of a run's `model` (its averaged
    weights, as train ends; or those export reads), for the decoding chosen for
    it and train's test BLEU: the paper's search, and one that also blocks runs
    of words repeated right after themselves, each tracing the default beam's
    only. They decode in the precision of a run's translations (`RUN_PRECISION`),
    as its export and translate and evaluate --run do, whatever the run trained
    in: a mixed-precision model's own search ranks near ties otherwise, and
    would choose and score another decoding than theirs."""
    from keras_transformer import serving
    from keras_transformer.decoding_config import RUN_PRECISION
    from keras_transformer.decoding_config import in_process_settings

    # One copy in that precision for both, where the run trained in another.
    model = model if model.precision == RUN_PRECISION else model.with_dtype(RUN_PRECISION)
    return {adjacent: serving.Translator(model, tokenizer, **in_process_settings(),
                                         block_adjacent_repeats=adjacent)
            for adjacent in (False, True)}


def choose_run_decoding(translators, dev_pairs, sentences):
    """`(settings, scores, count)`: the decoding of a run's translations
    (`translators`, from `run_translators`) chosen on the first `sentences` of
    `dev_pairs`, a dataset of pairs, of which it read `count`: whether to block
    repeats (4-grams anywhere, and runs of words right after themselves), and
    the length penalty (`evaluation.choose_decoding`). `({}, {}, 0)`, the
    paper's, without dev pairs to choose on."""
    from keras_transformer import evaluation

    pairs = [(pair["source"].decode(), pair["target"].decode())
             for pair in dev_pairs.take(sentences).as_numpy_iterator()]
    if not pairs:
        return {}, {}, 0
    settings, scores = evaluation.choose_decoding(translators[False], pairs,
                                                  blocking=translators[True])
    return settings, scores, len(pairs)


def decoding_line(settings, scores, sentences, whose="this run's"):
    """What `choose_run_decoding` chose for `whose` translations, and why, in a line."""
    size, alpha = settings["no_repeat_ngram_size"], settings["alpha"]

    def blocking(size):
        return (f"repeated {size}-grams and words repeated back to back blocked" if size
                else "nothing blocked")

    first_size = next(iter(scores))[0]
    alphas = ", ".join(f"{score:.1f} at {a:.1f}" for (n, a), score in scores.items()
                       if n == first_size)
    others = "; ".join(f"with {blocking(n)} at {a:.1f}: {score:.1f}"
                       for (n, a), score in scores.items() if n != first_size)
    return (f"Decoding for {whose} translations, chosen on {sentences} dev sentences: "
            f"alpha {alpha:.1f}, {blocking(size)} (sacreBLEU with {blocking(first_size)}: "
            f"{alphas}; {others}. Sec. 6.1's alpha {PAPER_ALPHA} unless another scores higher)")


# --weights, of export and of --run: a run's weights (`run_files.WEIGHT_CHOICES`).
WEIGHTS_HELP = ("which weights of the run: averaged (the paper's average of its last "
                "checkpoints, written as training ends), final (the last step's model) or "
                "checkpoints (the average of its newest checkpoints as they are: a run that "
                "stopped before its end, or one still training)")


def add_translator_flags(parser, unit):
    """The flags of a command that translates many sentences (translate,
    evaluate): its translator (--export, or --run with --weights), --batch-size,
    the request settings (None: the translator's own) and --progress (`unit`:
    what the input counts, "lines" or "pairs"). `check_translator_flags` checks
    them once parsed."""
    from keras_transformer.decoding_config import DEFAULT_BATCH_SIZE
    from keras_transformer.decoding_config import PROGRESS_MIN_SENTENCES
    from keras_transformer.decoding_config import REQUEST_SETTINGS

    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--export", help="an export directory (written by keras-transformer export)")
    model.add_argument("--run", help="a training run directory (written by keras-transformer train)")
    parser.add_argument("--weights", choices=run_files.WEIGHT_CHOICES,
                        default=run_files.WEIGHT_CHOICES[0],
                        help=f"with --run: {WEIGHTS_HELP}")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                        help="sentences per batch (at most the export's request limit)")
    add_decoding_flags(parser, REQUEST_SETTINGS, defaults=dict.fromkeys(REQUEST_SETTINGS))
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default="auto",
                        help=f"progress bar on stderr (auto: for {PROGRESS_MIN_SENTENCES} "
                             f"{unit} or more, where stderr is a terminal)")


def check_translator_flags(parser, args):
    """Refuses, before TensorFlow starts, what `add_translator_flags` added and
    would fail later: a directory that is not one, a batch size below 1, a
    request setting the translator would refuse (a beam size below 1, or one
    the export did not trace; a length penalty that is not finite, a negative
    extra length or n-gram size), which it refused only after loading."""
    from keras_transformer.decoding_config import REQUEST_SETTINGS
    from keras_transformer.decoding_config import DecodingConfig

    for flag, path in (("--export", args.export), ("--run", args.run)):
        if path is not None and not os.path.isdir(path):
            parser.error(f"{flag} {path} is not a directory")
    check_not_swapped(parser, export=args.export, run=args.run)
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1. Received: {args.batch_size}")
    if args.beam_size is not None and args.beam_size < 1:
        parser.error(f"--beam-size must be >= 1. Received: {args.beam_size}")
    given = {name: getattr(args, name) for name in REQUEST_SETTINGS
             if getattr(args, name) is not None}
    try:
        DecodingConfig(**given, beam_sizes=(given.get("beam_size", DecodingConfig.beam_size),))
    except ValueError as error:
        parser.error(as_flags(error, REQUEST_SETTINGS))
    if args.export is not None and args.beam_size is not None:
        try:
            traced = export_files.translator_settings(args.export).get("beam_sizes")
        except (OSError, ValueError):  # loading the export reports what is wrong with it
            traced = None
        if traced and args.beam_size not in traced:
            parser.error(f"--beam-size {args.beam_size}: the export traced the beam sizes "
                         f"{', '.join(map(str, traced))} (export's --beam-sizes chooses "
                         "them); pass one of those")


def add_decoding_flags(parser, names, defaults=None, reads="an export or a run"):
    """The flags of the `DecodingConfig` fields `names` (`--beam-size` for
    `beam_size`), as `add_config_flags` makes them. `defaults` overrides a
    field's default for this command: "auto" where the command chooses for the
    machine it runs on, None where an absent flag leaves the translator's (an
    export's or a run's, as the command `reads`) own; `decoding_config(args,
    names)` reads them back."""
    from keras_transformer.decoding_config import DecodingConfig

    helps = _field_docs(DecodingConfig)
    fields = {field.name: field for field in dataclasses.fields(DecodingConfig)}
    defaults = defaults or {}
    for name in names:
        field, help = fields[name], helps[name]
        default = defaults.get(name, field.default)
        if default is None and field.default is not None:
            run_default = RUN_DECODING.get(name, field.default)
            help += (f" Default: the run's ({run_default})." if reads == "a run"
                     else f" Default: the export's (a run's: {run_default}).")
        _add_field_flag(parser, field, default, help)


def decoding_config(args, names):
    """The `DecodingConfig` of the decoding flags `names` in `args`, or a
    ValueError that names the flags, what was received and what to do."""
    from keras_transformer.decoding_config import DecodingConfig

    try:
        return DecodingConfig(**{name: getattr(args, name) for name in names})
    except ValueError as error:
        raise ValueError(as_flags(error, names)) from None


def as_flags(error, names, owners=("DecodingConfig",)):
    """The message of a config's check (`error`, from one of the classes
    `owners`) as a command line says it: without the class, the fields `names`
    written as the flags that set them (--xla-max-batch-size)."""
    message = str(error)
    for owner in owners:
        message = message.removeprefix(f"{owner}: ")
    # A name with an underscore wherever it stands; a plain word ("steps",
    # "model") where it names the field: first, and after "Received:".
    words = [name for name in names if "_" not in name]
    pattern = r"(?<![-\w])(" + "|".join(name for name in names if "_" in name) + r")\b"
    if words:
        pattern += r"|^(" + "|".join(words) + r")\b|(?<=Received: )(" + "|".join(words) + r")\b"
    return re.sub(pattern, lambda match: "--" + match.group(0).replace("_", "-"), message)


def _add_field_flag(parser, field, default, help):
    flag = "--" + field.name.replace("_", "-")
    choices = field.metadata.get("choices")
    if field.type is bool:
        parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                            help=help)
    elif "bare_flag" in field.metadata:  # `--jit-compile` alone means `--jit-compile on`
        parser.add_argument(flag, nargs="?", const=field.metadata["bare_flag"], default=default,
                            choices=choices, help=help)
    elif "parse" in field.metadata:  # e.g. "1,2,4,8" for a tuple
        if isinstance(default, tuple):
            default = ",".join(map(str, default))
        parser.add_argument(flag, type=field.metadata["parse"], default=default, help=help)
    else:
        # `int | None` is a types.UnionType (a string only under postponed annotations).
        kind = {int: int, float: float, int | None: int, "int | None": int}.get(
            field.type, str)
        parser.add_argument(flag, type=kind, default=default, choices=choices, help=help)


def _field_docs(dataclass):
    """`{field: text}` from the "Args:" section of a dataclass's docstring."""
    docs, names = {}, []
    args = dataclass.__doc__.split("Args:", 1)[1]
    for line in args.splitlines():
        match = re.match(r"^ {8}([a-z_]+(?:, [a-z_]+)*): (.*)$", line)
        if match:
            names = [name.strip() for name in match.group(1).split(",")]
            for name in names:
                docs[name] = match.group(2).strip()
        elif line.strip() and names:
            for name in names:
                docs[name] += " " + line.strip()
    return {name: text.replace("%", "%%") for name, text in docs.items()}


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's, which ends each flag's help with its default, but not where
    that says nothing: a default of None, False or "" (a flag given or not),
    or a help that names its default itself ("Default: the export's")."""

    def _get_help_string(self, action):
        says_nothing = action.default is None or action.default is False or action.default == ""
        if says_nothing or "Default:" in action.help:
            return action.help
        return super()._get_help_string(action)


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad flags give one line naming the problem, not the whole usage; every
    command line has --verbose (see `quiet_libraries`); --help gives each
    flag's default where it has one (`DefaultsHelpFormatter`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, formatter_class=DefaultsHelpFormatter, **kwargs)
        self.add_argument("--verbose", action="store_true", default=False,
                          help="show TensorFlow's and sentencepiece's own log lines")

    def error(self, message):
        self.refuse(f"{message} (see --help)")

    def refuse(self, message):
        """Exits 2 with `message`, one line that says what to do instead."""
        self.exit(2, f"{self.prog}: {message}\n")

    def check_output(self, flag, path):
        """Refuses an output file that could not be written, before any work
        that would be lost with it: its directory missing, or a directory."""
        directory = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            self.error(f"{flag} {path} is a directory; name a file")
        if not os.path.isdir(directory):
            self.error(f"{flag} {path}: its directory {directory} does not exist")


# Lines that TensorFlow's and sentencepiece's C++ code writes to stderr whatever
# TF_CPP_MIN_LOG_LEVEL says (absl's messages before its log is initialized, CUDA
# probes on a CPU-only machine, oneDNN notices, sentencepiece's LOG(INFO)), through
# the end of the line: they can also start in the middle of a progress bar's line.
LIBRARY_LOG_LINE = re.compile(
    rb"(?:[IWE]\d{4} [\d:.]+ +\d+ [\w.+-]+:\d+\]"
    rb"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    rb"|[\w.+-]+\(\d+\) LOG\(INFO\) )[^\n]*\n?"
)
# Python loggers whose warnings a user of the command lines cannot act on: urllib3
# writes one for each retry of a download (TFDS's first use of a corpus, offline: a
# screenful in its 3 to 4 minutes of retries, before the one line that says why).
_UNACTIONABLE_LOGGERS = ("urllib3",)


def quiet_libraries():
    """Keeps the libraries' own log lines and their loggers' unactionable warnings
    (`_UNACTIONABLE_LOGGERS`) off stderr.

    C++ code writes to file descriptor 2 directly, so the descriptor is redirected
    to a pipe whose reader passes on every line but the libraries' log lines
    (`LIBRARY_LOG_LINE`); child processes inherit the filter. The command lines'
    `--verbose` skips this.
    """
    for name in _UNACTIONABLE_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    original = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward():
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                line = LIBRARY_LOG_LINE.sub(b"", line)
                if line:
                    os.write(original, line)

    thread = threading.Thread(target=forward, name="stderr-filter", daemon=True)
    thread.start()

    def restore():
        sys.stderr.flush()
        os.dup2(original, 2)  # closes the pipe's last write end: the reader ends
        thread.join(timeout=5)

    atexit.register(restore)


def os_error_line(error):
    """An `OSError` of the system's in a sentence: its words, the file, and for a
    full disk what to do ("No space left on device: PATH; free some space.")."""
    what = f"{error.strerror or error}" + (f": {error.filename}" if error.filename else "")
    return what + ("; free some space." if error.errno in FULL else ".")


def write_lines(path, texts):
    """Writes `texts` to `path` ("-": stdout), one a line (a newline within one
    becomes a space). A file is written whole or not at all
    (`durable.write_atomically`: a full disk leaves what was there before);
    stdout, a device or a pipe, directly."""
    def write(stream):
        stream.writelines(text.replace("\n", " ") + "\n" for text in texts)

    def write_file(temporary):
        with open(temporary, "w", encoding="utf-8") as f:
            write(f)

    if path == "-":
        write(sys.stdout)
        sys.stdout.flush()
    elif os.path.exists(path) and not os.path.isfile(path):  # /dev/null, a named pipe
        with open(path, "w", encoding="utf-8") as f:
            write(f)
    else:
        write_atomically(path, write_file)
