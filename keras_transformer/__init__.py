"""keras_transformer: the Transformer of "Attention Is All You Need" in Keras 3.

The model and its training pieces import at once (loading a saved model needs
its layers registered); the tokenizer, translation, export and BLEU import on
first use, so that `import keras_transformer.layers` pulls in neither
tensorflow-text, TF Serving's protos nor sacrebleu.
"""

import importlib

from keras_transformer.config import TrainingConfig
from keras_transformer.config import TransformerConfig
from keras_transformer.losses import LabelSmoothedCrossEntropy
from keras_transformer.metrics import Perplexity
from keras_transformer.metrics import TokenAccuracy
from keras_transformer.model import Transformer
from keras_transformer.model import build_transformer
from keras_transformer.optimizers import AccumulatingAdam
from keras_transformer.optimizers import transformer_optimizer
from keras_transformer.schedules import TransformerSchedule

_LAZY = {
    "SubwordTokenizer": "keras_transformer.data",
    "Translator": "keras_transformer.serving",
    "export_translator": "keras_transformer.saved_model",
    "bleu_scores": "keras_transformer.evaluation",
    "evaluate": "keras_transformer.evaluation",
    "translate_sentences": "keras_transformer.evaluation",
}

__all__ = sorted([
    "AccumulatingAdam", "LabelSmoothedCrossEntropy", "Perplexity", "TokenAccuracy", "TrainingConfig",
    "Transformer", "TransformerConfig", "TransformerSchedule", "build_transformer",
    "transformer_optimizer", *_LAZY,
])


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")


def __dir__():
    return __all__
