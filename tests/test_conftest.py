"""tests/conftest.py's settings for the test processes themselves."""

import os

import tensorflow as tf


def test_each_xdist_worker_takes_its_share_of_the_cores():
    """scripts/test.sh runs a worker per core: each worker's TensorFlow thread
    pools are its share of the cores (1 of 2), not as wide as the machine;
    a process of its own (the `alone` tests, a plain pytest) keeps TensorFlow's
    default (0: every core)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = len(os.sched_getaffinity(0))
    expected = max(1, cores // workers) if workers > 1 else 0
    assert tf.config.threading.get_intra_op_parallelism_threads() == expected
    assert tf.config.threading.get_inter_op_parallelism_threads() == expected


def test_reseed_draws_what_set_random_seed_draws():
    """`seeding.reseed` seeds Keras through its private `global_state`: a Keras
    that kept its seeds elsewhere would draw other weights and numbers here."""
    import random

    import keras
    import numpy as np
    from keras.src.utils import rng_utils

    from tests.seeding import reseed

    def draws():
        layer = keras.layers.Dense(3)
        layer.build((None, 4))
        return (layer.kernel.numpy(), keras.random.uniform((5,)).numpy(),
                keras.random.normal((2,), seed=None).numpy(), np.random.rand(3), random.random())

    drawn = []
    for seed in (7, 8):
        keras.utils.set_random_seed(seed)
        expected = draws()
        keras.utils.set_random_seed(seed + 100)  # what reseed must replace
        reseed(seed)
        assert rng_utils.get_random_seed() == seed  # Keras's get_random_seed is private
        got = draws()
        for want, have in zip(expected, got):
            np.testing.assert_array_equal(have, want)
        drawn.append(got[0])
    assert not np.array_equal(*drawn)  # the seed matters
