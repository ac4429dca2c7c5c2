"""The paper's recipe with `keras-transformer train` as a user runs it on a GPU,
and PyTorch on the same card, printed as JSON.

    python benchmarks/gpu_training.py                        # base model, 25000 tokens
    python benchmarks/gpu_training.py --model tiny --cold-seconds 60 --warm-seconds 30 \\
        --torch-steps 0                                      # a quick smoke run (CPU too)

1. Cold: `train --model M --tokens-per-batch N --warmup-steps 4000 --strategy auto` (the
   paper's warm-up; train's default, 300, is the CPU recipes') on the bundled corpus
   with an empty `--compilation-cache`, stopped (SIGINT, as Ctrl-C) after
   `--cold-seconds` if it has not finished. Reported: the seconds from the command
   to its first step (its "First step done" line), to each progress line, and its
   own account of where the time went.
2. Warm: the same command again (a resume from the last checkpoint, if the cold
   run reached one), the compile cache now filled; stopped after `--warm-seconds`.
3. Sustained target tokens/s: log.csv's `target_tokens_per_second` (an interval's
   non-padding target tokens over the wall-clock time of its steps; dev passes and
   checkpoints left out), per checkpoint interval of both runs; `sustained` is the
   median of the intervals after each run's first (which holds its compilations).
   `interval_split_seconds`: where such an interval's wall clock went (its steps, its
   dev pass, its checkpoint, the rest), from log.csv's times.
4. PyTorch: `torch_transformer.py` (bf16 autocast, `torch.compile`) at the run's
   most frequent batch shape, a fixed random batch without padding, in its own
   process; `ours_over_torch` compares our sustained non-padding tokens/s with its
   tokens/s, so our padding counts against us.

MFU: our sustained padded-token rate times the FLOPs of a padded target token at the
most frequent shape (train_throughput.py's `forward_flops`, x3), over the datasheet
peak of the compute dtype (benchmarks/machine.py).
"""

import argparse
import csv
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]

from keras_transformer import run_files  # noqa: E402
from keras_transformer.config import PAPER_WARMUP_STEPS  # noqa: E402
from machine import cpu_flags  # noqa: E402
from machine import datasheet_peak  # noqa: E402
from machine import nvidia_smi  # noqa: E402

SHAPES = re.compile(r"Batches in \d+ shapes \(rows x length\): ([\dx, ]+); padding "
                    r"([\d.]+)% of source and ([\d.]+)% of target tokens")
# TensorFlow's modules that log each XLA program's compilation, and its load from the
# persistent cache, with their times (the warm start's profile on a CPU,
# docs/gpu-and-distribution.md).
WARM_VMODULE = "device_compiler=3,device_executable_persistor=3,xla_compiler=2"
FIRST_STEP = re.compile(r"First step done (\d+) s after the command started")


def run_train(flags, seconds, log_path, vmodule=""):
    """Runs `keras-transformer train FLAGS`, stopping it with SIGINT after `seconds`;
    returns what its output says, each line with the seconds since the start. With
    `vmodule` (TF_CPP_VMODULE), the run is `--verbose` and TensorFlow's log lines of
    those modules, stamped like the rest, go to the log too."""
    command = [sys.executable, "-m", "keras_transformer", "train", *flags]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if vmodule:
        command.append("--verbose")
        env.update(TF_CPP_VMODULE=vmodule, TF_CPP_MIN_LOG_LEVEL="0")
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, start_new_session=True)
    interrupted = False

    def stop(*_):
        nonlocal interrupted
        if interrupted:  # still there 30 s after Ctrl-C
            process.kill()
            return
        interrupted = True
        process.send_signal(signal.SIGINT)
        signal.alarm(30)

    signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    lines = []
    with open(log_path, "w") as log:
        for line in process.stdout:
            stamped = (round(time.monotonic() - start, 1), line.rstrip("\n"))
            lines.append(stamped)
            log.write(f"{stamped[0]:8.1f}  {stamped[1]}\n")
            log.flush()
    returncode = process.wait()
    signal.alarm(0)
    report = {"command": " ".join(["keras-transformer", "train", *flags]),
              "returncode": returncode, "stopped_after_seconds": seconds if interrupted else None,
              "seconds": round(time.monotonic() - start, 1), "first_line": lines[0][1] if lines else ""}
    for at, text in lines:
        if FIRST_STEP.match(text):
            report["first_step_seconds"] = int(FIRST_STEP.match(text).group(1))
        elif SHAPES.match(text):
            shapes, source, target = SHAPES.match(text).groups()
            report["shapes"] = [tuple(map(int, shape.split("x"))) for shape in shapes.split(", ")]
            report["padding"] = {"source": float(source) / 100, "target": float(target) / 100}
        elif text.startswith("step "):
            report.setdefault("progress", []).append({"seconds": at, "line": text})
        elif text.startswith(("Compiling the ", "Compiled in ", "Step ",
                              "The first dev pass")):  # XLA: all shapes ahead, or pauses
            report.setdefault("compilations", []).append({"seconds": at, "line": text})
        elif text.startswith(("Where the", "Trained ", "Resuming ")):
            report.setdefault("summary", []).append(text)
    return report


def train_xla_flags():
    """The XLA_FLAGS that train runs with (besides its compile cache's)."""
    from keras_transformer.cli.common import use_xla_gpu_flags

    environ = dict(os.environ)
    use_xla_gpu_flags(environ)
    return environ["XLA_FLAGS"]


TIMES = ("median_step_seconds", "dev_pass_seconds", "checkpoint_seconds")
STEP_TIMES = ("mean_step_seconds", "slowest_step_seconds")


def logged_intervals(run_dir):
    """log.csv's rows: step, target tokens/s, training and dev loss (whether the run
    learns), and where the interval's time went (its steps' median, its dev pass and
    its checkpoint), of each checkpoint interval."""
    path = os.path.join(run_dir, run_files.CSV_LOG)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [{"step": int(row["step"]), "elapsed_seconds": float(row["elapsed_seconds"]),
                 "target_tokens_per_second": float(row["target_tokens_per_second"]),
                 **{key: round(float(row[key]), 4) for key in ("loss", "val_loss")
                    if row.get(key)},
                 **{key: float(row[key]) for key in TIMES + STEP_TIMES if row.get(key)}}
                for row in csv.DictReader(f) if row.get("target_tokens_per_second")]


def interval_split(rows):
    """Where a steady checkpoint interval's wall clock went, the median of each part
    over `rows` (each after the first of its run): `wall` (from the last interval's
    end), `steps` (its steps' median times their number), `dev_pass`, `checkpoint`,
    and `between` (the rest: the time between steps, and fit's work at the epoch's
    ends); where log.csv has them, `steps_by_mean` (its steps' mean times their number:
    above `steps` where a few steps are slow) and `slowest_step`."""
    parts = []
    for before, row in zip(rows, rows[1:]):
        if not all(key in row for key in TIMES):
            continue
        wall = row["elapsed_seconds"] - before["elapsed_seconds"]
        steps = (row["step"] - before["step"]) * row["median_step_seconds"]
        parts.append({"wall": wall, "steps": steps, "dev_pass": row["dev_pass_seconds"],
                      "checkpoint": row["checkpoint_seconds"],
                      "between": wall - steps - row["dev_pass_seconds"]
                      - row["checkpoint_seconds"]})
        if all(key in row for key in STEP_TIMES):
            parts[-1].update(steps_by_mean=(row["step"] - before["step"])
                             * row["mean_step_seconds"],
                             slowest_step=row["slowest_step_seconds"])
    if not parts:
        return None
    return {key: round(statistics.median(part[key] for part in parts), 3) for key in parts[0]
            if all(key in part for part in parts)}


def torch_comparison(args, shape):
    rows, length = shape
    command = [sys.executable, os.path.join(HERE, "torch_transformer.py"), "--model", args.model,
               "--vocab-size", str(args.vocab_size), "--batch-size", str(rows),
               "--length", str(length), "--precisions", "bf16", "--compile", "on",
               "--warmup-steps", "3", "--steps", str(args.torch_steps)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.torch_seconds)
    except subprocess.TimeoutExpired:
        return {"error": f"over {args.torch_seconds} s", "command": " ".join(command)}
    if done.returncode:
        return {"error": done.stderr[-2000:], "command": " ".join(command)}
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--vocab-size", type=int, default=8000, help="train's default")
    parser.add_argument("--tokens-per-batch", type=int, default=25000)
    parser.add_argument("--steps", type=int, default=2000, help="the runs' --steps")
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--cold-seconds", type=int, default=240)
    parser.add_argument("--warm-seconds", type=int, default=120)
    parser.add_argument("--torch-steps", type=int, default=20, help="0: no PyTorch run")
    parser.add_argument("--torch-seconds", type=int, default=150)
    parser.add_argument("--work-dir", default=None, help="the run and the cache (default: a temp dir)")
    parser.add_argument("--log-dir", default=None, help="where the runs' stamped logs go")
    parser.add_argument("--warm-vmodule", default="",
                        help="TF_CPP_VMODULE for the warm run, which is then --verbose: for "
                             "where its start goes, e.g. " + WARM_VMODULE)
    args = parser.parse_args()

    work = args.work_dir or tempfile.mkdtemp(prefix="gpu_training_")
    logs = args.log_dir or work
    os.makedirs(work, exist_ok=True)
    os.makedirs(logs, exist_ok=True)
    run_dir, cache = os.path.join(work, "run"), os.path.join(work, "xla-cache")
    flags = ["--model", args.model, "--vocab-size", str(args.vocab_size),
             "--tokens-per-batch", str(args.tokens_per_batch),
             "--warmup-steps", str(PAPER_WARMUP_STEPS),
             "--strategy", "auto",
             "--steps", str(args.steps), "--checkpoint-every", str(args.checkpoint_every),
             "--test-sentences", "0", "--alpha-sentences", "0",  # the training only
             "--compilation-cache", cache, "--out", run_dir]
    report = {"benchmark": "gpu_training", "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(sys.argv), "machine": cpu_flags(), "gpu": nvidia_smi(),
              "xla_flags": train_xla_flags()}
    report["cold"] = run_train(flags, args.cold_seconds, os.path.join(logs, "train_cold.log"))
    cold_rows = logged_intervals(run_dir)
    report["warm"] = run_train(flags, args.warm_seconds, os.path.join(logs, "train_warm.log"),
                               args.warm_vmodule)
    rows = logged_intervals(run_dir)
    report["intervals"] = {"cold": cold_rows, "warm": rows[len(cold_rows):]}
    steady = [row["target_tokens_per_second"] for part in report["intervals"].values()
              for row in part[1:]]
    if steady:
        report["sustained_target_tokens_per_second"] = statistics.median(steady)
        report["sustained_intervals"] = len(steady)
        report["interval_split_seconds"] = interval_split(
            [row for part in report["intervals"].values() for row in part[1:]])
    shapes = report["cold"].get("shapes")
    if shapes:
        from train_throughput import forward_flops

        from keras_transformer.config import TransformerConfig

        # train prints its shapes, not how often each comes: the median length stands in.
        rows_, length = sorted(shapes, key=lambda shape: shape[1])[len(shapes) // 2]
        report["torch_shape"] = [rows_, length]
        config = TransformerConfig.preset(args.model, vocab_size=args.vocab_size)
        flops_per_padded_token = 3 * forward_flops(config, rows_, length, length) / (rows_ * length)
        name = report["gpu"].get("nvidia_smi_name", "")
        peak = datasheet_peak(name, "bf16") if name else None
        if steady and peak:
            padded = report["sustained_target_tokens_per_second"] / (
                1 - report["cold"]["padding"]["target"])
            report["mfu_bf16_datasheet"] = round(padded * flops_per_padded_token / peak["flops"], 4)
            report["mfu_peak"] = peak["source"]
        if args.torch_steps:
            report["torch"] = torch_comparison(args, (rows_, length))
            torch_runs = [r for r in report["torch"].get("results", ()) if r.get("status") == "ok"]
            if torch_runs and steady:
                report["ours_over_torch"] = round(report["sustained_target_tokens_per_second"]
                                                  / torch_runs[0]["target_tokens_per_second"], 3)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
