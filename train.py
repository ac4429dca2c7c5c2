"""Trains a Transformer with the paper's recipe (Sec. 5) and `model.fit`.

    python train.py                                   # tiny model, bundled corpus, minutes on a CPU
    python train.py --data bundled --model tiny --steps 200 --out runs/demo
    python train.py --data tfds:wmt14_translate/de-en --model base --vocab-size 37000 \
        --tokens-per-batch 25000 --steps 100000 --warmup-steps 4000 --learning-rate-scale 1 \
        --strategy mirrored --out runs/base

The run directory holds config.json (the resolved configs), vocab/, checkpoints/,
logs/ (TensorBoard), averaged.weights.h5 and model.keras. Running again with the
same --out resumes from the last checkpoint: same step, learning rate, optimizer
state and position in the (deterministic) input pipeline.
"""

import argparse
import dataclasses
import json
import math
import os
import sys
import warnings

from cli_common import OneLineErrorParser


def parse_args(argv):
    """The run directory, the TPU name, the TrainingConfig fields, and which of
    those fields the command line set explicitly."""
    from keras_transformer.config import TrainingConfig

    def parser(defaults):
        result = OneLineErrorParser(
            prog="train.py", description=__doc__.split("\n")[0],
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
            argument_default=None if defaults else argparse.SUPPRESS,
        )
        result.add_argument("--out", default="runs/demo", help="the run directory")
        result.add_argument("--tpu", default="", help="TPU name or address (--strategy tpu)")
        for field in dataclasses.fields(TrainingConfig):
            flag = "--" + field.name.replace("_", "-")
            default = field.default if defaults else argparse.SUPPRESS
            if field.type is bool:
                result.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
            else:
                kind = field.type if field.type in (int, float) else str
                result.add_argument(flag, type=kind, default=default)
        return result

    args = parser(defaults=True).parse_args(argv)
    explicit = set(vars(parser(defaults=False).parse_args(argv))) - {"out", "tpu"}
    fields = {field.name: getattr(args, field.name) for field in dataclasses.fields(TrainingConfig)}
    return args, fields, explicit


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args, fields, explicit = parse_args(argv)
    try:
        return run(args, fields, explicit)
    except (ValueError, FileNotFoundError) as error:
        print(f"train.py: {error}", file=sys.stderr)
        return 2


def run(args, fields, explicit):
    # Heavy imports after argument parsing, so that --help is instant.
    import keras

    import keras_transformer as kt
    from keras_transformer import data as kt_data
    from keras_transformer import training
    from keras_transformer.config import TrainingConfig

    # === Config: flags, or the saved config of the run being resumed ===
    config_path = os.path.join(args.out, "config.json")
    if os.path.exists(config_path):
        with open(config_path) as f:
            saved = json.load(f)
        config = TrainingConfig.from_dict(saved["training"])
        changed = {n: fields[n] for n in explicit if n != "steps" and fields[n] != getattr(config, n)}
        if changed:
            raise ValueError(
                f"{args.out} holds a run with other settings ({changed} differ from "
                f"{config_path}); pass a new --out, or only --steps to train it longer"
            )
        config = dataclasses.replace(config, steps=fields["steps"] if "steps" in explicit
                                     else config.steps)
    else:
        config = TrainingConfig(**fields)
    # The strategy first: a multi-worker one configures collectives, which must
    # happen before TensorFlow runs anything.
    strategy = training.make_strategy(config.strategy, tpu=args.tpu)
    keras.utils.set_random_seed(config.seed)
    training.set_precision(config.precision)
    # On a multi-worker run every worker computes, only the chief writes, and --out
    # must be on a filesystem all workers share (they read its vocab and checkpoints).
    chief = training.is_chief(strategy)

    # === Data ===
    source = _data_source(config.data)
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
    model_config = kt.TransformerConfig.preset(
        config.model, vocab_size=tokenizer.vocab_size, max_length=max(config.max_length, 256))
    if chief and not os.path.exists(config_path):
        os.makedirs(args.out, exist_ok=True)
        with open(config_path, "w") as f:
            json.dump({"model": model_config.to_dict(), "training": config.to_dict()}, f,
                      indent=2, sort_keys=True)
    with strategy.scope():
        model = kt.build_transformer(model_config)
        training.compile_for_training(
            model, model_config.label_smoothing, config.warmup_steps,
            config.learning_rate_scale, config.jit_compile)
        checkpoint_dir = os.path.join(args.out, "checkpoints")
        initial_step = training.restore_latest_checkpoint(model, checkpoint_dir)
    if not training.same_on_all_workers(strategy, initial_step):
        raise ValueError(f"the workers found different checkpoints in {checkpoint_dir} "
                         f"(this one: step {initial_step}); --out must be a directory "
                         "that every worker shares")
    if initial_step:
        print(f"Resuming {args.out} at step {initial_step}.", flush=True)

    # === Batches: deterministic, so a resumed run skips exactly what it has seen ===
    stats = kt_data.BatchStats()
    batch_args = dict(tokenizer=tokenizer, tokens_per_batch=config.tokens_per_batch,
                      max_length=config.max_length,
                      num_replicas=strategy.num_replicas_in_sync)
    train_batches = kt_data.make_batches(
        train_pairs, seed=config.seed, deterministic=True, repeat=True, stats=stats,
        **batch_args,
    ).skip(initial_step)
    # Deterministic and full-size batches, so workers agree on each one and no
    # replica gets an empty share.
    dev_batches = kt_data.make_batches(dev_pairs, shuffle=False, deterministic=True,
                                       static_batch_size=True, **batch_args)

    # === Fit: an epoch is checkpoint_every steps ===
    # Keras warns when the (finite) dev set ends each evaluation, which is expected.
    warnings.filterwarnings("ignore", message="Your input ran out of data")
    callbacks = [
        keras.callbacks.TerminateOnNaN(),
        training.StepCheckpoint(checkpoint_dir, keep=config.keep_checkpoints),
        training.LearningRateLogger(),
    ]
    if config.bleu_every and chief:
        dev_subset = list(dev_pairs.take(config.bleu_sentences).as_numpy_iterator())
        callbacks.append(training.BleuEvaluation(
            _translator(model, tokenizer),
            [p["source"].decode() for p in dev_subset],
            [p["target"].decode() for p in dev_subset],
            score=lambda hypotheses, references: _bleu(hypotheses, references)["bleu"],
            every_epochs=config.bleu_every // config.checkpoint_every,
        ))
    if chief:
        callbacks += [
            keras.callbacks.TensorBoard(os.path.join(args.out, "logs")),
            keras.callbacks.CSVLogger(os.path.join(args.out, "log.csv"), append=True),
        ]
    history = model.fit(
        train_batches,
        epochs=config.steps // config.checkpoint_every,
        initial_epoch=initial_step // config.checkpoint_every,
        steps_per_epoch=config.checkpoint_every,
        validation_data=dev_batches,
        callbacks=callbacks,
        shuffle=False,  # the batches come shuffled
        verbose=1 if sys.stdout.isatty() else 2,
    )
    counts = stats.result()
    if counts.get("pairs_too_long"):
        print(f"Dropped {counts['pairs_too_long']} training pairs longer than "
              f"{config.max_length} tokens.")
    losses = history.history.get("loss", [])
    if losses and not all(map(math.isfinite, losses)):
        print(f"train.py: the loss diverged (NaN); the last good checkpoint is in "
              f"{checkpoint_dir}", file=sys.stderr)
        return 1
    if not chief:
        return 0

    # === Average the last checkpoints (Sec. 6.1) and save ===
    checkpoints = [path for _, path in training.list_checkpoints(checkpoint_dir)]
    model.save(os.path.join(args.out, "model.keras"))
    training.average_checkpoints(model, checkpoints[-config.average_last:])
    averaged = kt.build_transformer(model_config)
    averaged.set_weights(model.get_weights())
    averaged.save_weights(os.path.join(args.out, "averaged.weights.h5"))
    print(f"Averaged the last {min(len(checkpoints), config.average_last)} checkpoints into "
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


def _translator(model, tokenizer, beam_size=4):
    from keras_transformer import evaluation
    from keras_transformer.serving import Translator

    translator = Translator(model, tokenizer, beam_size=beam_size)
    return lambda sentences: evaluation.translate_sentences(translator, sentences)


def _bleu(hypotheses, references):
    from keras_transformer import evaluation

    return evaluation.bleu_scores(hypotheses, references)


def _data_source(data):
    """'bundled', 'tfds:...', 'SOURCE_FILE,TARGET_FILE' or one tab-separated file."""
    if data == "bundled" or data.startswith("tfds:"):
        return data
    paths = data.split(",")
    if len(paths) > 2:
        raise ValueError(f"--data takes one tab-separated file or two files "
                         f"'SOURCE,TARGET'. Received: {data!r}")
    return tuple(paths) if len(paths) == 2 else paths[0]


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
