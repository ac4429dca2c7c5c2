"""The run directory that `train.py` writes and everything else reads.

    RUN/config.json           {"model": TransformerConfig, "training": TrainingConfig}
    RUN/vocab/                the shared subword vocabulary (`SubwordTokenizer.save`)
    RUN/checkpoints/          ckpt-<step>.weights.h5 (model and optimizer) and .rng.npy
    RUN/logs/, RUN/log.csv    TensorBoard and CSV logs, one row per checkpoint
    RUN/averaged.weights.h5   the average of the last checkpoints (Sec. 6.1)
    RUN/model.keras           the final model, compiled, with its optimizer

Here are the file names, loading a run (`load_run`), writing its config whole or
not at all (`write_config`), and what a run started again with the same
directory may change (`resolve_configs`: only how long it trains).

Runs last days, so their files are written to survive a kill at any moment:
each to a temporary name that carries the writer's pid, fsynced, then renamed
(`write_atomically`), and `RunLock` keeps a second trainer out of a directory
that one is writing (`RUN/.lock` names the holder).
"""

import atexit
import dataclasses
import datetime
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import sys

import keras

from keras_transformer.config import TrainingConfig
from keras_transformer.config import TransformerConfig
from keras_transformer.data import SubwordTokenizer
from keras_transformer.model import build_transformer

CONFIG = "config.json"
LOCK = ".lock"
VOCAB = "vocab"
CHECKPOINTS = "checkpoints"
TENSORBOARD_LOGS = "logs"
CSV_LOG = "log.csv"
AVERAGED_WEIGHTS = "averaged.weights.h5"
FINAL_MODEL = "model.keras"
WEIGHTS = {"averaged": AVERAGED_WEIGHTS, "final": FINAL_MODEL}
# A file's or directory's temporary name while it is written: NAME.tmp-PID[.SUFFIX].
TEMPORARY = re.compile(r"\.tmp-(\d+)(?:\.|$)")
# Suffixes that a writer needs on the temporary name too (Keras checks them).
_SUFFIXES = (".weights.h5", ".keras", ".json", ".npy", ".csv")
# What a resumed run may change: how long it trains.
RESUMABLE_CHANGES = ("steps", "time_budget", "time_budget_clock")


def load_run(run_dir, weights="averaged"):
    """Loads the model and tokenizer of a training run directory.

    Args:
        run_dir: the run directory.
        weights: "averaged" (the paper's checkpoint average) or "final".

    Returns:
        `(model, tokenizer, run_config)`, the last the parsed config.json.
    """
    if weights not in WEIGHTS:
        raise ValueError(
            f"weights must be one of {sorted(WEIGHTS)}. Received: weights={weights!r}"
        )
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    config_path = os.path.join(run_dir, CONFIG)
    run_config = read_config(run_dir)
    if run_config is None:
        raise FileNotFoundError(
            f"{config_path} not found; is {run_dir} a run directory written by train.py?"
        )
    if not isinstance(run_config, dict) or "model" not in run_config:
        raise ValueError(f"{config_path} has no \"model\" entry (the TransformerConfig)")
    config = TransformerConfig.from_dict(run_config["model"])
    tokenizer = SubwordTokenizer.load(os.path.join(run_dir, VOCAB))
    weights_path = os.path.join(run_dir, WEIGHTS[weights])
    if not os.path.exists(weights_path):
        other = "final" if weights == "averaged" else "averaged"
        raise FileNotFoundError(
            f"{weights_path} not found; the run has no {weights} weights "
            f"(try weights={other!r})"
        )
    if weights == "final":
        model = keras.saving.load_model(weights_path)
    else:
        model = build_transformer(config)
        model.load_weights(weights_path)
    if model.config != config:
        raise ValueError(
            f"{weights_path} holds a model whose config differs from {config_path}"
        )
    return model, tokenizer, run_config


def load_vocabulary(run_dir, pairs, config, chief=True, wait=lambda: None):
    """The run's shared subword vocabulary (`RUN/vocab/`): the chief trains it on
    `pairs` (with `config`'s vocab_size, vocab_sentences and seed) when the run
    has none; `wait()` then holds every worker until it exists."""
    vocab_dir = os.path.join(run_dir, VOCAB)
    if chief and not os.path.exists(vocab_dir):
        print(f"Training a {config.vocab_size}-token shared vocabulary...", flush=True)
        tokenizer = SubwordTokenizer.train(pairs, vocab_size=config.vocab_size,
                                           max_sentences=config.vocab_sentences, seed=config.seed)
        write_atomically(vocab_dir, tokenizer.save)
    wait()
    if not os.path.exists(vocab_dir):
        raise ValueError(f"{vocab_dir} is missing on this worker: on a multi-worker run, "
                         "the run directory must be one that every worker shares")
    return SubwordTokenizer.load(vocab_dir)


def vocabulary_digest(vocab_dir):
    """The sha256 of a vocabulary directory's files (names and contents), hex."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(vocab_dir)):
        digest.update(name.encode() + b"\0")
        with open(os.path.join(vocab_dir, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def check_same_vocabulary(run_dir, saved):
    """Refuses to resume `run_dir` when its vocabulary is not the one the run's
    config.json recorded."""
    recorded = (saved or {}).get("vocab_sha256")
    if recorded is None:  # a new run, or one from before the digest was recorded
        return
    actual = vocabulary_digest(os.path.join(run_dir, VOCAB))
    if recorded != actual:
        raise ValueError(
            f"{os.path.join(run_dir, VOCAB)} is not the vocabulary this run was trained with "
            f"(sha256 {actual[:12]}..., {CONFIG} records {recorded[:12]}...); put the run's own "
            "vocabulary back, or pass a new --out")


def read_config(run_dir):
    """The parsed config.json of `run_dir`, or None when there is none."""
    path = os.path.join(run_dir, CONFIG)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def write_config(run_dir, model_config, training_config):
    """Writes config.json whole or not at all, with the sha256 of the run's
    vocabulary when it has one."""
    values = {"model": model_config.to_dict(), "training": training_config.to_dict()}
    if os.path.isdir(os.path.join(run_dir, VOCAB)):
        values["vocab_sha256"] = vocabulary_digest(os.path.join(run_dir, VOCAB))

    def write(path):
        with open(path, "w") as f:
            json.dump(values, f, indent=2, sort_keys=True)

    os.makedirs(run_dir, exist_ok=True)
    write_atomically(os.path.join(run_dir, CONFIG), write)


# Files that survive a kill -------------------------------------------------------


def write_atomically(path, write):
    """Calls `write(temporary)` and moves the file or directory it wrote to `path`:
    fsynced, then renamed, so that `path` is whole or absent whatever happens.

    The temporary name is `path`'s with `.tmp-<pid>` before its suffix
    (`ckpt-00000010.tmp-123.weights.h5`), so that Keras accepts it and
    `remove_temporaries` recognizes it. A directory replaces nothing: `path`
    must not exist.
    """
    directory, name = os.path.split(os.path.abspath(path))
    suffix = next((s for s in _SUFFIXES if name.endswith(s)), "")
    temporary = os.path.join(directory, f"{name[:len(name) - len(suffix)]}.tmp-{os.getpid()}"
                                        f"{suffix}")
    try:
        write(temporary)
        _fsync_tree(temporary)
        os.replace(temporary, path)
        _fsync(directory)
    finally:
        if os.path.isdir(temporary):
            shutil.rmtree(temporary, ignore_errors=True)
        elif os.path.exists(temporary):
            os.remove(temporary)


def remove_temporaries(run_dir):
    """Removes what killed writers left (`*.tmp-<pid>*`) from a run directory and
    its checkpoints; call it holding the run's lock. Returns the names removed."""
    removed = []
    for directory in (run_dir, os.path.join(run_dir, CHECKPOINTS)):
        if not os.path.isdir(directory):
            continue
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if not TEMPORARY.search(name):
                continue
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
            removed.append(os.path.relpath(path, run_dir))
    return removed


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path):
    if os.path.isdir(path):
        for name in os.listdir(path):
            _fsync_tree(os.path.join(path, name))
    _fsync(path)


class RunLockedError(ValueError):
    """Another live trainer holds the run directory."""


class RunLock:
    """One writer per run directory: an exclusive `flock` on `RUN/.lock`, held
    until `release` or the end of the process (the system drops it however the
    process ends). The file names the holder's host, pid and start time.

    `acquire` raises `RunLockedError`, naming the holder, while another process
    holds it; a lock file that a process left without holding it any more (it
    was killed) is taken over, with a notice on stderr.
    """

    def __init__(self, run_dir):
        self.path = os.path.join(run_dir, LOCK)
        self._fd = None

    def acquire(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_text(fd) or "another process"
            os.close(fd)
            raise RunLockedError(
                f"{os.path.dirname(self.path)} is in use by {holder}; wait for that trainer "
                "to end, or pass another --out") from None
        previous = _read_text(fd)
        if previous:
            print(f"Taking over {self.path} from {previous}, which is no longer running.",
                  file=sys.stderr, flush=True)
        os.ftruncate(fd, 0)
        since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}".encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self):
        """Empties the lock file (a clean end) and drops the lock."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def lock_for_writing(run_dir):
    """Takes `run_dir`'s `RunLock` until the process ends (unless this process
    holds it already) and removes what killed writers left there; returns the lock."""
    key = os.path.realpath(run_dir)
    if key in _HELD:
        return _HELD[key]
    lock = _HELD[key] = RunLock(run_dir).acquire()
    atexit.register(lock.release)
    removed = remove_temporaries(run_dir)
    if removed:
        print(f"Removed what an interrupted writer left in {run_dir}: {', '.join(removed)}.",
              file=sys.stderr, flush=True)
    return lock


_HELD = {}  # realpath -> the RunLock this process holds until it ends


def _read_text(fd):
    return os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()


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
    saved = read_config(run_dir)
    config = _training_config(run_dir, fields, explicit, saved)
    model_config = _model_config(config, model_overrides or {}, model_config_file, saved,
                                 "model" in explicit, cores)
    return config, model_config, saved


def check_same_model(run_dir, saved, model_config):
    """Refuses to resume `run_dir` with a model of another shape or with another
    vocabulary than its config.json recorded."""
    check_same_vocabulary(run_dir, saved)
    if saved is None or saved["model"] == model_config.to_dict():
        return
    differ = {name: value for name, value in model_config.to_dict().items()
              if saved["model"].get(name) != value}
    raise ValueError(f"{run_dir} holds a model of another shape ({differ} differ from "
                     f"{os.path.join(run_dir, CONFIG)}); pass a new --out to train this one")


def _training_config(run_dir, fields, explicit, saved):
    if saved is None:
        return TrainingConfig(**fields)
    config = TrainingConfig.from_dict(saved["training"])
    changed = {n: fields[n] for n in set(explicit) - set(RESUMABLE_CHANGES)
               if fields[n] != getattr(config, n)}
    if changed:
        raise ValueError(
            f"{run_dir} holds a run with other settings ({changed} differ from "
            f"{os.path.join(run_dir, CONFIG)}); pass a new --out, or only --steps or "
            "--time-budget to train it longer"
        )
    return dataclasses.replace(
        config, **{n: fields[n] for n in set(explicit) & set(RESUMABLE_CHANGES)})


def _model_config(config, overrides, model_config_file, saved, model_named, cores):
    """The preset (or the file), then the overrides; a resumed run keeps its own
    (other shape flags are refused by `check_same_model`)."""
    derived = dict(vocab_size=config.vocab_size,
                   max_positions=max(config.max_sentence_tokens, 256))
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
    cores = cores or len(os.sched_getaffinity(0))
    return TransformerConfig.preset(config.model_preset(cores=cores), **derived, **overrides)
