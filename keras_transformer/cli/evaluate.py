"""Translates a test set and prints its sacreBLEU score, signature and tokenized BLEU.

    keras-transformer evaluate --export exports/demo      # the test split of the run's corpus
    keras-transformer evaluate --run runs/demo --test bundled --split dev --limit 200
    keras-transformer evaluate --export exports/wmt --test tfds:wmt14_translate/de-en   # newstest2014
    keras-transformer evaluate --export exports/demo --src test.en --ref test.es --output hyps.es

sacreBLEU (13a tokenization, detokenized text) is the score to compare across
papers; "tokenized BLEU" is computed on mteval-v14 international tokens like the
paper-era tools (see keras_transformer/evaluation.py) and is the one to set
beside the paper's Table 2.
"""

import json
import os
import sys

from keras_transformer import export_files
from keras_transformer.cli.common import OneLineErrorParser
from keras_transformer.cli.common import add_translator_flags
from keras_transformer.cli.common import check_translator_flags
from keras_transformer.cli.common import corpus_source
from keras_transformer.cli.common import corpus_split
from keras_transformer.cli.common import graph_optimizer_off
from keras_transformer.cli.common import has_splits
from keras_transformer.cli.common import is_named_corpus
from keras_transformer.cli.common import load_command_translator
from keras_transformer.cli.common import os_error_line
from keras_transformer.cli.common import parallel_searches
from keras_transformer.cli.common import says_warnings
from keras_transformer.cli.common import start_decoding
from keras_transformer.cli.common import write_lines
from keras_transformer.corpus_names import BUNDLED
from keras_transformer.decoding_config import REQUEST_SETTINGS


# How messages name the command (the clone's evaluate.py passes its own name).
PROG = "keras-transformer evaluate"


def parse_args(argv, prog=PROG):
    parser = OneLineErrorParser(
        prog=prog, description=__doc__.split("\n")[0],
    )
    add_translator_flags(parser, "pairs")
    parser.add_argument("--test",
                        help="'bundled', 'tfds:NAME[/CONFIG]', a tab-separated file or "
                             "'SOURCE,TARGET' files, as train's --data (paths may hold "
                             "'{split}', filled from --split). Default: the corpus the run "
                             "trained on, in its direction (train's --data and languages, "
                             "as the run or export recorded them), else 'bundled'")
    parser.add_argument("--split", default="test", help="split of --test")
    parser.add_argument("--src", help="source file, one sentence a line (with --ref)")
    parser.add_argument("--ref", help="reference file aligned with --src")
    parser.add_argument("--source-language", help="TFDS/bundled language key of the source "
                                                  "(default: the run's, with its corpus)")
    parser.add_argument("--target-language", help="TFDS/bundled language key of the target "
                                                  "(default: the run's, with its corpus)")
    parser.add_argument("--limit", type=int, default=None, help="score the first N pairs")
    parser.add_argument("--output", help="write the translations here, one a line")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    args = parser.parse_args(argv)
    check_translator_flags(parser, args)
    if (args.src is None) != (args.ref is None):
        parser.error("--src and --ref go together")
    for flag, path in (("--src", args.src), ("--ref", args.ref)):
        if path is not None and not os.path.isfile(path):
            parser.error(f"{flag} {path} does not exist")
    if args.output:
        parser.check_output("--output", args.output)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be >= 1. Received: {args.limit}")
    return args


def load_pairs(args):
    """`(pairs, named)`: the pairs to score, --src and --ref, --test's --split, or
    without --test that split of the corpus the run trained on (`trained_corpus`),
    as train read it (`read_splits`); and what messages call one of them before
    its number: by its line in --src or in a --test file of one split ("sentence
    3"), else by the split's name ("test sentence 3")."""
    from keras_transformer import data

    by_line, by_split = "sentence", f"{args.split} sentence"
    if args.src is not None:
        return data.load_parallel((args.src, args.ref)), by_line
    test, languages = args.test, {"source_language": args.source_language,
                                  "target_language": args.target_language}
    trained = trained_corpus(args) if test is None else None
    if trained is not None:
        corpus, seed = trained.pop("data"), trained.pop("seed")
        if languages == dict.fromkeys(languages):  # none given: the run's direction
            languages = trained
        try:
            return corpus_split(corpus, args.split, seed, **languages), by_split
        except FileNotFoundError as error:
            raise FileNotFoundError(f"{error}: the {args.split} split of the corpus the run "
                                    f"trained on (--data {corpus!r}); pass --test to score "
                                    "another") from error
    test = test or BUNDLED
    source = corpus_source(test)
    if is_named_corpus(test):
        return data.load_parallel(source, args.split, **languages), by_split
    if has_splits(test):  # as train's --data: 'corpus/{split}.tsv.gz'
        return data.load_parallel(source, args.split), by_split
    if not all(map(os.path.isfile, source if isinstance(source, tuple) else [source])):
        raise FileNotFoundError(
            f"--test {test} is neither 'bundled', 'tfds:NAME' nor existing files"
        )
    return data.load_parallel(source), by_line


def trained_corpus(args):
    """`{"data", "source_language", "target_language", "seed"}`: train's settings
    of the corpus that the --run, or the run of the --export, trained on (the seed
    drew the pairs held out of files without '{split}'); None where none is
    recorded (an export of the library's)."""
    if args.run is not None:
        from keras_transformer import runs

        recorded = runs.Run(args.run).read_config() or {}
    else:
        recorded = export_files.run_settings(args.export)
    training = recorded.get("training", {})
    if "data" not in training:
        return None
    return {name: training.get(name)
            for name in ("data", "source_language", "target_language", "seed")}


@says_warnings
def main(argv=None, prog=PROG):
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    start_decoding(args.verbose, parallel_searches(args.export, args.run))
    from keras_transformer import evaluation

    with graph_optimizer_off():
        try:
            pairs, named = load_pairs(args)
            translator = load_command_translator(args, prog)
            result = evaluation.evaluate(
                translator, pairs, args.batch_size, args.progress, limit=args.limit,
                named=named,
                **{name: getattr(args, name) for name in REQUEST_SETTINGS},
            )
        except (ValueError, FileNotFoundError, ImportError) as error:  # no ctranslate2
            print(f"{prog}: {error}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # Ctrl-C: no stack
            return 130
    hypotheses = result.pop("hypotheses")
    if args.output:
        try:
            write_lines(args.output, hypotheses)
        except OSError as error:  # a full disk, say: no half-written --output
            print(f"{prog}: {os_error_line(error)}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"sacreBLEU: {result['text']}")
        print(f"  signature: {result['signature']}")
        print(f"tokenized BLEU (paper-style): {result['tokenized_bleu']:.2f}")
        print(f"  signature: {result['tokenized_signature']}")
        print(f"{result['sentences']} sentences in {result['seconds']:.1f} s "
              f"({result['sentences_per_second']:.1f} sentences/s)")
    return 0

