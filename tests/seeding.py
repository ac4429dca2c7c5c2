"""The tests' seeding: `reseed`, Keras's `set_random_seed` less TensorFlow's cache clear."""

import random

import numpy as np


def reseed(seed):
    """Seeds Python, NumPy and Keras as `keras.utils.set_random_seed(seed)` does,
    but leaves TensorFlow's global seed as it is.

    `tf.random.set_seed`, which `set_random_seed` calls, also clears TensorFlow's
    cache of eager kernels, and with it every traced function this process has
    run: the next call of each one optimizes its graph again, seconds for a
    translator's signature. Each test is reseeded (conftest.py) and each tiny
    model is built reseeded (translation_fixtures.py): reseeded with
    `set_random_seed`, the fast tests took 8.6 and 9.0 minutes on a 2-core Zen 4
    (two runs, 2026-12-07), and 7.1 this way. TensorFlow's seed matters only to its
    random ops given no seed, which no test reads for their values; conftest.py
    sets it once per process.

    Keras's weights and `keras.random` draw from Python's `random` and from
    Keras's global seed generator; Keras keeps both in its `global_state`,
    private, hence `test_reseed_draws_what_set_random_seed_draws`.
    """
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator
    from keras.src.utils import rng_utils

    global_state.set_global_attribute(rng_utils.GLOBAL_RANDOM_SEED, seed)
    global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)
    random.seed(seed)
    np.random.seed(seed)
