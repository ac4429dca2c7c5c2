"""`keras-transformer train` from a clone: `python train.py --help` (keras_transformer/cli/train.py)."""

import sys

from keras_transformer.cli import train

if __name__ == "__main__":
    sys.exit(train.main(prog="train.py"))
