"""The command lines: `keras-transformer COMMAND [FLAGS]` (installed by pip), or
`python -m keras_transformer COMMAND [FLAGS]`; `train.py`, `export.py`,
`translate.py` and `evaluate.py` at the top of a clone run the same commands.

    keras-transformer train --time-budget 5 --out runs/demo
    keras-transformer export --run runs/demo --out exports/demo
    keras-transformer translate --export exports/demo input.en > output.es
    keras-transformer evaluate --export exports/demo

Each command is a module of this package with `main(argv, prog)`; none imports
TensorFlow before its flags are checked.
"""

import importlib
import sys

# The commands, in the order of the main job.
COMMANDS = ("train", "export", "translate", "evaluate")
PROG = "keras-transformer"


def main(argv=None, prog=PROG):
    """Runs the command that `argv[0]` names with the rest of `argv`; returns the
    exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(prog))
        return 0 if argv else 2
    command, *flags = argv
    if command == "--version":
        from importlib.metadata import version

        print(f"{prog} {version('keras_transformer')}")
        return 0
    if command not in COMMANDS:
        print(f"{prog}: unknown command {command!r}; choose one of {', '.join(COMMANDS)} "
              f"(see --help)", file=sys.stderr)
        return 2
    module = importlib.import_module(f"keras_transformer.cli.{command}")
    return module.main(flags, prog=f"{prog} {command}")


def usage(prog=PROG):
    """The command list that `--help` prints: each command's first docstring line."""
    lines = [f"usage: {prog} {{{','.join(COMMANDS)}}} [FLAGS]", "",
             "The Transformer of \"Attention Is All You Need\": train, export, translate, "
             "evaluate.", "", "commands:"]
    for command in COMMANDS:
        summary = importlib.import_module(f"keras_transformer.cli.{command}").__doc__
        lines.append(f"  {command:<10} {summary.splitlines()[0]}")
    lines += ["", f"{prog} COMMAND --help lists the command's flags; --version, the "
              "package's version."]
    return "\n".join(lines)
