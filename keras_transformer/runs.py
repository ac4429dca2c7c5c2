"""The run directory that `train.py` writes and everything else reads: `Run`.

Its files, and what each holds, are listed in `run_files.py`; `Run` knows
where each is and reads and writes them; `Checkpoints`
names and lists the checkpoints. What a run started again with the same
directory may change is settled in `run_configs.py`.

Runs last days, so every file of one is written to survive a kill at any
moment, and one trainer at a time writes a run (`durable.py`).
"""

import hashlib
import json
import os
import re
import shutil
import warnings
import zipfile

import keras

from keras_transformer import durable
from keras_transformer.config import TrainingConfig
from keras_transformer.config import TransformerConfig
from keras_transformer.data import SubwordTokenizer
from keras_transformer.decoding_config import PAPER_DECODING
from keras_transformer.model import build_transformer
from keras_transformer.run_files import AVERAGED_WEIGHTS
from keras_transformer.run_files import CHECKPOINT_NAME
from keras_transformer.run_files import CHECKPOINT_PATTERN
from keras_transformer.run_files import CHECKPOINTS
from keras_transformer.run_files import CONFIG
from keras_transformer.run_files import CSV_LOG
from keras_transformer.run_files import DECODING
from keras_transformer.run_files import FINAL_MODEL
from keras_transformer.run_files import LOCK
from keras_transformer.run_files import TENSORBOARD_LOGS
from keras_transformer.run_files import VOCAB
from keras_transformer.run_files import WEIGHT_CHOICES
from keras_transformer.run_files import WEIGHTS


def _write_json(path, values, sort_keys=False):
    """Writes `values` to `path` as indented JSON, whole or not at all."""
    def write(temporary):
        with open(temporary, "w") as f:
            json.dump(values, f, indent=2, sort_keys=sort_keys)

    durable.write_atomically(path, write)


class Checkpoints:
    """A run's checkpoints (`RUN/checkpoints/`): `ckpt-<step>.weights.h5`, the
    model's and optimizer's state at an optimizer step, each with dropout's
    random state beside it in `ckpt-<step>.rng.npy` and the time the run had
    spent in `ckpt-<step>.clock.json` (`training.StepCheckpoint` writes them,
    `training.restore_latest_checkpoint` and `spent` read them).

    Args:
        directory: the folder that holds them.
    """

    def __init__(self, directory):
        self.directory = directory

    def path(self, step):
        """The checkpoint of optimizer step `step`."""
        return os.path.join(self.directory, CHECKPOINT_NAME.format(step=step))

    @staticmethod
    def rng_path(checkpoint):
        """The random-state file beside `checkpoint`."""
        return checkpoint.replace(".weights.h5", ".rng.npy")

    @staticmethod
    def clock_path(checkpoint):
        """The time record beside `checkpoint` (`budget.TrainingClock.record`)."""
        return checkpoint.replace(".weights.h5", ".clock.json")

    def write_spent(self, checkpoint, record):
        """Writes the time `record` of `checkpoint`, before the checkpoint itself."""
        _write_json(self.clock_path(checkpoint), record, sort_keys=True)

    def spent(self, step):
        """The time record of the checkpoint of `step` (`budget.TrainingClock`'s
        `spent`), or None where it has none: a checkpoint written without a
        clock, or before 2026-11-29."""
        path = self.clock_path(self.path(step))
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)

    def list(self):
        """`[(step, path)]` of the checkpoints, oldest first."""
        if not os.path.isdir(self.directory):
            return []
        found = []
        for name in os.listdir(self.directory):
            match = CHECKPOINT_PATTERN.match(name)
            if match:
                found.append((int(match.group(1)), os.path.join(self.directory, name)))
        return sorted(found)

    def last(self, count):
        """The paths of the newest `count` checkpoints, oldest first."""
        return [path for _, path in self.list()][-count:]

    def remove(self, checkpoint):
        """Removes `checkpoint` and the files beside it, those it has."""
        for path in (checkpoint, self.rng_path(checkpoint), self.clock_path(checkpoint)):
            if os.path.exists(path):
                os.remove(path)

    def set_aside(self, checkpoint):
        """Renames an unreadable `checkpoint` out of the list, to
        `<name>.unreadable`; returns the new path."""
        os.replace(checkpoint, checkpoint + ".unreadable")
        return checkpoint + ".unreadable"


class UnreadableWeights(ValueError):
    """A weights file (`.weights.h5`) or model file (`.keras`) that is empty, cut
    short (a copy or a disk that stopped midway) or not such a file at all; its
    `path`, its `problem` in words, and `advice`, what to do, for the message."""

    def __init__(self, path, problem, advice=""):
        self.path, self.problem = path, problem
        super().__init__(f"{path} cannot be read: {problem}" + (f". {advice}" if advice else ""))

    def advised(self, advice):
        """The same error, with `advice` (a sentence) after it."""
        return UnreadableWeights(self.path, self.problem, advice)


def _first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else repr(error)


def _file_problem(path, error=None):
    """What is wrong with the weights or model file at `path`, in words, from
    its size and h5py's `error` as it was opened."""
    size = os.path.getsize(path)
    if size == 0:
        return "it is empty"
    truncated = re.search(r"truncated file: eof = (\d+).*stored_eof = (\d+)", str(error or ""))
    if truncated:
        return f"it is cut short ({truncated[1]} of its {truncated[2]} bytes)"
    if error is None:  # a .keras file that is no zip archive
        return f"it is cut short, or no .keras file ({size} bytes and no zip archive)"
    return f"it is cut short, or no HDF5 weights file ({size} bytes; {_first_line(error)})"


class WeightsMismatch(ValueError):
    """A whole weights file that holds another model's weights (more or fewer
    layers, other shapes) or another optimizer's state: its `path`, and its
    `problem` in words, for the message."""

    def __init__(self, path, problem):
        self.path, self.problem = path, problem
        super().__init__(f"{path} holds the weights of another model: {problem}")


def read_weights(model, path):
    """Loads the `.weights.h5` file at `path` into `model`. A file that is empty,
    cut short or no HDF5 file raises `UnreadableWeights`; one that holds another
    model's weights, or (where `model`'s optimizer is built) another optimizer's
    state, `WeightsMismatch`: Keras would load the layers that fit and warn of
    the rest, or fail naming its own objects."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Keras's, said in our words below
            model.load_weights(path)
    except OSError as error:  # h5py's, for a file that is not a whole HDF5 file
        if not os.path.isfile(path):
            raise
        raise UnreadableWeights(path, _file_problem(path, error)) from None
    except ValueError:  # Keras's, for weights of other shapes
        raise WeightsMismatch(path, _mismatch(model, path) or (
            "its weights have other shapes than this model's (another d_model, d_ff, "
            "num_heads or vocab_size)")) from None
    problem = _mismatch(model, path)
    if problem:
        raise WeightsMismatch(path, problem)


def _mismatch(model, path):
    """How the weights file at `path` does not fit `model`, in words: another
    count of weights, or of optimizer variables where `model`'s optimizer is
    built and the file holds one; None where the counts agree."""
    import h5py  # Keras's own dependency

    counts = {}

    def count(name, item):
        # `optimizer/vars/` holds `optimizer.variables`, a loss-scale optimizer's
        # included; its `optimizer/inner_optimizer/vars/` holds them once more.
        if isinstance(item, h5py.Dataset):
            part = ("model" if not name.startswith("optimizer/") else
                    "optimizer" if name.startswith("optimizer/vars/") else None)
            if part:
                counts[part] = counts.get(part, 0) + 1

    with h5py.File(path, "r") as f:
        f.visititems(count)
    stored, expected = counts.get("model", 0), len(model.weights)
    if stored != expected:
        return (f"{stored} weight tensors where this model has {expected} (another "
                "num_layers?)")
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and optimizer.built and "optimizer" in counts and (
            counts["optimizer"] != len(optimizer.variables)):
        return (f"an optimizer state of {counts['optimizer']} variables where this model's "
                f"optimizer has {len(optimizer.variables)} (another optimizer, or "
                "accumulate_steps?)")
    return None


def read_model(path):
    """The model of the `.keras` file at `path`, without its optimizer; a file
    that is empty, cut short or no zip archive raises `UnreadableWeights`."""
    if os.path.isfile(path) and not zipfile.is_zipfile(path):  # Keras: "File not found"
        raise UnreadableWeights(path, _file_problem(path))
    try:
        return keras.saving.load_model(path, compile=False)
    except (OSError, zipfile.BadZipFile) as error:  # an archive whose parts are broken
        raise UnreadableWeights(path, _first_line(error)) from None


def average_weights(model, paths):
    """Sets `model`'s weights to the mean, in float64, of the `.weights.h5` files'
    at `paths` (Sec. 6.1: the paper averages the last 5 checkpoints of a base
    model, the last 20 of a big one); returns the averaged weights. A file that
    cannot be read raises `UnreadableWeights` naming it (`read_weights`).

    An uncompiled model reads only the model's part of a checkpoint; a compiled
    one reads its optimizer state too (left as the last file's), and its
    optimizer must be built as it was when the checkpoints were written.
    """
    if not paths:
        raise ValueError("average_weights needs at least one weights file")
    total = None
    for path in paths:
        read_weights(model, path)
        weights = [w.astype("float64") for w in model.get_weights()]
        total = weights if total is None else [t + w for t, w in zip(total, weights)]
    averaged = [(t / len(paths)).astype(w.dtype) for t, w in zip(total, model.get_weights())]
    model.set_weights(averaged)
    return averaged


def _try_weights(weights):
    """A run's `weights` (one of `WEIGHT_CHOICES`) in words, with the command
    line's flag and the library's argument that name them."""
    what = {"averaged": "its averaged weights", "final": "its final model",
            "checkpoints": "the average of its newest checkpoints as they are"}[weights]
    return f"{what}: --weights {weights} (weights={weights!r})"


class Run:
    """A training run directory: where each of its files is (see the module's
    docstring), and reading and writing them.

    Args:
        directory: the run directory; it need not exist yet.

    Attributes:
        config_path, vocab_dir, tensorboard_dir, csv_log, averaged_weights,
        final_model, lock_path: the paths of its parts.
        checkpoints: its `Checkpoints`.
    """

    def __init__(self, directory):
        self.directory = directory
        self.config_path = os.path.join(directory, CONFIG)
        self.vocab_dir = os.path.join(directory, VOCAB)
        self.checkpoints = Checkpoints(os.path.join(directory, CHECKPOINTS))
        self.tensorboard_dir = os.path.join(directory, TENSORBOARD_LOGS)
        self.csv_log = os.path.join(directory, CSV_LOG)
        self.averaged_weights = os.path.join(directory, AVERAGED_WEIGHTS)
        self.decoding_path = os.path.join(directory, DECODING)
        self.final_model = os.path.join(directory, FINAL_MODEL)
        self.lock_path = os.path.join(directory, LOCK)

    def __repr__(self):
        return f"Run({self.directory!r})"

    # config.json ----------------------------------------------------------

    def read_config(self):
        """The parsed config.json, or None when there is none."""
        if not os.path.exists(self.config_path):
            return None
        with open(self.config_path) as f:
            return json.load(f)

    def write_config(self, model_config, training_config):
        """Writes config.json whole or not at all, with the sha256 of the run's
        vocabulary when it has one."""
        values = {"model": model_config.to_dict(), "training": training_config.to_dict()}
        if os.path.isdir(self.vocab_dir):
            values["vocab_sha256"] = vocabulary_digest(self.vocab_dir)
        os.makedirs(self.directory, exist_ok=True)
        _write_json(self.config_path, values, sort_keys=True)

    # decoding.json --------------------------------------------------------

    def write_decoding(self, settings, scores, sentences):
        """Records the request `settings` chosen for the run's translations
        (`{"alpha": 0.8, "no_repeat_ngram_size": 4}`) on `sentences` dev
        sentences, with `scores`, `{(no_repeat_ngram_size, alpha): sacreBLEU}` of
        each pair tried (`evaluation.choose_decoding`); `settings` None removes
        the record."""
        if settings is None:
            if os.path.exists(self.decoding_path):
                os.remove(self.decoding_path)
            return
        tried = [{"no_repeat_ngram_size": size, "alpha": alpha, "bleu": round(bleu, 2)}
                 for (size, alpha), bleu in scores.items()]
        values = {**settings, "sentences": sentences, "tried": tried}
        _write_json(self.decoding_path, values)

    def decoding_chosen(self):
        """Whether the run has chosen the decoding of its translations: as it
        ended (decoding.json), or never (`alpha_sentences` 0: the paper's). Not
        yet where it stopped before its end or is still training; nor where it
        ended before runs chose (2026-11-26), whose own weights keep the
        paper's decoding."""
        if os.path.exists(self.decoding_path):
            return True
        training = (self.read_config() or {}).get("training", {})
        return TrainingConfig.from_dict(training).alpha_sentences == 0

    def decoding_settings(self):
        """The decoding settings this run chose for its translations
        (`{"alpha": 1.0, "no_repeat_ngram_size": 4, "block_adjacent_repeats":
        True}`; a run of 2026-11-26 chose alpha only, runs before 2026-11-29 no
        `block_adjacent_repeats`), or `{}` for the paper's."""
        if not os.path.exists(self.decoding_path):
            return {}
        with open(self.decoding_path) as f:
            values = json.load(f)
        size = values.get("no_repeat_ngram_size", 0) if isinstance(values, dict) else None
        if not isinstance(values, dict) or not isinstance(values.get("alpha"), (int, float)) \
                or not isinstance(size, int) or size < 0:
            raise ValueError(f"{self.decoding_path} needs a number \"alpha\" (and an int "
                             "\"no_repeat_ngram_size\" >= 0, if any); remove the file to "
                             f"translate with the paper's decoding ({PAPER_DECODING})")
        adjacent = values.get("block_adjacent_repeats", False)
        if not isinstance(adjacent, bool):
            raise ValueError(f"{self.decoding_path}: \"block_adjacent_repeats\" must be true "
                             "or false; remove the file to translate with the paper's decoding")
        settings = {"alpha": float(values["alpha"])}
        if size:
            settings["no_repeat_ngram_size"] = size
        if adjacent:
            settings["block_adjacent_repeats"] = True
        return settings

    # The vocabulary -------------------------------------------------------

    def load_vocabulary(self, pairs, config, chief=True, wait=lambda: None):
        """The run's shared subword vocabulary: the chief copies `--init-from`'s,
        or trains one on `pairs` (with `config`'s vocab_size, vocab_sentences and
        seed), when the run has none; `wait()` then holds every worker until it
        exists."""
        source_vocab = None
        if config.init_from:
            source_vocab = Run(init_source(config.init_from)[0]).vocab_dir
        if chief and not os.path.exists(self.vocab_dir) and source_vocab:
            durable.write_atomically(
                self.vocab_dir, lambda temporary: shutil.copytree(source_vocab, temporary))
        elif chief and not os.path.exists(self.vocab_dir):
            print(f"Training a shared vocabulary of {config.vocab_size} tokens...", flush=True)
            tokenizer = SubwordTokenizer.train(pairs, vocab_size=config.vocab_size,
                                               max_sentences=config.vocab_sentences,
                                               seed=config.seed)
            durable.write_atomically(self.vocab_dir, tokenizer.save)
        wait()
        if not os.path.exists(self.vocab_dir):
            raise ValueError(f"{self.vocab_dir} is missing on this worker: on a multi-worker "
                             "run, the run directory must be one that every worker shares")
        if source_vocab and vocabulary_digest(self.vocab_dir) != vocabulary_digest(source_vocab):
            raise ValueError(f"{self.vocab_dir} is not the vocabulary of --init-from "
                             f"{config.init_from} ({source_vocab}); a run starts from weights "
                             "trained with its own vocabulary: pass a new --out")
        return SubwordTokenizer.load(self.vocab_dir)

    def check_same_vocabulary(self, saved):
        """Refuses to resume the run when its vocabulary is not the one its
        config.json (`saved`) recorded."""
        recorded = (saved or {}).get("vocab_sha256")
        if recorded is None:  # a new run, or one from before the digest was recorded
            return
        actual = vocabulary_digest(self.vocab_dir)
        if recorded != actual:
            raise ValueError(
                f"{self.vocab_dir} is not the vocabulary this run was trained with "
                f"(sha256 {actual[:12]}..., {CONFIG} records {recorded[:12]}...); put the "
                "run's own vocabulary back, or pass a new --out")

    # Writing ---------------------------------------------------------------

    def lock(self):
        """Takes the run's `durable.RunLock` until the process ends (one trainer
        per run directory) and removes what killed writers left; returns it."""
        return durable.lock_for_writing(self.directory)

    def save_final_model(self, model):
        """Writes `model` (compiled, with its optimizer) as the final model."""
        durable.write_atomically(self.final_model, model.save)

    # Reading ---------------------------------------------------------------

    def load(self, weights="averaged"):
        """`(model, tokenizer, run_config)`: the model with the run's `weights`, its
        tokenizer, and the parsed config.json.

        `weights` is "averaged" (the paper's checkpoint average, which the run
        writes as it ends), "final" (the last step's model, written then too) or
        "checkpoints": the average of the newest checkpoints as they are, as many
        as the run averages as it ends (`average_last`), for a run that stopped
        before its end or one still training. For "checkpoints", run_config also
        holds "checkpoint_steps", the steps of those averaged.
        """
        if weights not in WEIGHT_CHOICES:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_CHOICES)}. "
                             f"Received: weights={weights!r}")
        if not os.path.isdir(self.directory):
            raise FileNotFoundError(f"run directory {self.directory} does not exist")
        run_config = self.read_config()
        if run_config is None:
            raise FileNotFoundError(f"{self.config_path} not found; is {self.directory} a run "
                                    "directory written by keras-transformer train?")
        if not isinstance(run_config, dict) or "model" not in run_config:
            raise ValueError(f"{self.config_path} has no \"model\" entry (the TransformerConfig)")
        config = TransformerConfig.from_dict(run_config["model"])
        tokenizer = SubwordTokenizer.load(self.vocab_dir)
        if weights == "checkpoints":
            model = build_transformer(config)
            training = TrainingConfig.from_dict(run_config.get("training", {}))
            steps = self.average_newest_checkpoints(model, training.average_last)
            return model, tokenizer, dict(run_config, checkpoint_steps=steps)
        weights_path = os.path.join(self.directory, WEIGHTS[weights])
        if not os.path.exists(weights_path):
            raise FileNotFoundError(self._missing_weights(weights))

        def instead(joint):  # the advice, worked out only where loading failed
            other = self._weights_instead(weights)
            return f"{joint}try {_try_weights(other)}" if other else ""

        try:
            if weights == "final":
                model = read_model(weights_path)  # no optimizer
            else:
                model = build_transformer(config)
                read_weights(model, weights_path)
        except UnreadableWeights as error:
            raise error.advised("Was it copied whole? Copy it again" + instead(", or ")
                                ) from None
        except ValueError as error:  # another model's weights: `WeightsMismatch`, or Keras's
            problem = (error.problem if isinstance(error, WeightsMismatch)
                       else _first_line(error))
            raise ValueError(f"{weights_path} holds another model than {self.config_path} "
                             f"({problem})" + instead("; ")) from None
        if model.config != config:
            raise ValueError(
                f"{weights_path} holds a model whose config differs from {self.config_path}"
            )
        return model, tokenizer, run_config

    def _weights_instead(self, weights):
        """The run's weights to translate with where its `weights` ("averaged" or
        "final") are missing or unreadable: its other file, else "checkpoints"
        where it has some, else None."""
        other = "final" if weights == "averaged" else "averaged"
        if os.path.exists(os.path.join(self.directory, WEIGHTS[other])):
            return other
        return "checkpoints" if self.checkpoints.list() else None

    def _missing_weights(self, weights):
        """Why the run has no file of `weights` ("averaged" or "final"), and what to do."""
        path = os.path.join(self.directory, WEIGHTS[weights])
        instead = self._weights_instead(weights)
        if instead is None:
            return (f"{path} not found: {self.directory} has no checkpoint yet; train it "
                    "until its first checkpoint, or to its end")
        if instead != "checkpoints":
            return f"{path} not found; try {_try_weights(instead)}"
        return (f"{path} not found: {self.directory} has checkpoints up to step "
                f"{self.checkpoints.list()[-1][0]} but not the weights a run writes as it "
                "ends; it stopped before its end (or is still training). Resume it to its "
                f"end with the train command that started it, or translate with "
                f"{_try_weights(instead)}")

    def average_newest_checkpoints(self, model, count):
        """Sets `model`'s weights to the average of the run's newest `count`
        checkpoints (`average_weights`); returns their steps. A checkpoint that a
        run still training removes meanwhile is replaced by the newer ones."""
        for _ in range(3):
            newest = self.checkpoints.list()[-count:]
            if not newest:
                raise FileNotFoundError(f"{self.checkpoints.directory} has no checkpoint yet; "
                                        "train the run until its first")
            try:
                average_weights(model, [path for _, path in newest])
                return [step for step, _ in newest]
            except (OSError, ValueError) as error:
                if not all(os.path.exists(path) for _, path in newest):
                    continue  # removed by the run as it was read
                if isinstance(error, UnreadableWeights):
                    raise error.advised(
                        "Was it copied whole? Copy it again, or rename it to "
                        f"{os.path.basename(error.path)}.unreadable (train does so itself "
                        "as it resumes) to average the checkpoints before it") from None
                raise
        raise FileNotFoundError(f"the checkpoints of {self.directory} changed three times "
                                "while they were read; try again")


def vocabulary_digest(vocab_dir):
    """The sha256 of a vocabulary directory's files (names and contents), hex."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(vocab_dir)):
        digest.update(name.encode() + b"\0")
        with open(os.path.join(vocab_dir, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


# --init-from: another run's weights ------------------------------------------


def init_source(init_from):
    """`(run_dir, weights_path)` of `--init-from`: a run directory (its averaged
    weights, else its final model) or a `.weights.h5` file in one (its averaged
    weights or a checkpoint)."""
    path = os.path.normpath(init_from)
    if os.path.isdir(path):
        run_dir = path
        weights = Run(path).averaged_weights
        if not os.path.exists(weights):
            weights = Run(path).final_model
    elif path.endswith(".weights.h5") and os.path.isfile(path):
        run_dir = os.path.dirname(path)
        if os.path.basename(run_dir) == CHECKPOINTS:
            run_dir = os.path.dirname(run_dir)
        weights = path
    else:
        raise ValueError(f"--init-from {init_from}: not a run directory nor a .weights.h5 file "
                         "of one")
    run = Run(run_dir)
    if run.read_config() is None or not os.path.isdir(run.vocab_dir):
        raise ValueError(f"--init-from {init_from}: {run_dir} is not a run directory written "
                         f"by train.py (it needs {CONFIG} and {VOCAB}/)")
    if not os.path.exists(weights):
        raise ValueError(f"--init-from {init_from}: {run_dir} has no trained weights yet "
                         f"({AVERAGED_WEIGHTS} or {FINAL_MODEL}); name one of its checkpoints")
    return run_dir, weights


def load_initial_weights(model, init_from):
    """Sets `model`'s weights (not its optimizer's) to those of `--init-from`."""
    run_dir, path = init_source(init_from)
    try:
        if path.endswith(".keras"):
            source = read_model(path)
        else:
            source = build_transformer(model.config)
            read_weights(source, path)
    except UnreadableWeights as error:
        checkpoints = os.path.join(run_dir, CHECKPOINTS)
        raise ValueError(f"--init-from {init_from}: {error}. Was it copied whole? Copy it "
                         f"again, or start from one of the checkpoints in {checkpoints}: "
                         "--init-from with the path of its .weights.h5 file") from None
    except ValueError as error:
        raise ValueError(f"--init-from {init_from}: {path} does not fit this model "
                         f"({_first_line(error)})") from None
    model.set_weights(source.get_weights())
    return path
