"""`keras-transformer evaluate` from a clone: `python evaluate.py --help` (keras_transformer/cli/evaluate.py)."""

import sys

from keras_transformer.cli import evaluate

if __name__ == "__main__":
    sys.exit(evaluate.main(prog="evaluate.py"))
