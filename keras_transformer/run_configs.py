"""The configs of a run: from the flags for a new run directory, from its
config.json for one being resumed (where only how long it trains may change),
from the run it starts from for one with `--init-from`.
"""

import dataclasses
import json

from keras_transformer.config import TrainingConfig
from keras_transformer.config import TransformerConfig
from keras_transformer.hardware import available_cores
from keras_transformer.runs import Run
from keras_transformer.runs import init_source

# What a resumed run may change: how long it trains.
RESUMABLE_CHANGES = ("steps", "time_budget", "time_budget_clock", "compilation_cache")


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
    saved = Run(run_dir).read_config()
    config = _training_config(run_dir, fields, explicit, saved)
    if config.init_from and saved is None:
        init_source(config.init_from)  # refused before any work
    model_config = _model_config(config, model_overrides or {}, model_config_file, saved,
                                 "model" in explicit, cores)
    if saved is None:
        config = config.for_model(model_config, explicit)
    return config, model_config, saved


def check_same_model(run_dir, saved, model_config):
    """Refuses to resume `run_dir` with a model of another shape or with another
    vocabulary than its config.json (`saved`) recorded."""
    run = Run(run_dir)
    run.check_same_vocabulary(saved)
    if saved is None or saved["model"] == model_config.to_dict():
        return
    differ = {name: value for name, value in model_config.to_dict().items()
              if saved["model"].get(name) != value}
    raise ValueError(f"{run_dir} holds a model of another shape ({differ} differ from "
                     f"{run.config_path}); pass a new --out to train this one")


def _training_config(run_dir, fields, explicit, saved):
    if saved is None:
        return TrainingConfig(**fields)
    config = TrainingConfig.from_dict(saved["training"])
    changed = {n: fields[n] for n in set(explicit) - set(RESUMABLE_CHANGES)
               if fields[n] != getattr(config, n)}
    if changed:
        raise ValueError(
            f"{run_dir} holds a run with other settings ({changed} differ from "
            f"{Run(run_dir).config_path}); pass a new --out, or only --steps or "
            "--time-budget to train it longer"
        )
    return dataclasses.replace(
        config, **{n: fields[n] for n in set(explicit) & set(RESUMABLE_CHANGES)})


def _model_config(config, overrides, model_config_file, saved, model_named, cores):
    """The preset (or the file), then the overrides; a resumed run keeps its own
    (other shape flags are refused by `check_same_model`)."""
    derived = dict(vocab_size=config.vocab_size,  # at least the model's default table
                   max_positions=max(config.max_sentence_tokens, TransformerConfig.max_positions))
    if config.init_from and saved is None:
        if model_named or model_config_file is not None:
            raise ValueError("--init-from takes the model of the run it starts from; drop "
                             "--model and --model-config")
        initial = Run(init_source(config.init_from)[0]).read_config()["model"]
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
    cores = cores or available_cores()
    return TransformerConfig.preset(config.model_preset(cores=cores), **derived, **overrides)
