"""`keras-transformer export` from a clone: `python export.py --help` (keras_transformer/cli/export.py)."""

import sys

from keras_transformer.cli import export

if __name__ == "__main__":
    sys.exit(export.main(prog="export.py"))
