"""The names that pick a corpus, the one home of each: the bundled corpus, the
prefix of a TFDS dataset, and the placeholder in file paths that each split
replaces (`data.load_parallel`'s sources, train's --data, evaluate's --test).

Imports nothing: the command lines check their flags before TensorFlow starts.
"""

BUNDLED = "bundled"
TFDS_PREFIX = "tfds:"
SPLIT_PLACEHOLDER = "{split}"
