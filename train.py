"""Trains a Transformer with the paper's recipe (Sec. 5) and `model.fit`.

    python train.py --time-budget 5                   # bundled corpus, the CPU recipe for 5 minutes
    python train.py --data bundled --model cpu-small --steps 200 --out runs/demo
    python train.py --model cpu-medium --num-layers 3 --norm-first --out runs/deeper
    python train.py --data tfds:wmt14_translate/de-en --model base --vocab-size 37000 \\
        --tokens-per-batch 25000 --steps 100000 --warmup-steps 4000 --learning-rate-scale 1 \\
        --strategy mirrored --out runs/base

The run directory holds config.json (the resolved configs), vocab/, checkpoints/,
logs/ (TensorBoard), log.csv, averaged.weights.h5 and model.keras. Running again
with the same --out resumes from the last checkpoint: same step, learning rate,
optimizer state and position in the (deterministic) input pipeline.
"""

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import time

from cli_common import OneLineErrorParser
from cli_common import corpus_source
from cli_common import quiet_libraries

# The budget counts from here: imports, the vocabulary, graph building and compilation.
_START = {"wall": time.monotonic(), "cpu": time.process_time()}
# TransformerConfig fields that train.py sets itself: the vocabulary's size and the
# position table's length (from --max-length).
_DERIVED_MODEL_FIELDS = ("vocab_size", "max_length")
# Steps timed before a budgeted run is planned (the first ones compile).
_CALIBRATION_STEPS = 20


def parse_args(argv):
    """The parsed flags, the TrainingConfig fields, the TransformerConfig
    overrides, and which flags the command line set explicitly."""
    from keras_transformer.config import TrainingConfig
    from keras_transformer.config import TransformerConfig

    def add_fields(parser, dataclass, defaults, skip=()):
        helps = _field_docs(dataclass)
        for field in dataclasses.fields(dataclass):
            if field.name in skip:
                continue
            flag = "--" + field.name.replace("_", "-")
            default = field.default if defaults else argparse.SUPPRESS
            if field.type is bool:
                parser.add_argument(flag, action=argparse.BooleanOptionalAction,
                                    default=default, help=helps.get(field.name))
            else:
                kind = {int: int, float: float, "int | None": int}.get(field.type, str)
                parser.add_argument(flag, type=kind, default=default,
                                    help=helps.get(field.name))

    def parser(defaults):
        result = OneLineErrorParser(
            prog="train.py", description=__doc__.split("\n")[0],
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
            argument_default=None if defaults else argparse.SUPPRESS,
        )
        result.add_argument("--out", default="runs/demo", help="the run directory")
        result.add_argument("--tpu", default="", help="TPU name or address (--strategy tpu)")
        add_fields(result, TrainingConfig, defaults)
        model = result.add_argument_group(
            "model shape", "override fields of the --model preset (default: the preset's)")
        model.add_argument("--model-config", metavar="FILE.json",
                           help="a whole TransformerConfig as JSON (e.g. the \"model\" of "
                                "a run's config.json) instead of --model; its vocab_size and "
                                "max_length are replaced by the run's")
        add_fields(model, TransformerConfig, defaults=False, skip=_DERIVED_MODEL_FIELDS)
        return result

    args = parser(defaults=True).parse_args(argv)
    explicit = set(vars(parser(defaults=False).parse_args(argv)))
    fields = {field.name: getattr(args, field.name) for field in dataclasses.fields(TrainingConfig)}
    model_overrides = {
        field.name: getattr(args, field.name) for field in dataclasses.fields(TransformerConfig)
        if field.name in explicit and field.name not in _DERIVED_MODEL_FIELDS
    }
    return args, fields, model_overrides, explicit & set(fields)


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


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--verbose" not in argv:  # before parse_args imports TensorFlow
        quiet_libraries()
    args, fields, model_overrides, explicit = parse_args(argv)
    try:
        return run(args, fields, model_overrides, explicit)
    except (ValueError, FileNotFoundError) as error:
        print(f"train.py: {error}", file=sys.stderr)
        return 2


def run(args, fields, model_overrides, explicit):
    # Heavy imports after argument parsing, so that --help is instant.
    import keras

    import keras_transformer as kt
    from keras_transformer import data as kt_data
    from keras_transformer import training

    # === Config: flags, or the saved config of the run being resumed ===
    config_path = os.path.join(args.out, "config.json")
    saved = None
    if os.path.exists(config_path):
        with open(config_path) as f:
            saved = json.load(f)
    config = _training_config(args.out, fields, explicit, saved)
    model_config = _model_config(args, config, model_overrides, saved, explicit)  # checked before any work
    if config.time_budget and config.strategy == "multi_worker":
        raise ValueError("--time-budget plans a run from this process's own timings; on a "
                         "multi-worker run give --steps instead")
    # The strategy first: a multi-worker one configures collectives, which must
    # happen before TensorFlow runs anything.
    strategy = training.make_strategy(config.strategy, tpu=args.tpu)
    keras.utils.set_random_seed(config.seed)
    training.set_precision(config.precision)
    # On a multi-worker run every worker computes, only the chief writes, and --out
    # must be on a filesystem all workers share (they read its vocab and checkpoints).
    chief = training.is_chief(strategy)

    # === Data ===
    source = corpus_source(config.data)
    languages = dict(source_language=config.source_language,
                     target_language=config.target_language)
    splits = _splits(config.data)
    train_pairs = kt_data.load_parallel(source, splits["train"], **languages)
    dev_pairs = kt_data.load_parallel(source, splits["dev"], **languages)
    vocab_dir = os.path.join(args.out, "vocab")
    if chief and not os.path.exists(vocab_dir):
        print(f"Training a {config.vocab_size}-token shared vocabulary...", flush=True)
        kt_data.SubwordTokenizer.train(
            train_pairs, vocab_size=config.vocab_size, max_sentences=config.vocab_sentences,
            seed=config.seed).save(vocab_dir)
    training.same_on_all_workers(strategy, 0)  # the others wait for the chief's vocab
    if not os.path.exists(vocab_dir):
        raise ValueError(f"{vocab_dir} is missing on this worker: on a multi-worker run, "
                         "--out must be a directory that every worker shares")
    tokenizer = kt_data.SubwordTokenizer.load(vocab_dir)

    # === Model ===
    model_config = dataclasses.replace(model_config, vocab_size=tokenizer.vocab_size)
    if saved is not None and saved["model"] != model_config.to_dict():
        differ = {name: value for name, value in model_config.to_dict().items()
                  if saved["model"].get(name) != value}
        raise ValueError(f"{args.out} holds a model of another shape ({differ} differ from "
                         f"{config_path}); pass a new --out to train this one")
    if chief and saved is None:
        _write_config(config_path, model_config, config)
    with strategy.scope():
        model = kt.build_transformer(model_config)
        # Variables, so that a budgeted run can plan its schedule once it has timed steps.
        warmup, scale = (keras.Variable(value, dtype="float32", trainable=False, name=name)
                         for value, name in ((config.warmup_steps, "warmup_steps"),
                                             (config.learning_rate_scale, "learning_rate_scale")))
        training.compile_for_training(
            model, model_config.label_smoothing, warmup, scale, config.jit_compile)
        checkpoint_dir = os.path.join(args.out, "checkpoints")
        step = training.restore_latest_checkpoint(model, checkpoint_dir)
    if not training.same_on_all_workers(strategy, step):
        raise ValueError(f"the workers found different checkpoints in {checkpoint_dir} "
                         f"(this one: step {step}); --out must be a directory "
                         "that every worker shares")
    if step:
        print(f"Resuming {args.out} at step {step}.", flush=True)

    # === Batches: deterministic, so a resumed run skips exactly what it has seen ===
    stats = kt_data.BatchStats()
    batch_args = dict(tokenizer=tokenizer, tokens_per_batch=config.tokens_per_batch,
                      max_length=config.max_length,
                      num_replicas=strategy.num_replicas_in_sync)

    def train_batches(skip):
        return kt_data.make_batches(train_pairs, seed=config.seed, deterministic=True,
                                    repeat=True, stats=stats, **batch_args).skip(skip)

    # Deterministic and full-size batches, so workers agree on each one and no
    # replica gets an empty share.
    dev_batches = kt_data.make_batches(dev_pairs, shuffle=False, deterministic=True,
                                       static_batch_size=True, **batch_args)

    # === Time budget: time the first steps, then plan checkpoints and warm-up ===
    clock = training.TrainingClock(
        config.time_budget * 60 or None, config.time_budget_clock,
        start=_START[config.time_budget_clock], wall_start=_START["wall"])
    max_steps = config.steps if "steps" in explicit or not config.time_budget else None
    planned_steps = config.steps
    if config.time_budget and not step and (max_steps or sys.maxsize) > 2 * _CALIBRATION_STEPS:
        print(f"Timing the first {_CALIBRATION_STEPS} steps to plan a "
              f"{config.time_budget:g}-minute ({config.time_budget_clock} clock) run...",
              flush=True)
        model.fit(train_batches(0), epochs=1, steps_per_epoch=_CALIBRATION_STEPS,
                  callbacks=[keras.callbacks.TerminateOnNaN(), clock], verbose=0)
        step = _CALIBRATION_STEPS
        plan = training.plan_for_budget(
            step, clock.step_seconds, clock.budget_seconds - clock.elapsed(),
            config.average_last, config.warmup_steps, config.learning_rate_scale, max_steps)
        planned = dict(steps=plan.steps)
        if "checkpoint_every" not in explicit:
            planned.update(checkpoint_every=plan.checkpoint_every)
        if not {"warmup_steps", "learning_rate_scale"} & explicit:
            planned.update(warmup_steps=plan.warmup_steps,
                           learning_rate_scale=plan.learning_rate_scale)
        config = dataclasses.replace(config, **planned)
        warmup.assign(config.warmup_steps)
        scale.assign(config.learning_rate_scale)
        planned_steps = plan.steps
        if chief:
            _write_config(config_path, model_config, config)
        print(f"Planned about {plan.steps} steps: a checkpoint every "
              f"{config.checkpoint_every}, warm-up {config.warmup_steps} to learning rate "
              f"{config.learning_rate_scale * (model_config.d_model * config.warmup_steps) ** -0.5:.2e}.",
              flush=True)

    # === Fit: an epoch is checkpoint_every steps ===
    callbacks = [
        keras.callbacks.TerminateOnNaN(),
        training.StepCheckpoint(checkpoint_dir, keep=config.keep_checkpoints),
        training.LearningRateLogger(),
        clock,
    ]
    every_epochs = max(1, round(config.bleu_every / config.checkpoint_every))
    if config.bleu_every and chief:
        dev_subset = list(dev_pairs.take(config.bleu_sentences).as_numpy_iterator())
        callbacks.append(training.BleuEvaluation(
            _translator(model, tokenizer),
            [p["source"].decode() for p in dev_subset],
            [p["target"].decode() for p in dev_subset],
            score=lambda hypotheses, references: _bleu(hypotheses, references)["bleu"],
            every_epochs=every_epochs,
        ))
    callbacks.append(training.ProgressLine(planned_steps, clock))
    if chief:
        callbacks += [
            keras.callbacks.TensorBoard(os.path.join(args.out, "logs")),
            keras.callbacks.CSVLogger(os.path.join(args.out, "log.csv"), append=True),
        ]
    # A budgeted run measures its dev loss half-way and at its planned end: each pass
    # (and its compilations, under XLA) costs steps.
    planned_epochs = math.ceil(planned_steps / config.checkpoint_every)
    validation_freq = ([max(1, planned_epochs // 2), planned_epochs] if config.time_budget
                       else 1)
    # Full checkpoint intervals, then the steps left over; a budgeted run goes on
    # until the first checkpoint past its budget (or --steps).
    last_step = max_steps if max_steps is not None else sys.maxsize
    losses = []
    for epochs, length in _segments(step, last_step, config.checkpoint_every, planned_steps):
        history = model.fit(
            train_batches(step),
            epochs=step // config.checkpoint_every + epochs,
            initial_epoch=step // config.checkpoint_every,
            steps_per_epoch=length,
            validation_data=dev_batches,
            validation_freq=validation_freq,
            callbacks=callbacks,
            shuffle=False,  # the batches come shuffled
            verbose=0,
        )
        losses += history.history.get("loss", [])
        step = int(model.optimizer.iterations.numpy())
        if model.stop_training or clock.over_budget():
            break
    counts = stats.result()
    if counts.get("pairs_too_long"):
        print(f"Dropped {counts['pairs_too_long']} training pairs longer than "
              f"{config.max_length} tokens.")
    if losses and not all(map(math.isfinite, losses)):
        print(f"train.py: the loss diverged (NaN); the last good checkpoint is in "
              f"{checkpoint_dir}", file=sys.stderr)
        return 1
    if not chief:
        return 0
    if config.time_budget:
        _write_config(config_path, model_config, dataclasses.replace(config, steps=step))

    # === Average the last checkpoints (Sec. 6.1) and save ===
    checkpoints = [path for _, path in training.list_checkpoints(checkpoint_dir)]
    model.save(os.path.join(args.out, "model.keras"))
    training.average_checkpoints(model, checkpoints[-config.average_last:])
    averaged = kt.build_transformer(model_config)
    averaged.set_weights(model.get_weights())
    averaged.save_weights(os.path.join(args.out, "averaged.weights.h5"))
    print(f"Trained {step} steps in {clock.elapsed() / 60:.1f} minutes "
          f"({config.time_budget_clock} clock); averaged the last "
          f"{min(len(checkpoints), config.average_last)} checkpoints into "
          f"{os.path.join(args.out, 'averaged.weights.h5')}")

    # === Samples and test BLEU with the averaged weights, beam search ===
    if not config.test_sentences:
        return 0
    test_pairs = kt_data.load_parallel(source, splits["test"], **languages)
    test = list(test_pairs.take(config.test_sentences).as_numpy_iterator())
    sources = [p["source"].decode() for p in test]
    references = [p["target"].decode() for p in test]
    hypotheses = _translator(averaged, tokenizer)(sources)
    for source_text, hypothesis, reference in list(zip(sources, hypotheses, references))[:3]:
        print(f"\nsource:      {source_text}\ntranslation: {hypothesis}\nreference:   {reference}")
    scores = _bleu(hypotheses, references)
    print(f"\nTest BLEU on {len(sources)} sentences: {scores['bleu']:.2f} ({scores['signature']})")
    return 0


def _training_config(out, fields, explicit, saved):
    """The TrainingConfig of the flags, or of the run being resumed: then only the
    flags that say how long to train may differ from it."""
    from keras_transformer.config import TrainingConfig

    if saved is None:
        return TrainingConfig(**fields)
    config = TrainingConfig.from_dict(saved["training"])
    how_long = ("steps", "time_budget", "time_budget_clock")
    changed = {n: fields[n] for n in explicit - set(how_long) if fields[n] != getattr(config, n)}
    if changed:
        raise ValueError(
            f"{out} holds a run with other settings ({changed} differ from "
            f"{os.path.join(out, 'config.json')}); pass a new --out, or only --steps or "
            "--time-budget to train it longer"
        )
    return dataclasses.replace(config, **{n: fields[n] for n in explicit & set(how_long)})


def _model_config(args, config, overrides, saved, explicit):
    """The TransformerConfig: the preset (or --model-config), then the overrides;
    its vocab_size is a placeholder until the vocabulary exists. A resumed run
    keeps its own, and refuses other shape flags (checked once the vocabulary is
    loaded)."""
    from keras_transformer.config import TransformerConfig

    derived = dict(vocab_size=config.vocab_size, max_length=max(config.max_length, 256))
    if args.model_config is not None:
        if "model" in explicit:
            raise ValueError("--model-config and --model both name a model; give one")
        try:
            with open(args.model_config) as f:
                values = json.load(f)
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"--model-config {args.model_config}: {error}") from None
        if not isinstance(values, dict):
            raise ValueError(f"--model-config {args.model_config} must hold a JSON object "
                             "of TransformerConfig fields")
        values.update(derived, **overrides)
        return TransformerConfig.from_dict(values)
    if saved is not None and not overrides:
        return TransformerConfig.from_dict(dict(saved["model"], vocab_size=config.vocab_size))
    preset = config.model_preset(cores=len(os.sched_getaffinity(0)))
    return TransformerConfig.preset(preset, **derived, **overrides)


def _write_config(path, model_config, config):
    """config.json: the resolved model and training configs, written whole or not at all."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w") as f:
        json.dump({"model": model_config.to_dict(), "training": config.to_dict()}, f,
                  indent=2, sort_keys=True)
    os.replace(temporary, path)


def _segments(step, last_step, checkpoint_every, planned_steps):
    """`(epochs, steps_per_epoch)` fits from `step` to `last_step`: the steps up to
    the next multiple of `checkpoint_every`, whole checkpoint intervals, then the
    steps left over as one shorter epoch. With no `last_step` (sys.maxsize: a
    budget decides), intervals up to `planned_steps`, then on until stopped."""
    if last_step <= step:
        return []
    segments = []
    head = min(-step % checkpoint_every, last_step - step)
    if head:
        segments.append((1, head))
        step += head
    if last_step == sys.maxsize:
        planned = max(1, math.ceil((planned_steps - step) / checkpoint_every))
        return segments + [(planned, checkpoint_every),
                           (sys.maxsize // checkpoint_every - step, checkpoint_every)]
    whole, rest = divmod(last_step - step, checkpoint_every)
    return segments + [(epochs, length) for epochs, length in
                       ((whole, checkpoint_every), (1, rest)) if epochs and length]


def _translator(model, tokenizer, beam_size=4):
    from keras_transformer import evaluation
    from keras_transformer.serving import Translator

    translator = Translator(model, tokenizer, beam_size=beam_size)
    return lambda sentences: evaluation.translate_sentences(translator, sentences)


def _bleu(hypotheses, references):
    from keras_transformer import evaluation

    return evaluation.bleu_scores(hypotheses, references)


def _splits(data):
    if data.startswith("tfds:"):
        return {"train": "train", "dev": "validation", "test": "test"}
    if data != "bundled" and "{split}" not in data:
        raise ValueError(
            f"--data {data!r}: file paths need a '{{split}}' placeholder so that train, dev "
            "and test files can be found, e.g. 'corpus/{split}.en,corpus/{split}.es'"
        )
    return {"train": "train", "dev": "dev", "test": "test"}


if __name__ == "__main__":
    sys.exit(main())
