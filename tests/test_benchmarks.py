"""The benchmark scripts run and print the JSON they promise (speed targets are met
in benchmark runs, never in tests)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_train_throughput_prints_json():
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "train_throughput.py"),
               "--model", "tiny", "--vocab-size", "300", "--batch-size", "8", "--length", "16",
               "--warmup-steps", "1", "--steps", "2", "--xla", "off,on"]
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    output = subprocess.run(command, capture_output=True, text=True, env=env, check=True,
                            timeout=600).stdout
    report = json.loads(output)
    assert report["tokens_per_batch"] == 8 * 16
    assert [r["xla"] for r in report["results"]] == [False, True]
    for result in report["results"]:
        assert len(result["step_seconds"]) == 2
        assert result["target_tokens_per_second"] == pytest.approx(
            128 / result["seconds_per_step"], rel=1e-2)
        assert 0 < result["mfu"] < 1
