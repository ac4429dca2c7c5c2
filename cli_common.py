"""What the command lines (train.py, export.py, translate.py, evaluate.py) share.

Kept outside the package on purpose: importing `keras_transformer` imports
TensorFlow, and `--help` or a bad flag should answer at once.
"""

import argparse
import os

# TensorFlow's C++ start-up logs drown the output; TF_CPP_MIN_LOG_LEVEL=0 brings them back.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow's default CPU allocator hands large freed buffers back to the system, so
# every training step page-faults them in again (the base model's (tokens, vocabulary)
# logits and their gradient alone: ~0.8 s a step on 2 cores); its BFC allocator keeps
# them for the next step. Read when TensorFlow starts; TF_CPU_ALLOCATOR_USE_BFC=false
# turns it off.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad flags give one line naming the problem, not the whole usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see --help)\n")
