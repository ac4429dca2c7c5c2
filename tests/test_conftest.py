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
