"""A wheel is a complete install: built from the checkout, installed into a new
virtual environment outside it, and run from another directory, its
`keras-transformer` command trains on the bundled corpus (package data), exports
and translates, with nothing from the checkout on the path."""

import os
import subprocess
import sys

import pytest

from tests import made_once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = ("train", "export", "translate", "evaluate")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """`(bin directory, working directory)` of a virtual environment holding the
    wheel and its dependencies (from the package index or pip's cache), made once
    for all pytest-xdist workers (two builds of one checkout at once collide)."""
    top = made_once(tmp_path_factory, "wheel", install)
    return top / "venv" / "bin", top / "work"


def install(top):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", ROOT,
                    "-w", str(top / "dist")], check=True, capture_output=True, timeout=600)
    wheels = list((top / "dist").glob("keras_transformer-*.whl"))
    assert len(wheels) == 1, wheels
    subprocess.run([sys.executable, "-m", "venv", str(top / "venv")], check=True, timeout=300)
    bin_dir = top / "venv" / "bin"
    result = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet",
                             str(wheels[0])], capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    (top / "work").mkdir()


def run(installed, *args, stdin=None):
    bin_dir, work = installed
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environment["PATH"] = f"{bin_dir}{os.pathsep}{environment.get('PATH', '')}"
    return subprocess.run([str(a) for a in args], input=stdin, capture_output=True, text=True,
                          cwd=work, env=environment, timeout=900)


@pytest.mark.slow
def test_the_wheel_installs_the_commands(installed):
    bin_dir, _ = installed
    where = run(installed, bin_dir / "python", "-c",
                "import keras_transformer, sys; print(keras_transformer.__file__); "
                "print('tensorflow' in sys.modules)")
    module_path, tensorflow_imported = where.stdout.split()
    assert module_path.startswith(str(bin_dir.parent)), module_path
    assert tensorflow_imported == "False"  # a light import: --help answers at once

    for command in ([bin_dir / "keras-transformer", "--help"],
                    [bin_dir / "python", "-m", "keras_transformer", "--help"]):
        result = run(installed, *command)
        assert result.returncode == 0, result.stderr
        assert all(f"  {name} " in result.stdout for name in COMMANDS), result.stdout
    for name in COMMANDS:
        result = run(installed, "keras-transformer", name, "--help")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: keras-transformer {name} ")
    result = run(installed, "keras-transformer", "trian")
    assert result.returncode == 2
    assert result.stderr.strip() == ("keras-transformer: unknown command 'trian'; choose one "
                                     "of train, export, translate, evaluate (see --help)")


@pytest.mark.slow
def test_the_wheel_trains_exports_and_translates(installed):
    result = run(installed, "keras-transformer", "train", "--out", "run", "--model", "tiny",
                 "--steps", "5", "--checkpoint-every", "5", "--vocab-size", "600",
                 "--vocab-sentences", "4000", "--max-sentence-tokens", "24",
                 "--tokens-per-batch", "256", "--average-last", "1", "--test-sentences", "0",
                 "--alpha-sentences", "0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Trained 5 steps" in result.stdout
    assert result.stderr == "", result.stderr[-3000:]  # progress and results only

    result = run(installed, "keras-transformer", "export", "--run", "run", "--out", "exported",
                 "--beam-sizes", "1,4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "keras-transformer export: wrote exported/1, checked in a separate process" \
        in result.stdout

    sentences = "In the beginning, God created the heavens and the earth.\n\nJesus wept.\n"
    result = run(installed, "keras-transformer", "translate", "--export", "exported",
                 stdin=sentences)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    assert lines[0] and lines[2]
