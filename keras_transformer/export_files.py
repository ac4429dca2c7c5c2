"""Where an export keeps what: its version directories and the settings it
recorded (`saved_model.export_translator` writes them), or, for a CTranslate2
export (`ctranslate2_model.export_ctranslate2`), its one directory and the
settings beside CTranslate2's model.

Imports no TensorFlow: the decoding commands read an export's settings before
TensorFlow starts (`cli.common.start_decoding`).
"""

import json
import os

# A version directory's graph, and its folder of files TF Serving reads beside
# the SavedModel: the model's, translator's and run's settings, and the warm-up
# requests.
SAVED_MODEL_FILENAME = "saved_model.pb"
ASSETS_EXTRA = "assets.extra"
CONFIG_FILENAME = "config.json"
WARMUP_FILENAME = "tf_serving_warmup_requests"
# A CTranslate2 export's model, and our settings beside it (the model, the weights'
# type, "translator" and "run" as a SavedModel export's config.json has them).
CTRANSLATE2_MODEL = "model.bin"
CTRANSLATE2_SETTINGS = "keras_transformer.json"


def version_directory(path):
    """An export's SavedModel directory: `path` itself if it holds one, else its
    newest numbered version."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"export directory {path} does not exist")
    if os.path.exists(os.path.join(path, SAVED_MODEL_FILENAME)):
        return path
    versions = _versions(path)
    if not versions:
        raise FileNotFoundError(
            f"{path} holds no SavedModel (no saved_model.pb, nor a numbered "
            "version directory with one); pass a directory written by keras-transformer export"
        )
    return os.path.join(path, max(versions, key=int))


def is_export(path):
    """Whether `path` is an export's directory: a SavedModel, numbered versions
    of one, or a CTranslate2 export."""
    path = os.fspath(path)
    return os.path.isdir(path) and (
        os.path.exists(os.path.join(path, SAVED_MODEL_FILENAME)) or bool(_versions(path))
        or is_ctranslate2_export(path))


def is_ctranslate2_export(path):
    """Whether `path` is a CTranslate2 export's directory: CTranslate2's model
    and our settings."""
    return all(os.path.isfile(os.path.join(os.fspath(path), name))
               for name in (CTRANSLATE2_MODEL, CTRANSLATE2_SETTINGS))


def _versions(path):
    return [name for name in os.listdir(path)
            if name.isdigit() and os.path.exists(os.path.join(path, name, SAVED_MODEL_FILENAME))]


def translator_settings(path):
    """The translator settings an export recorded (`DecodingConfig.to_dict`'s
    keys; exports from before some settings lack them), {} where it recorded
    none."""
    return _recorded(path).get("translator", {})


def run_settings(path):
    """The run an export was made of, as `keras-transformer export` recorded it
    (its config.json's "model" and "training", "weights", "run_dir"), {} for an
    export of the library's (`export_translator` without a config)."""
    return _recorded(path).get("run", {})


def _recorded(path):
    if is_ctranslate2_export(path):
        config = os.path.join(path, CTRANSLATE2_SETTINGS)
    else:
        config = os.path.join(version_directory(path), ASSETS_EXTRA, CONFIG_FILENAME)
    if not os.path.exists(config):
        return {}
    with open(config) as f:
        return json.load(f)
