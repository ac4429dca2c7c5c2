"""How long a resumed run takes to reach its first training step, near the start
and far into a run, printed as JSON.

    python benchmarks/resume_time.py                       # step 10 against step 20000
    python benchmarks/resume_time.py --far-step 100000 --repeats 3

It trains a small run on the bundled corpus for `--near-step` steps, then makes a
copy whose checkpoint says step `--far-step` (the same weights, the optimizer's
step counter rewritten), and resumes each for one step with `train.py`, in turn,
`--repeats` times. The time measured is from starting `train.py` to its first
progress line, which it prints after the first step: start-up, vocabulary,
restore, the input pipeline's seek and the graph build. `TrainingBatches` plans
one epoch, whatever the step, so the two should match; `stream_skip_seconds` is
what the pipeline before it paid to reach the far step (a tf.data stream read from
its start and skipped, as `make_batches(...).repeat().skip(step)`).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from machine import cpu_flags  # noqa: E402

from keras_transformer.cli.common import use_command_environment  # noqa: E402

use_command_environment()  # as the commands: TensorFlow quiet, its BFC allocator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = [sys.executable, os.path.join(ROOT, "train.py")]
# No test BLEU and no decoding chosen at the end: only the time to the first step counts.
RUN_FLAGS = ["--model", "tiny", "--vocab-size", "2000", "--test-sentences", "0",
             "--alpha-sentences", "0", "--average-last", "1"]


def train(out, steps):
    """Runs train.py to `steps`; returns seconds to its first progress line and in all."""
    start = time.perf_counter()
    process = subprocess.Popen(
        [*TRAIN, *RUN_FLAGS, "--out", out, "--steps", str(steps)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=ROOT))
    first_step = None
    for line in process.stdout:
        if first_step is None and line.startswith("step "):
            first_step = time.perf_counter() - start
    stderr = process.stderr.read()
    if process.wait():
        sys.exit(f"train.py failed:\n{stderr}")
    return first_step, time.perf_counter() - start


def move_checkpoint(run, old_step, new_step):
    """Makes `run`'s checkpoint at `old_step` one at `new_step`."""
    import h5py

    from keras_transformer.runs import Run  # TensorFlow's import, quiet by now

    checkpoints = Run(run).checkpoints
    old, new = checkpoints.path(old_step), checkpoints.path(new_step)
    os.replace(checkpoints.rng_path(old), checkpoints.rng_path(new))
    os.replace(old, new)
    with h5py.File(new, "r+") as weights:
        iterations = weights["optimizer/vars/0"]  # the optimizer's step counter
        assert iterations[()] == old_step, iterations[()]
        iterations[()] = new_step


def stream_skip_seconds(step):
    """Seconds to the first batch after `step` of a stream read from its start."""
    sys.path.insert(0, ROOT)
    from keras_transformer import data

    pairs = data.load_parallel("bundled", "train")
    tokenizer = data.SubwordTokenizer.train(pairs.take(5000), vocab_size=2000)
    start = time.perf_counter()
    batches = data.make_batches(pairs, tokenizer, 4096, 128, seed=1, deterministic=True)
    next(iter(batches.repeat().skip(step)))
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--near-step", type=int, default=10)
    parser.add_argument("--far-step", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-stream-skip", action="store_true",
                        help="do not time the old way (minutes at 20000 steps)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        near, far = os.path.join(scratch, "near"), os.path.join(scratch, "far")
        train(near, args.near_step)
        shutil.copytree(near, far)
        move_checkpoint(far, args.near_step, args.far_step)
        times = {"near": [], "far": []}
        for _ in range(args.repeats):
            for name, run, step in (("near", near, args.near_step), ("far", far, args.far_step)):
                copy = os.path.join(scratch, "resumed")
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(run, copy)
                times[name].append(train(copy, step + 1))

    def summary(step, measured):
        first = [first for first, _ in measured]
        return {"step": step, "seconds_to_first_step": [round(t, 2) for t in first],
                "best_seconds_to_first_step": round(min(first), 2),
                "process_seconds": [round(total, 2) for _, total in measured]}

    report = {
        "benchmark": "resume_time",
        "machine": cpu_flags(),
        "run": " ".join(RUN_FLAGS) + " (bundled corpus, 4096-token batches)",
        "near": summary(args.near_step, times["near"]),
        "far": summary(args.far_step, times["far"]),
    }
    report["far_over_near"] = round(report["far"]["best_seconds_to_first_step"]
                                    / report["near"]["best_seconds_to_first_step"], 3)
    if not args.no_stream_skip:
        report["stream_skip_seconds"] = round(stream_skip_seconds(args.far_step), 1)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
