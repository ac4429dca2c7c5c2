"""Sample efficiency of the CPU recipes: sacreBLEU on the bundled dev set against
updates and against CPU-seconds, for each recipe trained for the same wall-clock
budget, as JSON and a plot. The figures behind `keras_transformer.recipes.RECIPES`.

    python benchmarks/recipe_curves.py                                  # the RECIPES, 8 minutes each
    python benchmarks/recipe_curves.py --cpus 0 --precision float32     # a slow CPU's stand-in
    python benchmarks/recipe_curves.py --recipes 4000/2048/0/0.5 --minutes 1 --dev-pairs 20
    python benchmarks/recipe_curves.py --recipes 4000/2048/0/1,4000/2048/0/0.5 \
        --minutes 60 --train-flags "--steps 532" --cpus 0 --precision float32   # at equal updates

Each recipe (VOCABULARY/TOKENS/DROPOUT[/SCALE]: the shared vocabulary's size, the
source tokens of a batch, P_drop and the schedule's learning-rate scale, 1 unless
given; by default those of `keras_transformer.recipes.RECIPES`)
trains in a process of its own, one after the other, with `keras-transformer
train --time-budget MINUTES` and the run's other defaults (`--model auto`, the
planned warm-up) or `--train-flags`, on the CPUs `--cpus` names (all by default). Then its kept checkpoints (`--curve-points` of them, spread over the
run) and its averaged weights translate the first `--dev-pairs` dev pairs with
beam search (beam 4, alpha 0.6); each point records the step, the process's
CPU-seconds and the wall-clock seconds at that checkpoint (from log.csv), and
the sacreBLEU. Progress goes to stderr, the JSON alone to stdout.
"""

import argparse
import csv
import os
import shlex
import subprocess
import sys

from machine import cpu_flags
from machine import isa_limit
from machine import quiet_libraries
import reporting

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from keras_transformer.recipes import RECIPES  # noqa: E402 (no TensorFlow)

TRAIN_COMMAND = [sys.executable, "-m", "keras_transformer", "train"]


def log(message):
    print(f"recipe_curves: {message}", file=sys.stderr, flush=True)


def parse_recipe(text):
    """`(vocab_size, tokens_per_batch, dropout_rate, learning_rate_scale)` of
    "VOCABULARY/TOKENS/DROPOUT[/SCALE]"."""
    try:
        vocab_size, tokens_per_batch, dropout_rate, *scale = text.split("/")
        if len(scale) > 1:
            raise ValueError
        return (int(vocab_size), int(tokens_per_batch), float(dropout_rate),
                float(scale[0]) if scale else 1.0)
    except ValueError:
        raise ValueError(f"a recipe is VOCABULARY/TOKENS/DROPOUT[/SCALE], e.g. 8000/4096/0.1 "
                         f"or 4000/2048/0/0.5. Received: {text!r}") from None


def recipe_name(vocab_size, tokens_per_batch, dropout_rate, learning_rate_scale):
    return f"{vocab_size}/{tokens_per_batch}/{dropout_rate:g}/{learning_rate_scale:g}"


def read_log(path):
    """`{step: (cpu_seconds, elapsed_seconds)}` from a run's log.csv."""
    with open(path, newline="") as f:
        return {int(float(row["step"])): (float(row["cpu_seconds"]),
                                          float(row["elapsed_seconds"]))
                for row in csv.DictReader(f)}


def spread(items, count):
    """At most `count` of `items`, evenly spread, the last among them."""
    if len(items) <= count:
        return list(items)
    last = len(items) - 1
    return [items[round(last - i * last / (count - 1))] for i in reversed(range(count))]


def run_recipe(args, vocab_size, tokens_per_batch, dropout_rate, learning_rate_scale,
               directory):
    """Trains one recipe for the budget, then scores its checkpoints."""
    from keras_transformer import data
    from keras_transformer import evaluation
    from keras_transformer import runs
    from keras_transformer import serving
    from keras_transformer import training

    run_dir = os.path.join(directory, "run")
    command = [*TRAIN_COMMAND, "--out", run_dir, "--time-budget", repr(args.minutes),
               "--vocab-size", str(vocab_size), "--tokens-per-batch", str(tokens_per_batch),
               "--dropout-rate", repr(dropout_rate),
               "--learning-rate-scale", repr(learning_rate_scale), "--precision", args.precision,
               "--test-sentences", "0", "--keep-checkpoints", str(args.keep_checkpoints),
               "--seed", str(args.seed), *shlex.split(args.train_flags)]
    name = recipe_name(vocab_size, tokens_per_batch, dropout_rate, learning_rate_scale)
    log(f"{name}: {shlex.join(command[1:])}")
    with open(os.path.join(directory, "train.log"), "w") as output:
        result = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT,
                                check=False)
    if result.returncode:
        raise RuntimeError(f"training failed (exit {result.returncode}); see "
                           f"{os.path.join(directory, 'train.log')}")
    times = read_log(os.path.join(run_dir, runs.CSV_LOG))
    checkpoints = runs.Checkpoints(os.path.join(run_dir, runs.CHECKPOINTS)).list()
    pairs = data.load_parallel("bundled", "dev").take(args.dev_pairs)
    model, tokenizer, _ = runs.Run(run_dir).load()
    translator = serving.Translator(model, tokenizer)  # beam 4, alpha 0.6
    final = evaluation.evaluate(translator, pairs)
    last_step = checkpoints[-1][0]
    record = {"vocab_size": vocab_size, "tokens_per_batch": tokens_per_batch,
              "dropout_rate": dropout_rate, "learning_rate_scale": learning_rate_scale,
              "steps": last_step, "cpu_seconds": times[last_step][0],
              "elapsed_seconds": times[last_step][1], "bleu": round(final["bleu"], 2),
              "samples": final["hypotheses"][:3], "command": shlex.join(command[1:])}
    log(f"{name}: {last_step} steps, averaged weights: "
        f"sacreBLEU {final['bleu']:.2f}")
    training.compile_for_training(model)  # the checkpoints hold optimizer state too
    record["curve"] = []
    for step, path in spread(checkpoints, args.curve_points):
        training.average_checkpoints(model, [path])
        bleu = evaluation.evaluate(translator, pairs)["bleu"]
        record["curve"].append({"steps": step, "cpu_seconds": times[step][0],
                                "elapsed_seconds": times[step][1], "bleu": round(bleu, 2)})
        log(f"{name}: step {step}: sacreBLEU {bleu:.2f}")
    return record


def plot(report, path):
    """sacreBLEU against updates and against CPU-minutes, a line per recipe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_steps, by_cpu) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for name, record in report["recipes"].items():
        curve = record["curve"]
        bleu = [point["bleu"] for point in curve]
        by_steps.plot([point["steps"] for point in curve], bleu, marker="o", label=name)
        by_cpu.plot([point["cpu_seconds"] / 60 for point in curve], bleu, marker="o",
                    label=name)
    by_steps.set_xlabel("updates")
    by_cpu.set_xlabel("training CPU-minutes")
    by_steps.set_ylabel(f"sacreBLEU, {report['dev_pairs']} dev pairs (checkpoint alone)")
    for axes in (by_steps, by_cpu):
        axes.grid(alpha=0.3)
        axes.legend(title="vocabulary/batch tokens/dropout/learning-rate scale", fontsize=8)
    cpu = report["cpu_flags"]
    limit = isa_limit(cpu)
    figure.suptitle(f"{report['minutes']:g}-minute budget, {report['precision']}, "
                    f"CPUs {report['cpus'] or 'all'} ({cpu['model_name']}"
                    f"{', ' + limit if limit else ''})", fontsize=10)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--recipes", default=",".join(
                            recipe_name(r.vocab_size, r.tokens_per_batch, r.dropout_rate,
                                        r.learning_rate_scale) for r in RECIPES),
                        help="comma-separated VOCABULARY/TOKENS/DROPOUT[/SCALE] recipes")
    parser.add_argument("--minutes", type=float, default=8.0,
                        help="each recipe's wall-clock training budget (the quickstart's)")
    parser.add_argument("--train-flags", default="",
                        help="more keras-transformer train flags, e.g. '--model tiny'")
    parser.add_argument("--precision", default="auto",
                        help="keras-transformer train --precision")
    parser.add_argument("--cpus", default="",
                        help="the CPUs that train and score, e.g. 0 (one core); all if empty")
    parser.add_argument("--dev-pairs", type=int, default=500)
    parser.add_argument("--curve-points", type=int, default=5)
    parser.add_argument("--keep-checkpoints", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default=os.path.join("runs", "recipe_curves"))
    parser.add_argument("--verbose", action="store_true",
                        help="TensorFlow's own log lines too")
    args = parser.parse_args(argv)
    try:
        args.recipes = [parse_recipe(text) for text in args.recipes.split(",") if text.strip()]
    except ValueError as error:
        parser.error(str(error))
    if args.minutes <= 0 or args.dev_pairs < 1 or args.curve_points < 1:
        parser.error("--minutes, --dev-pairs and --curve-points must be positive")
    return args


def main(argv=None):
    args = parse_args(argv)
    quiet_libraries()  # unless --verbose
    if args.cpus:  # the training processes inherit it
        os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})
    out_dir = os.path.abspath(args.out_dir)
    report = {"benchmark": "recipe_curves", "minutes": args.minutes,
              "precision": args.precision, "cpus": args.cpus, "dev_pairs": args.dev_pairs,
              "cpu_flags": cpu_flags(), "recipes": {}}
    for recipe in args.recipes:
        directory = os.path.join(out_dir, recipe_name(*recipe).replace("/", "-"))
        os.makedirs(directory, exist_ok=True)
        try:
            record = run_recipe(args, *recipe, directory)
        except RuntimeError as error:
            print(f"recipe_curves.py: {error}", file=sys.stderr)
            return 1
        report["recipes"][recipe_name(*recipe)] = record
    reporting.write_report(report, out_dir, os.path.join(out_dir, "recipe_curves.png"),
                           plot, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
