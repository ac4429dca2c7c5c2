import json
import os
import socket
import subprocess
import sys

import pytest
import tensorflow as tf

from keras_transformer import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "replica_equivalence.py")
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           TF_CPP_MIN_LOG_LEVEL="2")


def last_json_line(output):
    return json.loads(output.strip().splitlines()[-1])


def check_equal_to_one_device(result, num_replicas):
    assert result["num_replicas"] == num_replicas
    assert result["largest_update"] > 1e-3  # the weights did move
    assert result["largest_difference"] < 1e-5, result
    assert abs(result["loss"][0] - result["loss"][1]) < 1e-5, result
    # Replicas see unequal token counts, so a per-replica mean would not match.
    assert len({n for batch in result["tokens_per_replica"] for n in batch}) > 1, result


def test_strategy_choices():
    assert isinstance(distributed.make_strategy("one_device"), tf.distribute.OneDeviceStrategy)
    if not tf.config.list_logical_devices("GPU"):
        # On a CPU, auto is TensorFlow's default strategy: no prefetching iterator of
        # its own (see make_strategy).
        assert distributed.make_strategy("auto") is tf.distribute.get_strategy()
    with pytest.raises(ValueError, match="Unknown strategy 'gpu8'"):
        distributed.make_strategy("gpu8")


@pytest.mark.slow
def test_mirrored_replicas_equal_one_device():
    """8 logical CPU replicas make the same two updates as one device (separate
    process: logical devices must be configured before TensorFlow starts)."""
    output = subprocess.run(
        [sys.executable, SCRIPT, "mirrored", "8"],
        capture_output=True, text=True, env=ENV, check=True, timeout=600,
    ).stdout
    check_equal_to_one_device(last_json_line(output), num_replicas=8)


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.slow
def test_multi_worker_equals_one_device():
    """Two worker processes on localhost (MultiWorkerMirroredStrategy from
    TF_CONFIG) make the same two updates and log the same loss as one device."""
    workers = ",".join(f"localhost:{port}" for port in free_ports(2))
    processes = [
        subprocess.Popen([sys.executable, SCRIPT, "multi_worker", str(index), workers],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        for index in range(2)
    ]
    try:
        outputs = [process.communicate(timeout=600) for process in processes]
    finally:
        for process in processes:
            process.kill()
    for process, (stdout, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-3000:]
        check_equal_to_one_device(last_json_line(stdout), num_replicas=2)
