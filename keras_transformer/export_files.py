"""Where an export keeps what: its version directories and the settings it
recorded (`saved_model.export_translator` writes them).

Imports no TensorFlow: the decoding commands read an export's settings before
TensorFlow starts (`cli.common.start_decoding`).
"""

import json
import os

# In a version directory's assets.extra/: the model's, translator's and run's
# settings, and TF Serving's warm-up requests.
CONFIG_FILENAME = "config.json"
WARMUP_FILENAME = "tf_serving_warmup_requests"


def version_directory(path):
    """An export's SavedModel directory: `path` itself if it holds one, else its
    newest numbered version."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"export directory {path} does not exist")
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    versions = _versions(path)
    if not versions:
        raise FileNotFoundError(
            f"{path} holds no SavedModel (no saved_model.pb, nor a numbered "
            "version directory with one); pass a directory written by keras-transformer export"
        )
    return os.path.join(path, max(versions, key=int))


def is_export(path):
    """Whether `path` is an export's directory: a SavedModel, or numbered
    versions of one."""
    path = os.fspath(path)
    return os.path.isdir(path) and (
        os.path.exists(os.path.join(path, "saved_model.pb")) or bool(_versions(path)))


def _versions(path):
    return [name for name in os.listdir(path)
            if name.isdigit() and os.path.exists(os.path.join(path, name, "saved_model.pb"))]


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
    config = os.path.join(version_directory(path), "assets.extra", CONFIG_FILENAME)
    if not os.path.exists(config):
        return {}
    with open(config) as f:
        return json.load(f)
