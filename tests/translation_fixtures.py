"""A tiny vocabulary, model, translator and run directory for the serving,
export, evaluation and CLI tests (the `tokenizer` fixture is conftest's).

The model has random weights: its translations are gibberish, but every
equivalence the tests check (cached = uncached, reloaded = in-memory, text =
ids) holds for any weights.
"""

import os

import numpy as np

from keras_transformer import TrainingConfig
from keras_transformer import TransformerConfig
from keras_transformer import DecodingConfig
from keras_transformer import build_transformer
from keras_transformer import data
from keras_transformer import runs
from keras_transformer import serving
from tests.seeding import reseed

SENTENCES = [
    "In the beginning, God created the heavens and the earth.",
    "The earth was formless and empty.",
    "God said, Let there be light, and there was light.",
    "And God saw the light.",
]
MAX_INPUT_LENGTH = 16
EXTRA_LENGTH = 8
BAD_UTF8 = b"God \xff\xfe said"


def make_tokenizer():
    """A 400-id vocabulary learned from 300 pairs of the bundled dev split (~0.5 s)."""
    pairs = data.load_parallel("bundled", "dev").take(300)
    return data.SubwordTokenizer.train(pairs, vocab_size=400)


def make_model(vocab_size, seed=0, **overrides):
    """A tiny Transformer with random weights (d_model 32, 2 layers)."""
    reseed(seed)
    config = TransformerConfig.tiny(
        vocab_size, **dict(dict(d_model=32, d_ff=64, max_positions=64), **overrides)
    )
    return build_transformer(config)


def make_translator(model, tokenizer):
    """The translator the serving and export tests share: beams 1 and 4 (each
    beam size costs seconds of tracing and of each signature's first call)."""
    config = DecodingConfig(extra_length=EXTRA_LENGTH, max_input_length=MAX_INPUT_LENGTH,
                            beam_sizes=(1, 4))
    return serving.Translator(model, tokenizer, config)


def make_run_dir(path, tokenizer, model):
    """Writes a run directory in train.py's layout, as a run that ended:
    config.json, vocab/, its weights, and decoding.json (the paper's, as a run
    chooses where nothing scores higher on its dev pairs)."""
    path = str(path)
    tokenizer.save(os.path.join(path, runs.VOCAB))
    model.save_weights(os.path.join(path, runs.AVERAGED_WEIGHTS))
    model.save(os.path.join(path, runs.FINAL_MODEL))
    runs.Run(path).write_config(model.config, TrainingConfig())
    runs.Run(path).write_decoding({"alpha": 0.6, "no_repeat_ngram_size": 0},
                                  {(4, 0.6): 0.0, (0, 0.6): 0.0}, 200)
    return path


def strings(tensor):
    """A string tensor's values as a flat list of str."""
    return [t.decode("utf-8") for t in np.asarray(tensor).reshape(-1)]
