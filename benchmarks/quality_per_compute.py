"""Translation quality per CPU-second: this Transformer (train.py) against the
keras.io example "English-to-Spanish translation with KerasHub", trained on the
same corpus for the same CPU time, scored with sacreBLEU, printed as JSON and
plotted.

    python benchmarks/quality_per_compute.py              # bundled en-es, 1200 CPU-seconds each
    python benchmarks/quality_per_compute.py \
        --corpus 'benchmarks/corpora/messages-en-de/{split}.tsv.gz'
    python benchmarks/quality_per_compute.py --systems keras_hub --cpu-seconds 40 --test-pairs 10

The systems, each trained in a process of its own, one after the other:
- ours: `train.py` with its defaults, stopped by CPU time (`--time-budget
  MINUTES --time-budget-clock cpu`: at the first checkpoint after the process
  has used the budget), its last checkpoints averaged; beam search (beam 4,
  alpha 0.6). Its curve is kept checkpoints alone (`--curve-points` of them,
  spread over the run, the last included), each at the CPU-seconds that log.csv
  records for it; its score is the averaged weights', at the CPU-seconds of the
  last checkpoint.
- keras_hub: `keras_hub_nmt.py`, the example as published (lowercased text,
  WordPiece, one encoder and one decoder block, rmsprop, greedy decoding),
  stopped at the end of the first batch after the process has used the budget;
  its curve is its weights at a quarter, half and three quarters of the budget
  and at the end.

Compute is process CPU time (`time.process_time()` of the training process,
every thread): start-up and imports, vocabularies, graph building and
compilation, training and its dev evaluations count; scoring afterwards does
not. Both systems translate the first `--test-pairs` pairs of the corpus's test
split and are scored against the same cased, detokenized references; the
example outputs lowercase (as published), which is part of what is measured,
so a case-insensitive sacreBLEU is reported too.

Progress goes to stderr, the JSON alone to stdout; `--out-dir` (emptied of the
systems' earlier runs first) keeps the runs, hypotheses, `report.json` and the
plot.
"""

import argparse
import csv
import json
import logging
import os
import resource
import shlex
import shutil
import subprocess
import sys
import time

from machine import cpu_flags
import reporting

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# TensorFlow's and sentencepiece's log lines (a light import: no TensorFlow).
from keras_transformer.cli.common import LIBRARY_LOG_LINE  # noqa: E402
from keras_transformer.cli.common import use_command_environment  # noqa: E402

# As the commands (and train, which it runs with this environment): TensorFlow quiet,
# its BFC allocator.
use_command_environment()
# The training command, as pip installs it (`keras-transformer train`).
TRAIN_COMMAND = [sys.executable, "-m", "keras_transformer", "train"]
SYSTEMS = ("ours", "keras_hub")
LABELS = {"ours": "ours (keras-transformer train, beam 4)",
          "keras_hub": "keras.io KerasHub example (greedy)"}
# The fractions of the budget at which the keras_hub run's weights are kept.
KERAS_HUB_FRACTIONS = (0.25, 0.5, 0.75)
SAMPLES = 3
def log(message):
    print(f"quality_per_compute: {message}", file=sys.stderr, flush=True)


class OnceEach(logging.Filter):
    """Lets each distinct message through once: sacreBLEU warns that the keras.io
    example's output (tokenized, as published) looks tokenized at every scoring."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def filter(self, record):
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


# Scoring --------------------------------------------------------------------


def score(hypotheses, references):
    """sacreBLEU (13a, cased) with its signature, and the case-insensitive score."""
    import sacrebleu

    from keras_transformer import evaluation

    scores = evaluation.bleu_scores(hypotheses, references)
    lowercase = sacrebleu.metrics.BLEU(lowercase=True)
    return {
        "bleu": scores["bleu"],
        "bleu_lowercase": lowercase.corpus_score(hypotheses, [references]).score,
        "signature": scores["signature"],
        "signature_lowercase": str(lowercase.get_signature()),
    }


def write_lines(path, lines):
    with open(path, "w") as f:
        f.writelines(line.replace("\n", " ") + "\n" for line in lines)


def summary(final, curve, sources, hypotheses, references, directory):
    """The fields of a system's record shared by both systems."""
    write_lines(os.path.join(directory, "hypotheses.txt"), hypotheses)
    write_lines(os.path.join(directory, "references.txt"), references)
    return {
        **final,
        "test_pairs": len(references),
        "curve": curve,
        "samples": [{"source": s, "hypothesis": h, "reference": r}
                    for s, h, r in list(zip(sources, hypotheses, references))[:SAMPLES]],
        "hypotheses_file": os.path.join(directory, "hypotheses.txt"),
        "references_file": os.path.join(directory, "references.txt"),
    }


# Workers: one process per system --------------------------------------------


def load_pairs(args, split, limit=None):
    """`[(source, target)]` of a split of `--corpus`."""
    from keras_transformer import data

    if args.corpus == "bundled":
        dataset = data.load_parallel("bundled", split, source_language=args.source_language,
                                     target_language=args.target_language)
    else:
        dataset = data.load_parallel(args.corpus, split)
    if limit is not None:
        dataset = dataset.take(limit)
    return [(p["source"].decode("utf-8"), p["target"].decode("utf-8"))
            for p in dataset.as_numpy_iterator()]


def run_keras_hub(args, directory):
    """Trains the keras.io example in this process until its CPU time reaches the
    budget, then scores its saved weights (outside the budget)."""
    import keras_hub_nmt

    train_pairs = load_pairs(args, "train")
    dev_pairs = load_pairs(args, "dev")
    translator, budget = keras_hub_nmt.train(
        train_pairs, dev_pairs, args.cpu_seconds, directory, fractions=KERAS_HUB_FRACTIONS,
        seed=args.seed, log=lambda message: log(f"keras_hub: {message}"))
    trained_cpu_seconds = time.process_time()
    log(f"keras_hub: trained, {trained_cpu_seconds:.1f} CPU-seconds; translating")

    test_pairs = load_pairs(args, "test", args.test_pairs)
    sources = [source for source, _ in test_pairs]
    references = [target for _, target in test_pairs]
    lowered = [source for source, _ in keras_hub_nmt.lowercase(test_pairs)]
    points = budget.points
    curve = []
    for point in points:
        translator.model.transformer.load_weights(point["weights"])
        hypotheses = translator.translate(lowered)
        scores = score(hypotheses, references)
        curve.append({"cpu_seconds": round(point["cpu_seconds"], 2), "steps": point["steps"],
                      "bleu": scores["bleu"], "bleu_lowercase": scores["bleu_lowercase"]})
        log(f"keras_hub: step {point['steps']}: sacreBLEU {curve[-1]['bleu']:.2f}")
    # The weights loaded last are the final ones: the batched decoding must
    # give the example's one-sentence decoding.
    checked = lowered[:2]
    agree = sum(translator.translate_reference(s) == h
                for s, h in zip(checked, translator.translate(checked)))
    if agree != len(checked):
        log(f"keras_hub: WARNING: batched greedy decoding differs from the example's "
            f"decode_sequences on {len(checked) - agree} of {len(checked)} sentences")
    config = {**keras_hub_nmt.hyperparameters(),
              "vocabulary_tokens": {"source": translator.source_tokenizer.vocabulary_size(),
                                    "target": translator.target_tokenizer.vocabulary_size()},
              "parameters": translator.model.transformer.count_params(),
              "seed": args.seed}
    final = {**scores, "steps": curve[-1]["steps"], "cpu_seconds": curve[-1]["cpu_seconds"],
             "budget_checks": {"before_stop": budget.checked_before_stop,
                               "at_stop": points[-1]["cpu_seconds"]}}
    return {
        **summary(final, curve, sources, hypotheses, references, directory),
        "config": config,
        "decoding_check": {"sentences": len(checked), "agree": agree},
    }


def train_command(args, run_dir):
    """The train command line: its defaults, stopped by CPU time, no test BLEU."""
    command = [*TRAIN_COMMAND, "--data", args.corpus, "--out", run_dir,
               "--time-budget", repr(args.cpu_seconds / 60), "--time-budget-clock", "cpu",
               "--test-sentences", "0", "--keep-checkpoints", str(args.keep_checkpoints),
               "--average-last", str(min(5, args.keep_checkpoints))]
    if args.corpus == "bundled":
        for flag, value in (("--source-language", args.source_language),
                            ("--target-language", args.target_language)):
            if value:
                command += [flag, value]
    return command + shlex.split(args.ours_flags)


def read_log(path):
    """`{step: cpu_seconds}` from a run's log.csv (one row per checkpoint)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: train.py wrote no log")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or not {"step", "cpu_seconds"} <= set(rows[0]):
        raise ValueError(f"{path} has no step and cpu_seconds columns (columns: "
                         f"{sorted(rows[0]) if rows else 'none'}); this benchmark needs a "
                         "train.py that logs them")
    return {int(float(row["step"])): float(row["cpu_seconds"]) for row in rows}


def spread(items, count):
    """At most `count` of `items`, evenly spread, the first and last among them."""
    if len(items) <= count:
        return list(items)
    if count == 1:
        return [items[-1]]
    last = len(items) - 1
    return [items[round(i * last / (count - 1))] for i in range(count)]


def run_ours(args, directory):
    """Runs train.py for the budget in a child process, then scores each kept
    checkpoint and the averaged weights."""
    from keras_transformer import evaluation
    from keras_transformer import runs
    from keras_transformer import serving
    from keras_transformer import training

    run_dir = os.path.join(directory, "run")
    train_log = os.path.join(directory, "train.log")
    command = train_command(args, run_dir)
    log(f"ours: {shlex.join(command)} > {train_log}")
    with open(train_log, "w") as output:
        result = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT,
                                check=False)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode:
        with open(train_log) as f:
            tail = "".join(line for line in f.readlines()[-30:]
                           if not LIBRARY_LOG_LINE.match(line.encode()))
        raise RuntimeError(f"train.py failed (exit {result.returncode}); the end of "
                           f"{train_log}:\n{tail}")
    run = runs.Run(run_dir)
    cpu_by_step = read_log(run.csv_log)
    checkpoints = run.checkpoints.list()
    missing = [step for step, _ in checkpoints if step not in cpu_by_step]
    if missing:
        raise ValueError(f"{run_dir}/log.csv has no row for the checkpoints of steps {missing}")
    steps, cpu_seconds = checkpoints[-1][0], cpu_by_step[checkpoints[-1][0]]
    log(f"ours: trained {steps} steps, {cpu_seconds:.1f} CPU-seconds at the last checkpoint; "
        "translating")
    if cpu_seconds < args.cpu_seconds:
        log(f"ours: WARNING: train.py stopped at {cpu_seconds:.1f} CPU-seconds, before the "
            f"budget of {args.cpu_seconds:g} (its step limit?)")

    test_pairs = load_pairs(args, "test", args.test_pairs)
    sources = [source for source, _ in test_pairs]
    references = [target for _, target in test_pairs]
    model, tokenizer, run_config = run.load()
    translator = serving.Translator(model, tokenizer)  # beam 4, alpha 0.6 (Sec. 6.1)
    averaged = evaluation.evaluate(translator, test_pairs, limit=args.test_pairs)
    hypotheses = averaged["hypotheses"]
    # The budget is checked at each checkpoint (budget.TrainingClock), whose
    # log.csv row records the CPU time it read.
    checked = sorted(cpu_by_step.items())
    final = {**score(hypotheses, references), "steps": steps,
             "cpu_seconds": round(cpu_seconds, 2),
             "budget_checks": {"before_stop": checked[-2][1] if len(checked) > 1 else None,
                               "at_stop": checked[-1][1]}}
    log(f"ours: averaged weights: sacreBLEU {final['bleu']:.2f}")
    # Checkpoints alone; the translator reads the model's variables.
    training.compile_for_training(model)
    curve = []
    for step, path in spread(checkpoints, args.curve_points):
        training.average_checkpoints(model, [path])
        result = evaluation.evaluate(translator, test_pairs, limit=args.test_pairs)
        scores = score(result["hypotheses"], references)
        curve.append({"cpu_seconds": round(cpu_by_step[step], 2), "steps": step,
                      "bleu": scores["bleu"], "bleu_lowercase": scores["bleu_lowercase"]})
        log(f"ours: step {step}: sacreBLEU {curve[-1]['bleu']:.2f}")
    config = {"model": run_config["model"], "training": run_config["training"],
              "parameters": model.count_params(), "command": shlex.join(command[1:])}
    return {
        **summary(final, curve, sources, hypotheses, references, directory),
        "config": config,
        "cpu_seconds_train_process": round(usage.ru_utime + usage.ru_stime, 2),
    }


def worker(args):
    directory = os.path.join(args.out_dir, args.worker)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    if args.worker == "keras_hub":
        logging.getLogger("sacrebleu").addFilter(OnceEach())
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        record = run_keras_hub(args, directory)
    else:
        record = run_ours(args, directory)
    with open(args.worker_output, "w") as f:
        json.dump(record, f)


# The parent ------------------------------------------------------------------


def run_worker(system, args):
    """Runs `system` in a process of its own; its lines go to stderr, less the
    noise of TensorFlow's start-up. Returns its record."""
    output = os.path.join(args.out_dir, f".{system}.json")
    if os.path.exists(output):
        os.remove(output)
    command = [sys.executable, os.path.abspath(__file__), "--worker", system,
               "--worker-output", output, "--corpus", args.corpus,
               "--cpu-seconds", repr(args.cpu_seconds), "--test-pairs", str(args.test_pairs),
               "--out-dir", args.out_dir, "--keep-checkpoints", str(args.keep_checkpoints),
               "--curve-points", str(args.curve_points),
               f"--ours-flags={args.ours_flags}", "--seed", str(args.seed)]
    for flag, value in (("--source-language", args.source_language),
                        ("--target-language", args.target_language)):
        if value:
            command += [flag, value]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, cwd=ROOT)
    for line in process.stdout:
        if not LIBRARY_LOG_LINE.match(line.encode()):
            sys.stderr.write(line)
    if process.wait() or not os.path.exists(output):
        raise RuntimeError(f"the {system} run failed (exit {process.returncode}); see above")
    with open(output) as f:
        record = json.load(f)
    os.remove(output)
    return record


def write_report(report, out_dir, plot_path):
    """The report, then its plot (`reporting.write_report`)."""
    reporting.write_report(report, out_dir, plot_path, lambda *args: plot(*args), log)


def plot(report, path):
    """sacreBLEU against training CPU-minutes, one line per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7.5, 4.5))
    for system, record in report["systems"].items():
        minutes = [point["cpu_seconds"] / 60 for point in record["curve"]]
        line, = axes.plot(minutes, [point["bleu"] for point in record["curve"]], marker="o",
                          label=LABELS[system])
        if system == "ours":
            axes.plot(record["cpu_seconds"] / 60, record["bleu"], marker="*", markersize=16,
                      markerfacecolor="none", linestyle="none", color=line.get_color(),
                      label="ours, last checkpoints averaged")
    axes.axvline(report["cpu_seconds_budget"] / 60, color="gray", linestyle="--",
                 label="budget")
    axes.set_xlabel("training CPU-minutes (process CPU time)")
    axes.set_ylabel("sacreBLEU (cased, 13a)")
    axes.set_title(f"{report['corpus']}: {report['test_pairs']} test pairs", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--corpus", default="bundled",
                        help="'bundled', or a tab-separated file path with a {split} placeholder")
    parser.add_argument("--source-language", default=None, help="for --corpus bundled")
    parser.add_argument("--target-language", default=None, help="for --corpus bundled")
    parser.add_argument("--cpu-seconds", type=float, default=1200,
                        help="training budget of each system, in process CPU seconds")
    parser.add_argument("--test-pairs", type=int, default=500,
                        help="the first N pairs of the test split are translated")
    parser.add_argument("--systems", default="ours,keras_hub",
                        help="comma-separated: ours, keras_hub")
    parser.add_argument("--out-dir", default=os.path.join("runs", "quality_per_compute"),
                        help="the runs, hypotheses, report.json and the plot; each system's "
                        "earlier run there is removed first")
    parser.add_argument("--plot", default=argparse.SUPPRESS,
                        help="the PNG plot's path (default: OUT_DIR/quality_per_compute.png)")
    parser.add_argument("--keep-checkpoints", type=int, default=20,
                        help="train.py --keep-checkpoints (a budgeted run plans about 20)")
    parser.add_argument("--curve-points", type=int, default=6,
                        help="ours' kept checkpoints scored for the curve, evenly spread, "
                        "the first and last among them")
    parser.add_argument("--ours-flags", default="",
                        help="more train.py flags, as one string after '=': "
                        "--ours-flags='--checkpoint-every 50'")
    parser.add_argument("--seed", type=int, default=0, help="the keras_hub run's seed")
    parser.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--worker-output", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not systems or set(systems) - set(SYSTEMS):
        parser.error(f"--systems takes a comma-separated list of {', '.join(SYSTEMS)}. "
                     f"Received: {args.systems!r}")
    args.systems = systems
    if args.corpus != "bundled" and "{split}" not in args.corpus:
        parser.error(f"--corpus needs a {{split}} placeholder in the path (train, dev and "
                     f"test are read from it). Received: {args.corpus!r}")
    if args.corpus != "bundled" and (args.source_language or args.target_language):
        parser.error("--source-language/--target-language choose the columns of 'bundled'; "
                     "a file's columns are source, target")
    for name in ("cpu_seconds", "test_pairs", "keep_checkpoints", "curve_points"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0. "
                         f"Received: {getattr(args, name)}")
    args.out_dir = os.path.abspath(args.out_dir)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    plot_path = getattr(args, "plot", None) or os.path.join(args.out_dir,
                                                            "quality_per_compute.png")
    os.makedirs(args.out_dir, exist_ok=True)
    try:
        records = {}
        for system in args.systems:
            log(f"{system}: training for {args.cpu_seconds:g} CPU-seconds")
            records[system] = run_worker(system, args)
    except RuntimeError as error:
        print(f"quality_per_compute.py: {error}", file=sys.stderr)
        return 1
    report = {
        "benchmark": "quality_per_compute",
        "corpus": args.corpus if args.corpus != "bundled" else "bundled "
        + f"({args.source_language or 'en'}->{args.target_language or 'es'})",
        "cpu_seconds_budget": args.cpu_seconds,
        "test_pairs": next(iter(records.values()))["test_pairs"],
        "cpu_flags": cpu_flags(),
        "tf_cpu_allocator_use_bfc": os.environ["TF_CPU_ALLOCATOR_USE_BFC"],
        "systems": records,
    }
    if "ours" in records and "keras_hub" in records:
        for key in ("bleu", "bleu_lowercase"):
            denominator = records["keras_hub"][key]
            report[f"{key}_ratio"] = (records["ours"][key] / denominator if denominator
                                      else None)
    write_report(report, args.out_dir, plot_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
