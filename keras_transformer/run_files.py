"""Where a training run keeps what: the names of the run directory's files
(`runs.Run` reads and writes them).

    RUN/config.json           {"model": TransformerConfig, "training": TrainingConfig,
                               "vocab_sha256": the vocabulary's digest}
    RUN/vocab/                the shared subword vocabulary (`SubwordTokenizer.save`)
    RUN/checkpoints/          ckpt-<step>.weights.h5 (model and optimizer) and, beside
                              each, ckpt-<step>.rng.npy (dropout's random state) and
                              ckpt-<step>.clock.json (the time the run had spent)
    RUN/logs/, RUN/log.csv    TensorBoard and CSV logs, one row per checkpoint
    RUN/averaged.weights.h5   the average of the last checkpoints (Sec. 6.1)
    RUN/decoding.json         the decoding chosen on dev pairs when training ended:
                              {"alpha", "no_repeat_ngram_size", "block_adjacent_repeats"
                              (if true), "sentences",
                              "tried": [{"alpha", "no_repeat_ngram_size", "bleu"}]}
    RUN/model.keras           the final model, compiled, with its optimizer
    RUN/.lock                 names the trainer writing the run (`durable.RunLock`)

Imports no TensorFlow: the decoding commands tell a run's directory from an
export's before TensorFlow starts (`cli.common.check_not_swapped`).
"""

import os
import re

from keras_transformer import durable

CONFIG = "config.json"
VOCAB = "vocab"
CHECKPOINTS = "checkpoints"
TENSORBOARD_LOGS = "logs"
CSV_LOG = "log.csv"
AVERAGED_WEIGHTS = "averaged.weights.h5"
DECODING = "decoding.json"
FINAL_MODEL = "model.keras"
LOCK = durable.LOCK  # the lock's own module names its file
WEIGHTS = {"averaged": AVERAGED_WEIGHTS, "final": FINAL_MODEL}
# Which weights of a run a command translates with (`runs.Run.load`): its files, or
# "checkpoints", the average of its newest checkpoints as they are (a run that
# stopped before its end, which writes the two files, or one still training).
WEIGHT_CHOICES = (*WEIGHTS, "checkpoints")
CHECKPOINT_NAME = "ckpt-{step:08d}.weights.h5"  # and its pattern, which reads the step:
CHECKPOINT_PATTERN = re.compile(r"ckpt-(\d+)\.weights\.h5$")


def is_run(path):
    """Whether `path` is a training run's directory: it holds the run's config."""
    return os.path.isfile(os.path.join(os.fspath(path), CONFIG))
