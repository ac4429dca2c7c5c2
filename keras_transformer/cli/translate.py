"""Translates a text file (or stdin), one sentence a line, with an export or a run.

    keras-transformer translate --export exports/demo input.en > output.es
    echo "In the beginning God created the heavens and the earth." | \
        keras-transformer translate --run runs/demo

Every input line gives one output line, empty lines included, so the output
aligns with the input. A progress bar appears on stderr for inputs of 200 lines
or more where stderr is a terminal (--progress / --no-progress to choose).
Decoding is the one the run chose on its dev set (that of the export's run, or
the run's), else the paper's (beam 4, alpha 0.6, input length + 50), unless the
flags say otherwise. A line of more subword pieces than the translator's
max_input_length (the model's max_positions) is translated from its first ones,
and a line that is not UTF-8 with its bad bytes read as U+FFFD: stderr says
which lines were (read line by line from a pipe or a terminal: the first, as it
comes, for bad bytes).

Read from a terminal or a pipe and written to stdout, each line is translated as
soon as no more lines are waiting: a person typing sentences, or a program that
writes one and waits for its translation, gets each answer at once, and a file
poured through a pipe is still translated in batches. The translator's first
call, seconds long, is made meanwhile, as the first line is typed.
"""

import os
import select
import stat
import sys
import threading

from keras_transformer.cli.common import OneLineErrorParser
from keras_transformer.cli.common import add_translator_flags
from keras_transformer.cli.common import check_translator_flags
from keras_transformer.cli.common import graph_optimizer_off
from keras_transformer.cli.common import load_command_translator
from keras_transformer.cli.common import os_error_line
from keras_transformer.cli.common import parallel_searches
from keras_transformer.cli.common import says_warnings
from keras_transformer.cli.common import start_decoding
from keras_transformer.cli.common import write_lines
from keras_transformer.decoding_config import REQUEST_SETTINGS


# How messages name the command (the clone's translate.py passes its own name).
PROG = "keras-transformer translate"
# The most lines of a terminal or pipe translated together (`stdin_chunks`),
# sorted by length into batches as a file's are.
CHUNK_LINES = 1024
# What a translator answering stdin line by line translates first, unasked
# (`warm_up`).
WARM_UP_SENTENCE = "In the beginning God created the heavens and the earth."


def parse_args(argv, prog=PROG):
    parser = OneLineErrorParser(
        prog=prog, description=__doc__.split("\n")[0],
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
    """The lines of `path` (- for stdin), and the numbers of those that are not
    UTF-8 (their bad bytes read as U+FFFD, so that each still has its line)."""
    stream = sys.stdin.buffer if path == "-" else open(path, "rb")
    lines, not_utf8 = [], []
    with stream:
        for number, line in enumerate(stream, 1):
            text, valid = _decode(line)
            lines.append(text)
            if not valid:
                not_utf8.append(number)
    return lines, not_utf8


# The end of each warning: what was done, and how to convert a file in another encoding.
_CONVERT = ("bad bytes were read as U+FFFD and translated so. If it is in another encoding, "
            "convert it first, e.g. iconv -f WINDOWS-1252 -t UTF-8")


def not_utf8_warning(path, not_utf8, total):
    """What a user reads where `not_utf8` (line numbers) of the `total` lines of
    `path` are not UTF-8: a file in another encoding (Windows-1252, say)
    translated with its accented letters lost, unless it is converted."""
    name = "stdin" if path == "-" else path
    first = f"line {not_utf8[0]}" if len(not_utf8) == 1 else f"the first: line {not_utf8[0]}"
    return (f"{name}: {len(not_utf8)} of its {total} lines are not UTF-8 ({first}); their "
            + _CONVERT)


def streamed_not_utf8_warning(number):
    """What a user reads, at once, where line `number` of stdin, answered line
    by line (`stdin_chunks`), is the first that is not UTF-8."""
    return (f"stdin: line {number} is not UTF-8 (the first; later ones are not named); its "
            + _CONVERT)


def _decode(line):
    """`line` (bytes) as text without its line end, and whether it was UTF-8.
    Invalid UTF-8 is not fatal: the model sees U+FFFD for those bytes."""
    try:
        return line.decode("utf-8").rstrip("\r\n"), True
    except UnicodeDecodeError:
        return line.decode("utf-8", "replace").rstrip("\r\n"), False


def stdin_chunks(stream, most, first_not_utf8=None):
    """The lines of `stream` (a terminal or a pipe) in lists of at most `most`:
    those that have arrived, as soon as no more are waiting, so that each line
    typed, or written by a program that then waits for its translation, is
    answered at once; a file poured in fills the lists. `first_not_utf8(number)`
    is called as the first line that is not UTF-8 arrives (it is read with
    U+FFFD for its bad bytes)."""
    fd = stream.fileno()
    lines, pending, read, warned = [], b"", 0, False  # read: lines handed on

    def add(line):
        nonlocal warned
        text, valid = _decode(line)
        lines.append(text)
        if not (valid or warned or first_not_utf8 is None):
            warned = True
            first_not_utf8(read + len(lines))

    while True:
        if lines and (len(lines) >= most or not select.select([fd], [], [], 0)[0]):
            chunk, lines = lines[:most], lines[most:]
            yield chunk
            read += len(chunk)
            continue
        data = os.read(fd, 1 << 16)
        if not data:
            break
        *complete, pending = (pending + data).split(b"\n")
        for line in complete:
            add(line)
    if pending:
        add(pending)
    for start in range(0, len(lines), most):
        yield lines[start:start + most]


def warm_up(translator, settings):
    """Translates `WARM_UP_SENTENCE` with `translator` and the request `settings`
    in a thread, its translation unused; returns a function that waits for it.

    A translator's first call optimizes its graph (an export's, or traces a
    run's searches): 5.2 s before the first answer on a 2-core Xeon, each one
    after 0.04 s. Started once the translator is loaded, that happens while a
    person types the first sentence, or a program prepares its first line.
    What the call raises is left to the first real one to raise again."""
    from keras_transformer import evaluation

    def translate():
        try:
            evaluation.translate_sentences(translator, [WARM_UP_SENTENCE], **settings)
        except Exception:  # the first line's own call says it
            pass

    thread = threading.Thread(target=translate, name="warm-up", daemon=True)
    thread.start()
    return thread.join


def streams(args):
    """Whether translate answers stdin's lines as they come (`stdin_chunks`):
    from a terminal or a pipe (not a file) to stdout."""
    return (args.input == "-" and args.output == "-"
            and not stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode))


@says_warnings
def main(argv=None, prog=PROG):
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    start_decoding(args.verbose, parallel_searches(args.export, args.run))
    from keras_transformer import evaluation

    settings = {name: getattr(args, name) for name in REQUEST_SETTINGS}
    streaming = streams(args)
    with graph_optimizer_off():
        try:
            lines, not_utf8 = (None, []) if streaming else read_lines(args.input)
            if not_utf8:
                print(f"{prog}: {not_utf8_warning(args.input, not_utf8, len(lines))}",
                      file=sys.stderr, flush=True)
            translator = load_command_translator(args, prog)
            if streaming:
                warmed_up = warm_up(translator, settings)
                if sys.stdin.isatty():
                    print(f"{prog}: type a sentence and press Enter; Ctrl-D ends",
                          file=sys.stderr, flush=True)
                answered = 0
                def first_not_utf8(number):
                    print(f"{prog}: {streamed_not_utf8_warning(number)}", file=sys.stderr,
                          flush=True)

                for chunk in stdin_chunks(sys.stdin.buffer, CHUNK_LINES, first_not_utf8):
                    warmed_up()  # one call at a time
                    write_lines("-", evaluation.translate_sentences(
                        translator, chunk, args.batch_size, first_number=answered + 1,
                        **settings))
                    answered += len(chunk)
                return 0
            translations = evaluation.translate_sentences(
                translator, lines, args.batch_size, progress=args.progress, **settings)
        except (ValueError, FileNotFoundError, ImportError) as error:  # no ctranslate2
            print(f"{prog}: {error}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # Ctrl-C: what was answered stays answered
            return 130
        except BrokenPipeError:
            return stdout_closed()
    try:
        write_lines(args.output, translations)
    except BrokenPipeError:
        return stdout_closed()
    except OSError as error:  # a full disk, say: no half-written --output
        print(f"{prog}: {os_error_line(error)}", file=sys.stderr)
        return 1
    return 0


def stdout_closed():
    """The exit status of a command whose reader closed stdout (`| head`), as a
    shell reports a process that SIGPIPE ended; nothing more is written, and
    Python's flush at exit has nowhere to fail."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + 13
