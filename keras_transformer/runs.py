"""The run directory that `train.py` writes and everything else reads.

    RUN/config.json           {"model": TransformerConfig, "training": TrainingConfig}
    RUN/vocab/                the shared subword vocabulary (`SubwordTokenizer.save`)
    RUN/checkpoints/          ckpt-<step>.weights.h5 (model and optimizer) and .rng.npy
    RUN/logs/, RUN/log.csv    TensorBoard and CSV logs, one row per checkpoint
    RUN/averaged.weights.h5   the average of the last checkpoints (Sec. 6.1)
    RUN/model.keras           the final model, compiled, with its optimizer

Here are the file names, loading a run (`load_run`), writing its config whole or
not at all (`write_config`), and what a run started again with the same
directory may change (`resolve_configs`: only how long it trains).

Runs last days, so every file of one is written to survive a kill at any
moment, and one trainer at a time writes a run (`durable.py`).
"""

import dataclasses
import hashlib
import json
import os
import shutil

import keras

from keras_transformer.config import TrainingConfig
from keras_transformer.config import TransformerConfig
from keras_transformer.durable import write_atomically
from keras_transformer.data import SubwordTokenizer
from keras_transformer.model import build_transformer

CONFIG = "config.json"
VOCAB = "vocab"
CHECKPOINTS = "checkpoints"
TENSORBOARD_LOGS = "logs"
CSV_LOG = "log.csv"
AVERAGED_WEIGHTS = "averaged.weights.h5"
FINAL_MODEL = "model.keras"
WEIGHTS = {"averaged": AVERAGED_WEIGHTS, "final": FINAL_MODEL}
# What a resumed run may change: how long it trains.
RESUMABLE_CHANGES = ("steps", "time_budget", "time_budget_clock", "compilation_cache")


def load_run(run_dir, weights="averaged"):
    """Loads the model and tokenizer of a training run directory.

    Args:
        run_dir: the run directory.
        weights: "averaged" (the paper's checkpoint average) or "final".

    Returns:
        `(model, tokenizer, run_config)`, the last the parsed config.json.
    """
    if weights not in WEIGHTS:
        raise ValueError(
            f"weights must be one of {sorted(WEIGHTS)}. Received: weights={weights!r}"
        )
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    config_path = os.path.join(run_dir, CONFIG)
    run_config = read_config(run_dir)
    if run_config is None:
        raise FileNotFoundError(
            f"{config_path} not found; is {run_dir} a run directory written by train.py?"
        )
    if not isinstance(run_config, dict) or "model" not in run_config:
        raise ValueError(f"{config_path} has no \"model\" entry (the TransformerConfig)")
    config = TransformerConfig.from_dict(run_config["model"])
    tokenizer = SubwordTokenizer.load(os.path.join(run_dir, VOCAB))
    weights_path = os.path.join(run_dir, WEIGHTS[weights])
    if not os.path.exists(weights_path):
        other = "final" if weights == "averaged" else "averaged"
        raise FileNotFoundError(
            f"{weights_path} not found; the run has no {weights} weights "
            f"(try weights={other!r})"
        )
    if weights == "final":
        model = keras.saving.load_model(weights_path, compile=False)  # no optimizer needed
    else:
        model = build_transformer(config)
        model.load_weights(weights_path)
    if model.config != config:
        raise ValueError(
            f"{weights_path} holds a model whose config differs from {config_path}"
        )
    return model, tokenizer, run_config


def load_vocabulary(run_dir, pairs, config, chief=True, wait=lambda: None):
    """The run's shared subword vocabulary (`RUN/vocab/`): the chief trains it on
    `pairs` (with `config`'s vocab_size, vocab_sentences and seed) when the run
    has none; `wait()` then holds every worker until it exists."""
    vocab_dir = os.path.join(run_dir, VOCAB)
    source_vocab = None
    if config.init_from:
        source_vocab = os.path.join(init_source(config.init_from)[0], VOCAB)
    if chief and not os.path.exists(vocab_dir) and source_vocab:
        write_atomically(vocab_dir, lambda temporary: shutil.copytree(source_vocab, temporary))
    elif chief and not os.path.exists(vocab_dir):
        print(f"Training a {config.vocab_size}-token shared vocabulary...", flush=True)
        tokenizer = SubwordTokenizer.train(pairs, vocab_size=config.vocab_size,
                                           max_sentences=config.vocab_sentences, seed=config.seed)
        write_atomically(vocab_dir, tokenizer.save)
    wait()
    if not os.path.exists(vocab_dir):
        raise ValueError(f"{vocab_dir} is missing on this worker: on a multi-worker run, "
                         "the run directory must be one that every worker shares")
    if source_vocab and vocabulary_digest(vocab_dir) != vocabulary_digest(source_vocab):
        raise ValueError(f"{vocab_dir} is not the vocabulary of --init-from {config.init_from} "
                         f"({source_vocab}); a run starts from weights trained with its own "
                         "vocabulary: pass a new --out")
    return SubwordTokenizer.load(vocab_dir)


def init_source(init_from):
    """`(run_dir, weights_path)` of `--init-from`: a run directory (its averaged
    weights, else its final model) or a `.weights.h5` file in one (its averaged
    weights or a checkpoint)."""
    path = os.path.normpath(init_from)
    if os.path.isdir(path):
        run_dir = path
        weights = os.path.join(path, AVERAGED_WEIGHTS)
        if not os.path.exists(weights):
            weights = os.path.join(path, FINAL_MODEL)
    elif path.endswith(".weights.h5") and os.path.isfile(path):
        run_dir = os.path.dirname(path)
        if os.path.basename(run_dir) == CHECKPOINTS:
            run_dir = os.path.dirname(run_dir)
        weights = path
    else:
        raise ValueError(f"--init-from {init_from}: not a run directory nor a .weights.h5 file "
                         "of one")
    if read_config(run_dir) is None or not os.path.isdir(os.path.join(run_dir, VOCAB)):
        raise ValueError(f"--init-from {init_from}: {run_dir} is not a run directory written "
                         f"by train.py (it needs {CONFIG} and {VOCAB}/)")
    if not os.path.exists(weights):
        raise ValueError(f"--init-from {init_from}: {run_dir} has no trained weights yet "
                         f"({AVERAGED_WEIGHTS} or {FINAL_MODEL}); name one of its checkpoints")
    return run_dir, weights


def load_initial_weights(model, init_from):
    """Sets `model`'s weights (not its optimizer's) to those of `--init-from`."""
    _, path = init_source(init_from)
    if path.endswith(".keras"):
        source = keras.saving.load_model(path, compile=False)
    else:
        source = build_transformer(model.config)
        try:
            source.load_weights(path)
        except ValueError as error:
            raise ValueError(f"--init-from {init_from}: {path} does not fit this model "
                             f"({str(error).splitlines()[0]})") from None
    model.set_weights(source.get_weights())
    return path


def vocabulary_digest(vocab_dir):
    """The sha256 of a vocabulary directory's files (names and contents), hex."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(vocab_dir)):
        digest.update(name.encode() + b"\0")
        with open(os.path.join(vocab_dir, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def check_same_vocabulary(run_dir, saved):
    """Refuses to resume `run_dir` when its vocabulary is not the one the run's
    config.json recorded."""
    recorded = (saved or {}).get("vocab_sha256")
    if recorded is None:  # a new run, or one from before the digest was recorded
        return
    actual = vocabulary_digest(os.path.join(run_dir, VOCAB))
    if recorded != actual:
        raise ValueError(
            f"{os.path.join(run_dir, VOCAB)} is not the vocabulary this run was trained with "
            f"(sha256 {actual[:12]}..., {CONFIG} records {recorded[:12]}...); put the run's own "
            "vocabulary back, or pass a new --out")


def read_config(run_dir):
    """The parsed config.json of `run_dir`, or None when there is none."""
    path = os.path.join(run_dir, CONFIG)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def write_config(run_dir, model_config, training_config):
    """Writes config.json whole or not at all, with the sha256 of the run's
    vocabulary when it has one."""
    values = {"model": model_config.to_dict(), "training": training_config.to_dict()}
    if os.path.isdir(os.path.join(run_dir, VOCAB)):
        values["vocab_sha256"] = vocabulary_digest(os.path.join(run_dir, VOCAB))

    def write(path):
        with open(path, "w") as f:
            json.dump(values, f, indent=2, sort_keys=True)

    os.makedirs(run_dir, exist_ok=True)
    write_atomically(os.path.join(run_dir, CONFIG), write)


def resolve_configs(run_dir, fields, explicit, model_overrides=None, model_config_file=None,
                    cores=None):
    """The configs of a run: from flags for a new `run_dir`, from its config.json
    for one being resumed, where only how long it trains may change.

    Args:
        run_dir: the run directory.
        fields: every `TrainingConfig` field's value (flags and defaults).
        explicit: the names of the fields given explicitly.
        model_overrides: `TransformerConfig` fields given explicitly.
        model_config_file: a JSON file of a whole `TransformerConfig`, instead of
            the `--model` preset.
        cores: the CPU cores `--model auto` plans for (default: this process's).

    Returns:
        `(training_config, model_config, saved)`: `model_config`'s
        `vocab_size` is the requested one until the vocabulary exists (see
        `check_same_model`); `saved` is the resumed run's config.json or None.

    Raises:
        ValueError: a changed setting on resume, or an invalid config.
    """
    saved = read_config(run_dir)
    config = _training_config(run_dir, fields, explicit, saved)
    if config.init_from and saved is None:
        init_source(config.init_from)  # refused before any work
    model_config = _model_config(config, model_overrides or {}, model_config_file, saved,
                                 "model" in explicit, cores)
    return config, model_config, saved


def check_same_model(run_dir, saved, model_config):
    """Refuses to resume `run_dir` with a model of another shape or with another
    vocabulary than its config.json recorded."""
    check_same_vocabulary(run_dir, saved)
    if saved is None or saved["model"] == model_config.to_dict():
        return
    differ = {name: value for name, value in model_config.to_dict().items()
              if saved["model"].get(name) != value}
    raise ValueError(f"{run_dir} holds a model of another shape ({differ} differ from "
                     f"{os.path.join(run_dir, CONFIG)}); pass a new --out to train this one")


def _training_config(run_dir, fields, explicit, saved):
    if saved is None:
        return TrainingConfig(**fields)
    config = TrainingConfig.from_dict(saved["training"])
    changed = {n: fields[n] for n in set(explicit) - set(RESUMABLE_CHANGES)
               if fields[n] != getattr(config, n)}
    if changed:
        raise ValueError(
            f"{run_dir} holds a run with other settings ({changed} differ from "
            f"{os.path.join(run_dir, CONFIG)}); pass a new --out, or only --steps or "
            "--time-budget to train it longer"
        )
    return dataclasses.replace(
        config, **{n: fields[n] for n in set(explicit) & set(RESUMABLE_CHANGES)})


def _model_config(config, overrides, model_config_file, saved, model_named, cores):
    """The preset (or the file), then the overrides; a resumed run keeps its own
    (other shape flags are refused by `check_same_model`)."""
    derived = dict(vocab_size=config.vocab_size,
                   max_positions=max(config.max_sentence_tokens, 256))
    if config.init_from and saved is None:
        if model_named or model_config_file is not None:
            raise ValueError("--init-from takes the model of the run it starts from; drop "
                             "--model and --model-config")
        initial = read_config(init_source(config.init_from)[0])["model"]
        return TransformerConfig.from_dict(dict(initial, **overrides))
    if model_config_file is not None:
        if model_named:
            raise ValueError("--model-config and --model both name a model; give one")
        try:
            with open(model_config_file) as f:
                values = json.load(f)
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"--model-config {model_config_file}: {error}") from None
        if not isinstance(values, dict):
            raise ValueError(f"--model-config {model_config_file} must hold a JSON object "
                             "of TransformerConfig fields")
        values.update(derived, **overrides)
        return TransformerConfig.from_dict(values)
    if saved is not None and not overrides:
        return TransformerConfig.from_dict(dict(saved["model"], vocab_size=config.vocab_size))
    cores = cores or len(os.sched_getaffinity(0))
    return TransformerConfig.preset(config.model_preset(cores=cores), **derived, **overrides)
