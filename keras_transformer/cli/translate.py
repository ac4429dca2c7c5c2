"""Translates a text file (or stdin), one sentence a line, with an export or a run.

    keras-transformer translate --export exports/demo input.en > output.es
    echo "In the beginning God created the heavens and the earth." | \
        keras-transformer translate --run runs/demo

Every input line gives one output line, empty lines included, so the output
aligns with the input. A progress bar appears on stderr for inputs of 200 lines
or more where stderr is a terminal (--progress / --no-progress to choose). Decoding is the paper's (beam 4,
alpha 0.6, input length + 50) unless the flags say otherwise; inputs longer than
the model's maximum length are truncated.
"""

import argparse
import os
import sys

from keras_transformer.cli.common import OneLineErrorParser
from keras_transformer.cli.common import add_translator_flags
from keras_transformer.cli.common import check_translator_flags
from keras_transformer.cli.common import load_command_translator
from keras_transformer.cli.common import os_error_line
from keras_transformer.cli.common import parallel_searches
from keras_transformer.cli.common import start_decoding
from keras_transformer.cli.common import write_lines
from keras_transformer.decoding_config import REQUEST_SETTINGS


# How messages name the command (the clone's translate.py passes its own name).
PROG = "keras-transformer translate"


def parse_args(argv, prog=PROG):
    parser = OneLineErrorParser(
        prog=prog, description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("input", nargs="?", default="-",
                        help="the text file to translate; - for stdin")
    parser.add_argument("--output", "-o", default="-", help="where to write; - for stdout")
    add_translator_flags(parser, "lines")
    args = parser.parse_args(argv)
    check_translator_flags(parser, args)
    if args.input != "-" and not os.path.isfile(args.input):
        parser.error(f"input file {args.input} does not exist")
    if args.output != "-":
        parser.check_output("--output", args.output)
    return args


def read_lines(path):
    stream = sys.stdin.buffer if path == "-" else open(path, "rb")
    with stream:
        # Invalid UTF-8 is not fatal: the model sees U+FFFD for those bytes.
        return [line.decode("utf-8", "replace").rstrip("\r\n") for line in stream]


def main(argv=None, prog=PROG):
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    start_decoding(args.verbose, parallel_searches(args.export, args.run))
    from keras_transformer import evaluation

    lines = read_lines(args.input)
    try:
        translator = load_command_translator(args)
        translations = evaluation.translate_sentences(
            translator, lines, args.batch_size,
            progress=args.progress,
            **{name: getattr(args, name) for name in REQUEST_SETTINGS},
        )
    except (ValueError, FileNotFoundError) as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    try:
        write_lines(args.output, translations)
    except OSError as error:  # a full disk, say: no half-written --output
        print(f"{prog}: {os_error_line(error)}", file=sys.stderr)
        return 1
    return 0

