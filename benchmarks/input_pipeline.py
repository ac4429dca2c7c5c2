"""Input pipeline throughput, raw text to batches, printed as one JSON object.

Reads the bundled corpus, tokenizes it with a shared subword vocabulary and cuts
token-budget batches with the paper's budget (Sec. 5.1: about 25000 source and 25000
target tokens per batch), as training would. The pipeline must never be what
training waits for, so the JSON puts its tokens/s next to the training throughput:
the paper's base model (8 P100s, about 25000 + 25000 tokens a step at 0.4 s a step)
and, with --training-json, the training benchmark's measurement.

    python benchmarks/input_pipeline.py                       # vocabulary of 37000
    python benchmarks/input_pipeline.py --training-json runs/training_benchmark.json

Timed: reading and checking the text files, tokenizing, dropping pairs over
--max-sentence-tokens, bucketing, padding, and handing each batch to Python as numpy
(`epoch_1` includes building the pipeline's functions; later epochs reshuffle).
Not timed: importing TensorFlow and learning the vocabulary (reported apart).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from machine import VERBOSE_HELP  # noqa: E402 (imports no TensorFlow)
from machine import quiet_libraries  # noqa: E402

quiet_libraries()

from keras_transformer import data  # noqa: E402
from machine import cpu_flags  # noqa: E402

# Sec. 5.2: base model, 8 P100s, 0.4 s a step, batches of ~25000 + 25000 tokens.
PAPER_BASE_TOKENS_PER_SECOND = (25000 + 25000) / 0.4


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", default="train", help="bundled split: train, dev or test")
    parser.add_argument("--vocab-size", type=int, default=37000)
    parser.add_argument("--vocab-dir", default=None,
                        help="load the vocabulary from here if it exists, else train and save it")
    parser.add_argument("--tokens-per-batch", type=int, default=25000)
    parser.add_argument("--max-sentence-tokens", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--training-json", default=None,
                        help="JSON of the training benchmark; its tokens_per_second is compared")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    args = parser.parse_args()

    start = time.perf_counter()
    if args.vocab_dir and os.path.exists(os.path.join(args.vocab_dir, "tokenizer.json")):
        tokenizer = data.SubwordTokenizer.load(args.vocab_dir)
    else:
        tokenizer = data.SubwordTokenizer.train(
            data.load_parallel("bundled", "train"), vocab_size=args.vocab_size
        )
        if args.vocab_dir:
            tokenizer.save(args.vocab_dir)
    vocabulary_seconds = time.perf_counter() - start

    stats = data.BatchStats()
    start = time.perf_counter()
    pairs = data.load_parallel("bundled", args.split)
    batches = data.make_batches(
        pairs, tokenizer, args.tokens_per_batch, args.max_sentence_tokens, seed=args.seed,
        deterministic=args.deterministic, stats=stats,
    )
    epochs = []
    for _ in range(args.epochs):
        counts = {"batches": 0, "source_tokens": 0, "target_tokens": 0, "padded_tokens": 0,
                  "filler_tokens": 0}
        for inputs, targets in batches.as_numpy_iterator():
            counts["batches"] += 1
            counts["source_tokens"] += int((inputs["encoder_inputs"] != 0).sum())
            counts["target_tokens"] += int((targets != 0).sum())  # EOS included
            counts["padded_tokens"] += 2 * targets.size  # source and target
            # Rows that fill the last batch of a bucket: no pair at all.
            counts["filler_tokens"] += 2 * int((~targets.any(axis=1)).sum()) * targets.shape[1]
        counts["seconds"] = time.perf_counter() - start
        epochs.append(counts)
        start = time.perf_counter()
    result = stats.result()
    pairs_per_epoch = result["pairs_read"] // args.epochs
    batched_per_epoch = result["pairs_batched"] // args.epochs

    def rates(epoch):
        tokens = epoch["source_tokens"] + epoch["target_tokens"]
        return {
            "seconds": round(epoch["seconds"], 3),
            "pairs_per_second": round(pairs_per_epoch / epoch["seconds"], 1),
            "tokens_per_second": round(tokens / epoch["seconds"], 1),
            "batches_per_second": round(epoch["batches"] / epoch["seconds"], 2),
        }

    steady = epochs[1:] or epochs
    best = min(steady, key=lambda epoch: epoch["seconds"])
    tokens_per_second = (best["source_tokens"] + best["target_tokens"]) / best["seconds"]
    report = {
        "benchmark": "input_pipeline",
        "corpus": f"bundled/{args.split}",
        "settings": {
            "vocab_size": tokenizer.vocab_size,
            "tokens_per_batch": args.tokens_per_batch,
            "max_sentence_tokens": args.max_sentence_tokens,
            "buckets": len(data.bucket_lengths(args.max_sentence_tokens)),
            "epochs": args.epochs,
            "seed": args.seed,
            "deterministic": args.deterministic,
        },
        "machine": cpu_flags(),
        "vocabulary_seconds": round(vocabulary_seconds, 2),
        "pairs": pairs_per_epoch,
        "pairs_too_long": result["pairs_too_long"] // args.epochs,
        "pairs_batched": batched_per_epoch,
        "batches": best["batches"],
        "source_tokens": best["source_tokens"],
        "target_tokens": best["target_tokens"],
        # Of the padded batches' token slots: all padding, and the part of it in
        # filler rows (the last batch of each bucket, once an epoch; TrainingBatches has none).
        "padding_fraction": round(
            1 - (best["source_tokens"] + best["target_tokens"]) / best["padded_tokens"], 4
        ),
        "filler_row_fraction": round(best["filler_tokens"] / best["padded_tokens"], 4),
        "epoch_1": rates(epochs[0]),
        "steady": rates(best),
        "pairs_per_second": rates(best)["pairs_per_second"],
        "tokens_per_second": round(tokens_per_second, 1),
        "training": {
            "paper_base_8xP100_tokens_per_second": PAPER_BASE_TOKENS_PER_SECOND,
            "pipeline_over_paper_base": round(tokens_per_second / PAPER_BASE_TOKENS_PER_SECOND, 2),
        },
    }
    if args.training_json:
        with open(args.training_json) as f:
            training = json.load(f)
        measured = _find(training, "tokens_per_second")
        report["training"]["benchmark"] = args.training_json
        report["training"]["benchmark_tokens_per_second"] = measured
        if measured:
            report["training"]["pipeline_over_benchmark"] = round(tokens_per_second / measured, 2)
    print(json.dumps(report, indent=2))


def _find(tree, key):
    """The first value of `key` in nested dicts and lists, or None."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        tree = list(tree.values())
    if isinstance(tree, list):
        for value in tree:
            found = _find(value, key)
            if found is not None:
                return found
    return None


if __name__ == "__main__":
    main()
