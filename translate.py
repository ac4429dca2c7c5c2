"""`keras-transformer translate` from a clone: `python translate.py --help` (keras_transformer/cli/translate.py)."""

import sys

from keras_transformer.cli import translate

if __name__ == "__main__":
    sys.exit(translate.main(prog="translate.py"))
