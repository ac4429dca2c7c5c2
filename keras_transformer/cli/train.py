"""Trains a Transformer with the paper's recipe (Sec. 5) and `model.fit`.

    keras-transformer train --time-budget 5                   # bundled corpus, the CPU recipe for 5 minutes
    keras-transformer train --data bundled --model cpu-small --steps 200 --out runs/demo
    keras-transformer train --model cpu-medium --num-layers 3 --norm-first --out runs/deeper
    keras-transformer train --data tfds:wmt14_translate/de-en --model base --vocab-size 37000 \\
        --tokens-per-batch 25000 --steps 100000 --warmup-steps 4000 --learning-rate-scale 1 \\
        --strategy mirrored --out runs/base

The run directory holds config.json (the resolved configs), vocab/, checkpoints/,
logs/ (TensorBoard), log.csv, averaged.weights.h5 and model.keras. Running again
with the same --out resumes from the last checkpoint: same step, learning rate,
optimizer state and position in the (deterministic) input pipeline.
"""

import argparse
import dataclasses
import math
import os
import signal
import sys
import threading
import time

from keras_transformer.cli.common import FROZEN_WEIGHTS
from keras_transformer.cli.common import OneLineErrorParser
from keras_transformer.cli.common import add_config_flags
from keras_transformer.cli.common import as_flags
from keras_transformer.cli.common import check_corpus_files
from keras_transformer.cli.common import choose_run_decoding
from keras_transformer.cli.common import decoding_line
from keras_transformer.cli.common import os_error_line
from keras_transformer.cli.common import quiet_libraries
from keras_transformer.cli.common import read_splits
from keras_transformer.cli.common import run_translators
from keras_transformer.cli.common import says_warnings
from keras_transformer.cli.common import use_compilation_cache
from keras_transformer.cli.common import use_xla_gpu_flags

# TransformerConfig fields that train sets itself: the vocabulary's size and the
# position table's length (from --max-sentence-tokens).
_DERIVED_MODEL_FIELDS = ("vocab_size", "max_positions")


# How messages name the command (the clone's train.py passes its own name).
PROG = "keras-transformer train"


def parse_args(argv, prog=PROG):
    """The parsed flags, the TrainingConfig fields, the TransformerConfig
    overrides, and which flags the command line set explicitly."""
    from keras_transformer.config import TrainingConfig
    from keras_transformer.config import TransformerConfig

    def parser(defaults):
        result = OneLineErrorParser(
            prog=prog, description=__doc__.split("\n")[0],
            argument_default=None if defaults else argparse.SUPPRESS,
        )
        result.add_argument("--out", default="runs/demo", help="the run directory")
        result.add_argument("--tpu", default="", help="TPU name or address (--strategy tpu)")
        add_config_flags(result, TrainingConfig, defaults)
        model = result.add_argument_group(
            "model shape", "override fields of the --model preset (default: the preset's)")
        model.add_argument("--model-config", metavar="FILE.json",
                           help="a whole TransformerConfig as JSON (e.g. the \"model\" of "
                                "a run's config.json) instead of --model; its vocab_size and "
                                "max_positions are replaced by the run's")
        add_config_flags(model, TransformerConfig, defaults=False, skip=_DERIVED_MODEL_FIELDS)
        return result

    args = parser(defaults=True).parse_args(argv)
    explicit = set(vars(parser(defaults=False).parse_args(argv)))
    fields = {field.name: getattr(args, field.name) for field in dataclasses.fields(TrainingConfig)}
    model_overrides = {
        field.name: getattr(args, field.name) for field in dataclasses.fields(TransformerConfig)
        if field.name in explicit and field.name not in _DERIVED_MODEL_FIELDS
    }
    return args, fields, model_overrides, explicit & set(fields)


@says_warnings
def main(argv=None, prog=PROG):
    # The budget counts from here: TensorFlow's import, the vocabulary, graph
    # building and compilation. CPU time counts from the process's start, as
    # `time.process_time()` and log.csv's cpu_seconds do.
    start = {"wall": time.monotonic(), "cpu": 0.0}
    # Right for decoding only (cli/common.start_decoding): oneDNN would go on
    # multiplying by the weights as first reordered while training changes them.
    os.environ.pop(FROZEN_WEIGHTS, None)
    argv = sys.argv[1:] if argv is None else argv
    if "--verbose" not in argv:  # before parse_args imports TensorFlow
        quiet_libraries()
    args, fields, model_overrides, explicit = parse_args(argv, prog)
    use_compilation_cache(args.compilation_cache)  # read when TensorFlow starts
    use_xla_gpu_flags()
    import tensorflow as tf

    from keras_transformer.durable import full_disk_error
    from keras_transformer.training import StoppedBySignal

    # SIGTERM outside training (while compiling, say) as Ctrl-C: a sentence, and
    # the run's lock released. While it trains, training.StopOnSignal takes both.
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        previous = signal.signal(signal.SIGTERM, StoppedBySignal.raise_it)
    try:
        return run(args, fields, model_overrides, explicit, start, prog)
    except (ValueError, FileNotFoundError) as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stopped:  # a sentence, not TensorFlow's stack
        print(file=sys.stderr)
        return stopped_by(getattr(stopped, "signal", signal.SIGINT), args.out, prog)
    except (OSError, tf.errors.ResourceExhaustedError) as error:
        # A full disk, say, under our writes or TensorFlow's (TensorBoard's
        # events): what failed, and where the run resumes.
        if isinstance(error, tf.errors.ResourceExhaustedError):
            error = full_disk_error(error)
            if error is None:  # out of memory
                raise
        print(f"{prog}: {os_error_line(error)}\n{prog}: stopped. {where_it_resumes(args.out)}",
              file=sys.stderr)
        return 1
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def stopped_by(signal_number, out, prog, step=None):
    """Says what the run stopped by `signal_number` (Ctrl-C, SIGTERM) left: where
    the same command resumes it (`step`: where it stopped, if it wrote a checkpoint
    there). Returns the exit status a shell reports for that signal, 128 + its
    number."""
    print(f"{prog}: stopped. {where_it_resumes(out, step)}", file=sys.stderr)
    from keras_transformer import runs

    if runs.Run(out).checkpoints.list():
        print(f"{prog}: to translate with what it learned so far: keras-transformer export "
              f"--run {out} --weights checkpoints --out EXPORT (it chooses the decoding on "
              "the dev pairs), or translate and evaluate with --run and --weights checkpoints",
              file=sys.stderr)
    return 128 + signal_number


def where_it_resumes(out, step=None):
    """Where the same command resumes the run in `out`, in a sentence: from
    `step` where its last checkpoint is there (where it stopped), else from its
    last checkpoint, or anew."""
    from keras_transformer import runs

    saved = runs.Run(out).checkpoints.list()
    if not saved:
        return f"No checkpoint was written; the same command starts {out} again."
    if saved[-1][0] == step:
        return f"The same command resumes {out} from step {step}, where it stopped."
    return f"The same command resumes {out} from its last checkpoint, step {saved[-1][0]}."


def run(args, fields, model_overrides, explicit, start, prog=PROG):
    # Heavy imports after argument parsing, so that --help is instant.
    import keras

    from keras_transformer import budget
    from keras_transformer import distributed
    from keras_transformer import run_configs
    from keras_transformer import runs
    from keras_transformer import training

    account = budget.TimeAccount(start["wall"])
    run_dir = runs.Run(args.out)
    # === Config: flags, or the saved config of the run being resumed; the device ===
    config, model_config, saved, strategy, device = configure(args, fields, model_overrides,
                                                              explicit)
    account.mark("start-up")
    # On a multi-worker run every worker computes, only the chief writes, and --out
    # must be on a filesystem all workers share (they read its vocab and checkpoints).
    chief = distributed.is_chief(strategy)

    # === Data, read (and checked, the test pairs too) before any step is timed, not
    # once training has ended ===
    splits = load_splits(config)
    train_pairs, dev_pairs, test_pairs = (splits[name] for name in ("train", "dev", "test"))
    account.mark("vocabulary and batches")
    if chief:  # one trainer per run directory, once the flags and data are checked
        run_dir.lock()
    # === A budget on a CPU: the vocabulary and batches that this CPU's speed affords ===
    if (config.time_budget and saved is None and device.kind == "cpu" and not config.init_from
            and not {"vocab_size", "tokens_per_batch"} & explicit):
        config, model_config, recipe_line = choose_recipe(
            config, model_config,
            keep_dropout="dropout_rate" in model_overrides or args.model_config is not None,
            keep_learning_rate="learning_rate_scale" in explicit)
        print(recipe_line, flush=True)
        account.mark("timing the recipes")
    # After the recipes' timed steps, so that the run's model starts as it would without.
    keras.utils.set_random_seed(config.seed)

    # === The shared vocabulary ===
    try:
        tokenizer = run_dir.load_vocabulary(  # the other workers wait for the chief's
            train_pairs, config, chief, lambda: distributed.same_on_all_workers(strategy, 0))
    except ValueError as error:  # too small a --vocab-size for the corpus's characters
        raise ValueError(as_flags(error, ["vocab_size"], ("SubwordTokenizer.train",))) from None
    model_config = dataclasses.replace(model_config, vocab_size=tokenizer.vocab_size)
    run_configs.check_same_model(args.out, saved, model_config)
    if chief and saved is None:
        run_dir.write_config(model_config, config)

    # === Model, at the last checkpoint of a resumed run, and batches ===
    model, schedule, step = build_model(run_dir, model_config, config, strategy)
    train_batches, dev_batches = make_batches(config, tokenizer, train_pairs, dev_pairs, strategy)
    account.mark("vocabulary and batches")
    # === XLA: the steps for every batch shape compiled side by side, before the first ===
    shapes_to_compile = compile_steps(model, train_batches, dev_batches, config)
    if config.jit_compile == "on":
        account.mark("compiling")

    # === Time budget: time the first steps, then plan checkpoints and warm-up; a
    # resumed run's counts what the run spent before ===
    clock = budget.TrainingClock(
        config.time_budget * 60 or None, config.time_budget_clock,
        start=start[config.time_budget_clock], wall_start=start["wall"],
        spent=run_dir.checkpoints.spent(step) if step else None)
    max_steps = config.steps if "steps" in explicit or not config.time_budget else None
    if step and config.time_budget:
        max_steps = resumed_budget(clock, config, step, max_steps)
    if config.time_budget and not step and budget.worth_planning(max_steps):
        config, step = plan_budget(model, schedule, train_batches, clock, config, explicit,
                                   max_steps)
        if chief:
            run_dir.write_config(model_config, config)
        account.mark("timing steps")

    # === Fit: an epoch is a checkpoint interval ===
    callbacks = [*training.run_callbacks(run_dir, config, clock, chief, tokenizer, dev_pairs,
                                         shapes_to_compile, max_steps),
                 account]
    losses, step = fit(model, train_batches, dev_batches, step, max_steps, config, callbacks, clock)
    if not ended_well(losses, callbacks, account, run_dir, prog):
        return 1
    stopped = next(callback.stopped for callback in callbacks
                   if isinstance(callback, training.StopOnSignal))
    if stopped:  # Ctrl-C or SIGTERM
        return stopped_by(stopped, args.out, prog, step)
    if not chief:
        return 0
    if config.time_budget:  # the steps it took
        run_dir.write_config(model_config, dataclasses.replace(config, steps=step))

    # === Average the last checkpoints and choose alpha (Sec. 6.1) and n-gram blocking
    # on dev pairs, save,
    # and translate test sentences ===
    averaged = save(model, run_dir, config, step, clock, account)
    translators = run_translators(averaged, tokenizer)
    decoding = choose_decoding(translators, dev_pairs, run_dir, config, account)
    print(account.line(), flush=True)
    if config.test_sentences:
        adjacent = decoding.pop("block_adjacent_repeats", False)
        print_test_bleu(translators[adjacent], test_pairs, config, decoding)
    return 0


def configure(args, fields, model_overrides, explicit):
    """`(config, model_config, saved, strategy, device)`: the configs
    (`resolve_configs`), with the "auto" settings resolved for the strategy's
    device (`hardware.detect`); `saved` is the resumed run's config.json or None.
    Sets the precision."""
    from keras_transformer import distributed
    from keras_transformer import hardware
    from keras_transformer import run_configs
    from keras_transformer import training

    try:
        config, model_config, saved = run_configs.resolve_configs(
            args.out, fields, explicit, model_overrides, args.model_config)
    except ValueError as error:
        raise ValueError(config_error(error, args.model_config is None)) from None
    check_corpus_files(config.data, used_splits(config))
    try:  # "auto" with a TF_CONFIG of several tasks; "multi_worker" was refused above
        config.check_workers(distributed.spans_workers(config.strategy))
    except ValueError as error:
        raise ValueError(config_error(error, model_flags=False)) from None
    # The strategy first: a multi-worker one configures collectives, which must
    # happen before TensorFlow runs anything.
    strategy = distributed.make_strategy(config.strategy, tpu=args.tpu)
    # "auto" settings fit the device: XLA, bfloat16 and few batch shapes on accelerators;
    # on a CPU, bfloat16 where its measured product pays (measured only where used,
    # about a second), and below, the recipe whose timed steps fit the budget.
    device = hardware.detect(strategy, measure_matmuls=hardware.uses_measured_matmuls(config))
    config, device_line = hardware.resolve(config, device)
    print(device_line, flush=True)
    if saved is None:
        print_paper_settings(config, fields, model_config.d_model)
    training.set_precision(config.precision)
    return config, model_config, saved, strategy, device


def config_error(error, model_flags):
    """A `TrainingConfig` check's message (or a `TransformerConfig` one's, where
    the model's fields are the flags', `model_flags`: not a --model-config file's)
    in the flags' words: "--steps must be >= 1. Received: --steps=-5"."""
    from keras_transformer.config import TrainingConfig
    from keras_transformer.config import TransformerConfig

    message = str(error)
    if message.startswith("TrainingConfig: "):
        return as_flags(error, [field.name for field in dataclasses.fields(TrainingConfig)],
                        ("TrainingConfig",))
    if message.startswith("TransformerConfig: ") and model_flags:
        return as_flags(error, [field.name for field in dataclasses.fields(TransformerConfig)
                                if field.name not in _DERIVED_MODEL_FIELDS],
                        ("TransformerConfig",))
    return message


def print_paper_settings(config, fields, d_model):
    """Says which of the paper's settings (`config.PAPER_WIDTH_SETTINGS`) a new run
    of a model of its width took in place of train's defaults (`fields`;
    `TrainingConfig.for_model`)."""
    from keras_transformer.config import PAPER_WIDTH_SETTINGS

    taken = [name for name in PAPER_WIDTH_SETTINGS if getattr(config, name) != fields[name]]
    if not taken:
        return
    what = " and ".join(_SETTING_WORDS[name].format(getattr(config, name)) for name in taken)
    flags = " and ".join("--" + name.replace("_", "-") for name in taken)
    print(f"{what[0].upper()}{what[1:]}: the paper's for a model of d_model {d_model} "
          f"({flags} {'sets another' if len(taken) == 1 else 'set others'}).", flush=True)


_SETTING_WORDS = {"warmup_steps": "warm-up {} steps",
                  "checkpoint_every": "a checkpoint and dev pass every {} steps"}


def used_splits(config):
    """The splits of `config.data` that a run reads: train and dev, and test where
    it scores test pairs (`config.test_sentences`)."""
    return ("train", "dev", "test") if config.test_sentences else ("train", "dev")


def load_splits(config):
    """`{"train", "dev", "test"}`: the pairs of each split of `config.data` ("test"
    None without `config.test_sentences`): a corpus's own splits, or those held
    out of files without '{split}' (`data.hold_out`, with `config.seed`: the same
    on resuming), which it says."""
    splits, left_out = read_splits(config.data, used_splits(config), config.seed,
                                   config.source_language, config.target_language)
    if left_out is not None:
        held = int(splits["dev"].cardinality())
        print(f"Held out {held} dev and {held} test pairs of --data {config.data!r} (seed "
              f"{config.seed}); left out {left_out} training pairs whose source is one of "
              "theirs.", flush=True)
    return {"test": None, **splits}


def build_model(run_dir, model_config, config, strategy):
    """`(model, schedule, step)`: the model compiled with the paper's recipe, at
    the last checkpoint of `run_dir` (step 0 without one: fresh, or with the
    weights of `--init-from`), and its optimizer's schedule."""
    import keras_transformer as kt
    from keras_transformer import distributed
    from keras_transformer import training

    checkpoint_dir = run_dir.checkpoints.directory
    with strategy.scope():
        model = kt.build_transformer(model_config)
        schedule = training.compile_for_training(
            model, model_config.label_smoothing, config.warmup_steps, config.learning_rate_scale,
            config.jit_compile == "on", config.accumulate_steps)
        step = training.restore_latest_checkpoint(model, checkpoint_dir, config.init_from)
    distributed.require_same_on_all_workers(
        strategy, step, f"the checkpoints in {checkpoint_dir}: this worker resumes at {step}")
    if step:
        print(f"Resuming {run_dir.directory} at step {step}.", flush=True)
    return model, schedule, step


def make_batches(config, tokenizer, train_pairs, dev_pairs, strategy):
    """`(train_batches, dev_batches)`: the training batches, each epoch planned
    from the seed so that a resumed run starts at its step, and the dev batches
    in their lengths, counted. The pairs longer than --max-sentence-tokens are left
    out of both and said; where that is every dev pair, the dev batches are None
    (no dev loss)."""
    from keras_transformer import data
    from keras_transformer.data.batching import with_known_length

    batch_args = dict(tokenizer=tokenizer, tokens_per_batch=config.tokens_per_batch,
                      max_sentence_tokens=config.max_sentence_tokens,
                      num_replicas=strategy.num_replicas_in_sync)
    train_batches = data.TrainingBatches(train_pairs, seed=config.seed,
                                         num_buckets=config.length_buckets or None,
                                         unpunctuated_share=config.unpunctuated_share,
                                         clause_share=config.clause_share,
                                         **batch_args)
    shapes = train_batches.shapes
    print(f"Batches in {len(shapes)} shapes (rows x length): "
          f"{', '.join(f'{rows}x{length}' for rows, length, _ in shapes)}; padding "
          f"{train_batches.padding['source']:.1%} of source and "
          f"{train_batches.padding['target']:.1%} of target tokens.", flush=True)
    if train_batches.clause_pairs:
        print(f"Added {train_batches.clause_pairs} aligned clauses of training pairs as pairs "
              f"of their own (--clause-share {config.clause_share:g}).", flush=True)
    if train_batches.pairs_too_long:
        count = train_batches.pairs_too_long
        print(f"Left out {count} training pair{'s' if count > 1 else ''} longer than "
              f"{config.max_sentence_tokens} tokens (--max-sentence-tokens).", flush=True)
    # Deterministic and full-size batches, so workers agree on each one and no
    # replica gets an empty share.
    dev_stats = data.BatchStats()
    dev_batches = data.make_batches(dev_pairs, shuffle=False, deterministic=True,
                                    static_batch_size=True,
                                    bucket_boundaries=train_batches.bucket_boundaries,
                                    stats=dev_stats, **batch_args)
    # Counted in one pass (as fit would count them), which counts the pairs too.
    dev_batches = with_known_length(dev_batches)
    counts = dev_stats.result()
    if counts["pairs_read"] and not counts["pairs_batched"]:
        # Keras would warn "Your input ran out of data" at each dev pass.
        print(f"Left out all {counts['pairs_read']} dev pairs: each is longer than "
              f"{config.max_sentence_tokens} tokens (--max-sentence-tokens), so this run "
              "measures no dev loss; split the dev file's lines into sentences, or raise "
              "--max-sentence-tokens.", flush=True)
        dev_batches = None
    elif counts["pairs_too_long"]:
        print(f"Left out {counts['pairs_too_long']} of the {counts['pairs_read']} dev pairs "
              f"from the dev loss: longer than {config.max_sentence_tokens} tokens "
              "(--max-sentence-tokens).", flush=True)
    return train_batches, dev_batches


def compile_steps(model, train_batches, dev_batches, config):
    """Under XLA on one replica, compiles the training step for every batch shape and
    the dev step for each of its shapes before the first step, side by side
    (`training.compile_ahead`): on a GPU each is a compilation of tens of seconds.
    Returns the batch shapes whose step still compiles when it first comes (for the
    progress line): none then, all of them on several replicas, whose steps are
    not run side by side."""
    from keras_transformer import hardware
    from keras_transformer import training

    if config.jit_compile != "on":
        return 0
    start = time.monotonic()
    if config.compilation_cache:  # the names that the cache finds programs by
        training.align_function_names()
    shapes = train_batches.shapes
    if model.distribute_strategy.num_replicas_in_sync > 1:
        return len(shapes)
    dev = [] if dev_batches is None else training.one_batch_per_shape(dev_batches)
    workers = min(len(shapes) + len(dev), hardware.available_cores())
    print(f"Compiling the training step for {_counted(len(shapes), 'batch shape')} and the dev "
          f"step for {_counted(len(dev), 'shape')}, {workers} at a time (XLA, once a run"
          f"{'; kept in --compilation-cache' if config.compilation_cache else ''})...",
          flush=True)
    traced = training.compile_ahead(
        model, [train_batches.example_batch(shape, config.accumulate_steps) for shape in shapes],
        dev, workers)
    print(f"Compiled in {time.monotonic() - start:.0f} s ({traced:.0f} s of it building and "
          f"tracing the steps).", flush=True)
    return 0


def _counted(number, noun):
    return f"{number:g} {noun}{'' if number == 1 else 's'}"


def resumed_budget(clock, config, step, max_steps):
    """Says what is left of a resumed run's budget, which counts the whole run;
    returns the cap on its steps: `step` once the budget is spent."""
    from keras_transformer import budget

    spent = (f"{budget.minutes(clock.elapsed())} of its {config.time_budget:g}-minute budget "
             f"({config.time_budget_clock} clock)")
    if clock.over_budget():
        print(f"Its budget was spent by step {step}, {spent}: nothing left to train "
              "(a larger --time-budget trains on; another --out starts a new run).", flush=True)
        return step
    print(f"{spent[0].upper()}{spent[1:]} spent by step {step}; training on for the rest.",
          flush=True)
    return max_steps


def plan_budget(model, schedule, train_batches, clock, config, explicit, max_steps):
    """`(config, step)`: times the first steps of a budgeted run and plans the
    rest (`budget.plan_run`)."""
    from keras_transformer import budget

    print(f"Timing the first {budget.CALIBRATION_STEPS} steps to plan the run's "
          f"{_counted(config.time_budget, 'minute')} ({config.time_budget_clock} clock)...",
          flush=True)
    config, step = budget.plan_run(model, schedule, train_batches.dataset(0), clock, config,
                                   explicit, max_steps)
    print(f"Planned about {config.steps} steps: a checkpoint every "
          f"{config.checkpoint_every}, warm-up {config.warmup_steps} to learning rate "
          f"{schedule.peak_learning_rate():.2e}.", flush=True)
    return config, step


def fit(model, train_batches, dev_batches, step, max_steps, config, callbacks, clock):
    """`(losses, step)`: trains from `step` (`training.fit_by_checkpoints`) until
    `max_steps`, or with a budget until the clock says stop."""
    from keras_transformer import training

    return training.fit_by_checkpoints(
        model, lambda step: train_batches.dataset(step, config.accumulate_steps), dev_batches,
        step, max_steps, config.checkpoint_every, config.steps, callbacks,
        stop=clock.over_budget, budgeted=bool(config.time_budget),
        accumulate_steps=config.accumulate_steps)


def ended_well(losses, callbacks, account, run_dir, prog):
    """Accounts for the steps and says whether training ended well; a diverged
    run (a NaN loss) says where its last good checkpoint is."""
    from keras_transformer import training

    account.mark("steps")
    account.set_apart("checkpoints", next(callback.seconds for callback in callbacks
                                          if isinstance(callback, training.StepCheckpoint)),
                      "steps")
    if not all(map(math.isfinite, losses)):
        print(f"{prog}: the loss diverged (NaN); the last good checkpoint is in "
              f"{run_dir.checkpoints.directory}", file=sys.stderr)
        return False
    return True


def save(model, run_dir, config, step, clock, account):
    """Writes the final model and the average of the last `config.average_last`
    checkpoints (Sec. 6.1); returns a model that holds the average."""
    from keras_transformer import training

    run_dir.save_final_model(model)
    last = run_dir.checkpoints.last(config.average_last)
    averaged = training.save_average(model, last, run_dir.averaged_weights)
    account.mark("averaging and saving")
    print(f"Trained {step} step{'s' * (step != 1)} in {clock.elapsed() / 60:.1f} minutes "
          f"({config.time_budget_clock} clock); "
          + (f"averaged the last {len(last)} checkpoints into " if len(last) > 1
             else "one checkpoint to average: its weights are ")
          + str(run_dir.averaged_weights), flush=True)
    return averaged


def choose_decoding(translators, dev_pairs, run_dir, config, account):
    """Chooses the decoding of the run's translations (`translators`, the
    averaged weights', `run_translators`) on the first `config.alpha_sentences`
    dev pairs (`choose_run_decoding`); records it in the run
    (`runs.Run.write_decoding`), says so, and returns it (`{}`: the paper's,
    without dev pairs to choose on)."""
    settings, scores, sentences = choose_run_decoding(translators, dev_pairs,
                                                      config.alpha_sentences)
    if not sentences:  # --alpha-sentences 0
        run_dir.write_decoding(None, {}, 0)
        return {}
    run_dir.write_decoding(settings, scores, sentences)
    account.mark("choosing decoding")
    print(decoding_line(settings, scores, sentences), flush=True)
    return settings


def print_test_bleu(translator, test_pairs, config, decoding):
    """Translates the first `config.test_sentences` of `test_pairs` with
    `translator` (the averaged weights', beam search with the request settings
    `decoding`), prints three of them and their sacreBLEU."""
    from keras_transformer import evaluation

    result = evaluation.evaluate(translator, test_pairs, limit=config.test_sentences,
                                 named="test sentence", **decoding)
    for pair, hypothesis in zip(test_pairs.take(3).as_numpy_iterator(), result["hypotheses"]):
        print(f"\nsource:      {pair['source'].decode()}\ntranslation: {hypothesis}\n"
              f"reference:   {pair['target'].decode()}")
    print(f"\nTest BLEU on {result['sentences']} sentences: {result['bleu']:.2f} "
          f"({result['signature']})")


def choose_recipe(config, model_config, keep_dropout=False, keep_learning_rate=False):
    """`(config, model_config, line)`: the configs with the vocabulary size, batch
    tokens, (unless `keep_dropout`) dropout and (unless `keep_learning_rate`)
    learning-rate scale of the recipe that this CPU affords in the budget
    (`recipes.choose`), from a step of each recipe it tries, timed here on the
    budget's clock (`training.time_training_step`: on the CPU clock, a step
    costs its CPU-seconds on all cores) with the dropout the run would train
    with, and a line saying what was chosen and why."""
    from keras_transformer import budget
    from keras_transformer import recipes
    from keras_transformer import training

    print(f"Timing training steps to choose the recipe for the {config.time_budget:g}-minute "
          "budget...", flush=True)

    def model_for(recipe):  # the model this run would train with `recipe`
        return dataclasses.replace(
            model_config, vocab_size=recipe.vocab_size,
            dropout_rate=model_config.dropout_rate if keep_dropout else recipe.dropout_rate)

    def step_seconds(recipe):
        return training.time_training_step(
            model_for(recipe), recipe.tokens_per_batch, jit_compile=config.jit_compile == "on",
            clock=budget.CLOCKS[config.time_budget_clock])

    recipe, estimates = recipes.choose(config.time_budget * 60, step_seconds)
    config = dataclasses.replace(config, vocab_size=recipe.vocab_size,
                                 tokens_per_batch=recipe.tokens_per_batch)
    if not keep_learning_rate:
        config = dataclasses.replace(config, learning_rate_scale=recipe.learning_rate_scale)
    model_config = model_for(recipe)
    unit = "CPU-seconds" if config.time_budget_clock == "cpu" else "s"
    passed = "".join(f"; {other.describe()} would get about {updates} ({seconds:.3f} "
                     f"{unit} a step), fewer than the {other.min_updates} it needs"
                     for other, updates, seconds in estimates[:-1])
    _, updates, seconds = estimates[-1]
    return config, model_config, (
        f"Recipe for {_counted(config.time_budget, 'minute')}"
        f"{' of CPU time' if unit != 's' else ''} on "
        f"this CPU: {recipe.describe()}, about {updates} updates ({seconds:.3f} {unit} a "
        f"step){passed}.")
