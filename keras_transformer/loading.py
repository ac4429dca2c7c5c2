"""Loading a translator: from a training run directory (`translator_from_run`) or
from an export (`load_export`), whichever a command was given (`load_translator`).

A floor above `serving`: the exportable translator knows nothing of training
runs; this module joins the two (`keras_transformer.runs.Run.load` gives the
model and vocabulary of a run).
"""

import tensorflow as tf

from keras_transformer import ctranslate2_model
from keras_transformer import export_files
from keras_transformer import runs
from keras_transformer import serving
from keras_transformer.decoding_config import RUN_PRECISION


def translator_from_run(run_dir, weights="averaged", config=None, **settings):
    """A `serving.Translator` for a training run directory.

    Args:
        run_dir: the directory `keras-transformer train` wrote.
        weights: "averaged" (the paper's average of the last checkpoints) or
            "final" (the last step's model); see `runs.Run.load`.
        config: the `DecodingConfig` (default: the paper's decoding with the
            length penalty the run chose on its dev set, `runs.Run.decoding_settings`,
            in the precision of a run's translations, `RUN_PRECISION`, whatever
            it trained in).
        **settings: `DecodingConfig` fields that replace the config's.
    """
    run = runs.Run(run_dir)
    model, tokenizer, _ = run.load(weights)
    return run_translator(run, model, tokenizer, config, **settings)


def run_translator(run, model, tokenizer, config=None, **settings):
    """The `serving.Translator` of `model` and `tokenizer` as `run.load` gave them
    (`run`: a `runs.Run`), with the run's decoding: `translator_from_run`'s, for
    a caller that reads what `Run.load` says of the weights (the steps of the
    checkpoints it averaged)."""
    if config is None:
        settings = {"precision": RUN_PRECISION, **run.decoding_settings(), **settings}
    return serving.Translator(model, tokenizer, config, **settings)


def load_export(path):
    """Loads an export: a version directory, or a base directory's newest version;
    a CTranslate2 export's directory as a `ctranslate2_model.CTranslate2Translator`.
    The loaded SavedModel's `recorded_settings` are the translator settings the
    export recorded (`export_files.translator_settings`: its request limits
    among them), {} for an export that recorded none."""
    if export_files.is_ctranslate2_export(path):
        return ctranslate2_model.CTranslate2Translator(path)
    directory = export_files.version_directory(path)
    export = tf.saved_model.load(directory)
    export.recorded_settings = export_files.translator_settings(directory)
    return export


def load_translator(export=None, run=None, weights="averaged", config=None, **settings):
    """A translator from an export directory or from a training run directory.

    Exactly one of `export` (see `load_export`) and `run` (see
    `translator_from_run`) must be given; `weights`, `config` and `settings`
    apply to a run.
    """
    if (export is None) == (run is None):
        raise ValueError("pass exactly one of export (an export directory) and run "
                         "(a training run directory)")
    if export is not None:
        return load_export(export)
    return translator_from_run(run, weights, config, **settings)
