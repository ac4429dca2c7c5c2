"""`python -m keras_transformer COMMAND [FLAGS]`: the `keras-transformer` command."""

import sys

from keras_transformer.cli import main

sys.exit(main(prog="python -m keras_transformer"))
