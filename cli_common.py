"""What the command lines (train.py, export.py, translate.py, evaluate.py) share.

Kept outside the package on purpose: importing `keras_transformer` imports
TensorFlow, and `--help` or a bad flag should answer at once.
"""

import argparse
import atexit
import os
import re
import sys
import threading
import warnings

# TensorFlow's C++ start-up logs drown the output; TF_CPP_MIN_LOG_LEVEL=0 brings them back.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow's default CPU allocator hands large freed buffers back to the system, so
# every training step page-faults them in again (the base model's (tokens, vocabulary)
# logits and their gradient alone: ~0.8 s a step on 2 cores); its BFC allocator keeps
# them for the next step. Read when TensorFlow starts; TF_CPU_ALLOCATOR_USE_BFC=false
# turns it off.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")


def corpus_source(data):
    """A corpus flag (train.py --data, evaluate.py --test) as the `source` of
    `keras_transformer.data.load_parallel`: 'bundled', 'tfds:NAME[/CONFIG]',
    'SOURCE_FILE,TARGET_FILE' or one tab-separated file; paths may hold '{split}'."""
    if data == "bundled" or data.startswith("tfds:"):
        return data
    paths = data.split(",")
    if len(paths) > 2:
        raise ValueError(f"a corpus is one tab-separated file or two files "
                         f"'SOURCE,TARGET'. Received: {data!r}")
    return tuple(paths) if len(paths) == 2 else paths[0]


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad flags give one line naming the problem, not the whole usage; every
    command line has --verbose (see `quiet_libraries`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_argument("--verbose", action="store_true", default=False,
                          help="show TensorFlow's and sentencepiece's own log lines")

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


# Lines that TensorFlow's and sentencepiece's C++ code writes to stderr whatever
# TF_CPP_MIN_LOG_LEVEL says (absl's messages before its log is initialized, CUDA
# probes on a CPU-only machine, oneDNN notices, sentencepiece's LOG(INFO)), through
# the end of the line: they can also start in the middle of a progress bar's line.
LIBRARY_LOG_LINE = re.compile(
    rb"(?:[IWE]\d{4} [\d:.]+ +\d+ [\w.+-]+:\d+\]"
    rb"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    rb"|[\w.+-]+\(\d+\) LOG\(INFO\) )[^\n]*\n?"
)
# Python warnings a user of the command lines cannot act on.
_UNACTIONABLE_WARNINGS = (
    r"`shuffle=True` was passed, but will be ignored",  # our batches come shuffled
    r"Your input ran out of data",  # the finite dev set ends each evaluation
)


def quiet_libraries():
    """Keeps the libraries' own log lines and unactionable warnings off stderr.

    C++ code writes to file descriptor 2 directly, so the descriptor is redirected
    to a pipe whose reader passes on every line but the libraries' log lines
    (`LIBRARY_LOG_LINE`); child processes inherit the filter. The command lines'
    `--verbose` skips this.
    """
    for message in _UNACTIONABLE_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    original = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward():
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                line = LIBRARY_LOG_LINE.sub(b"", line)
                if line:
                    os.write(original, line)

    thread = threading.Thread(target=forward, name="stderr-filter", daemon=True)
    thread.start()

    def restore():
        sys.stderr.flush()
        os.dup2(original, 2)  # closes the pipe's last write end: the reader ends
        thread.join(timeout=5)

    atexit.register(restore)
