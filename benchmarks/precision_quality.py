"""Translation quality of the reduced-precision exports against float32's; prints JSON.

    python benchmarks/precision_quality.py --run runs/quickstart   # minutes
    python benchmarks/precision_quality.py --run RUN --precisions float32,bfloat16,float16

For each of `--precisions`, the run's averaged weights are exported as
`keras-transformer export --precision` does (`Transformer.with_dtype`, the
paper's decoding: beam 4, alpha 0.6, source length + 50), reloaded with
`tf.saved_model.load`, and translate the first `--limit` pairs of the bundled test
split (or `--test`). Reported per precision: sacreBLEU (with its signature),
sentences/s, the share of translations identical to float32's, and
`bleu_minus_float32`. The issue's bar is a reduced export within 0.3 BLEU of
float32's (`within_0.3_bleu`). The machine's CPU flags are recorded: bfloat16
arithmetic is native only with AVX512-BF16 or AMX, and the translations may
differ between CPUs.
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import VERBOSE_HELP  # noqa: E402 (imports no TensorFlow)
from machine import set_decoding_environment  # noqa: E402

DECODING_ENVIRONMENT = set_decoding_environment()

from keras_transformer import data  # noqa: E402
from keras_transformer import evaluation  # noqa: E402
from keras_transformer import runs  # noqa: E402
from keras_transformer import saved_model  # noqa: E402
from keras_transformer import serving  # noqa: E402
from machine import cpu_flags  # noqa: E402

BLEU_TOLERANCE = 0.3


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True,
                        help="a training run directory (keras-transformer train --out)")
    parser.add_argument("--precisions", default="float32,bfloat16",
                        help="comma-separated export precisions, float32 first")
    parser.add_argument("--test", default="bundled",
                        help="the test split's corpus (data.load_parallel's name)")
    parser.add_argument("--limit", type=int, default=500, help="test pairs translated")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    args = parser.parse_args(argv)
    args.precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if not args.precisions or args.precisions[0] != "float32":
        parser.error("--precisions must start with float32, the reference")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    model, tokenizer, _ = runs.Run(args.run).load()
    pairs = data.load_parallel(args.test, "test")
    report = {"run": args.run, "test": args.test, "limit": args.limit,
              "machine": cpu_flags(), "precisions": {}}
    reference = None
    with tempfile.TemporaryDirectory() as directory:
        for precision in args.precisions:
            translator = serving.Translator(model.with_dtype(precision), tokenizer)
            path = saved_model.export_translator(
                translator, os.path.join(directory, precision), check=False)
            scores = evaluation.evaluate(path, pairs, limit=args.limit)
            hypotheses = scores["hypotheses"]
            reference = reference or hypotheses
            identical = sum(a == b for a, b in zip(hypotheses, reference)) / len(reference)
            report["precisions"][precision] = {
                "bleu": round(scores["bleu"], 2),
                "signature": scores["signature"],
                "sentences_per_second": round(scores["sentences_per_second"], 2),
                "identical_to_float32": round(identical, 4),
                "samples": hypotheses[:3],
            }
            print(f"{precision}: BLEU {scores['bleu']:.2f}, {identical:.1%} identical to "
                  f"float32, {scores['sentences_per_second']:.1f} sentences/s",
                  file=sys.stderr, flush=True)
    base = report["precisions"]["float32"]["bleu"]
    for precision, measured in report["precisions"].items():
        measured["bleu_minus_float32"] = round(measured["bleu"] - base, 2)
        measured[f"within_{BLEU_TOLERANCE}_bleu"] = abs(measured["bleu"] - base) <= BLEU_TOLERANCE
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
