"""The input side: a shared subword vocabulary, parallel corpora and token-budget batches.

Never imports the model.
"""

from keras_transformer.data.batching import BatchStats, bucket_lengths, fit_bucket_lengths, make_batches
from keras_transformer.data.casing import Casing
from keras_transformer.data.corpora import bundled_manifest, hold_out, load_parallel
from keras_transformer.data.tokenizer import SubwordTokenizer
from keras_transformer.data.training_batches import TrainingBatches
from keras_transformer.token_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__all__ = [
    "BOS_ID",
    "BatchStats",
    "Casing",
    "EOS_ID",
    "PAD_ID",
    "SubwordTokenizer",
    "TrainingBatches",
    "UNK_ID",
    "bucket_lengths",
    "bundled_manifest",
    "fit_bucket_lengths",
    "hold_out",
    "load_parallel",
    "make_batches",
]
