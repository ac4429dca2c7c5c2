"""keras_transformer: the Transformer of "Attention Is All You Need" in Keras 3.

Importing the package is light: each public name imports its module on first
use. So the command lines (`keras-transformer`, `python -m keras_transformer`)
set TensorFlow's environment and answer `--help` before TensorFlow starts, and
`import keras_transformer.layers` pulls in neither tensorflow-text, TF Serving's
protos nor sacrebleu.

Loading a saved model needs our Keras classes registered, which happens when
their modules load: at once if Keras is already imported (`import keras` before
`import keras_transformer`), else at the first use of one of them (`keras_transformer.Transformer`,
`build_transformer`, ...) or by `keras_transformer.register_keras_classes()`.
"""

import importlib
import sys

_NAMES = {
    "DecodingConfig": "keras_transformer.decoding_config",
    "TruncatedInputWarning": "keras_transformer.decoding_config",
    "TrainingConfig": "keras_transformer.config",
    "TransformerConfig": "keras_transformer.config",
    "LabelSmoothedCrossEntropy": "keras_transformer.losses",
    "Perplexity": "keras_transformer.metrics",
    "TargetTokens": "keras_transformer.metrics",
    "TokenAccuracy": "keras_transformer.metrics",
    "Transformer": "keras_transformer.model",
    "build_transformer": "keras_transformer.model",
    "AccumulatingAdam": "keras_transformer.optimizers",
    "transformer_optimizer": "keras_transformer.optimizers",
    "TransformerSchedule": "keras_transformer.schedules",
    "SubwordTokenizer": "keras_transformer.data",
    "Translator": "keras_transformer.serving",
    "load_translator": "keras_transformer.loading",
    "translator_from_run": "keras_transformer.loading",
    "export_translator": "keras_transformer.saved_model",
    "bleu_scores": "keras_transformer.evaluation",
    "evaluate": "keras_transformer.evaluation",
    "translate_sentences": "keras_transformer.evaluation",
}
# The modules whose classes `keras.saving.load_model` looks up by registered name.
_KERAS_MODULES = ("keras_transformer.model", "keras_transformer.losses",
                  "keras_transformer.metrics", "keras_transformer.optimizers",
                  "keras_transformer.schedules")

__all__ = sorted([*_NAMES, "register_keras_classes"])


def register_keras_classes():
    """Imports the modules of every Keras class of the package (layers, model,
    loss, metrics, optimizer, schedule), which registers them for
    `keras.saving.load_model`. Imports Keras, and so TensorFlow."""
    for module in _KERAS_MODULES:
        importlib.import_module(module)


def __getattr__(name):
    if name in _NAMES:
        if _NAMES[name] in _KERAS_MODULES:
            register_keras_classes()
        value = getattr(importlib.import_module(_NAMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")


def __dir__():
    return __all__


if "keras" in sys.modules:  # Keras's start-up is paid already: register at once.
    register_keras_classes()
