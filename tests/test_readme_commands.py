"""Every `keras-transformer train` command line in the README runs: as written, with the
steps, data sizes and (for the paper's models) the shape shrunk so that each
takes seconds; TFDS corpora come from `tfds.testing.mock_data`."""

import os
import re
import shlex

import keras
import pytest

from keras_transformer.cli import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Appended to each command: later flags win in argparse.
SHRINK = ["--steps", "2", "--checkpoint-every", "1", "--keep-checkpoints", "1",
          "--average-last", "1", "--vocab-size", "600", "--vocab-sentences", "4000",
          "--max-sentence-tokens", "24", "--tokens-per-batch", "256", "--test-sentences", "2",
          "--verbose"]
SMALL_SHAPE = ["--num-layers", "1", "--d-model", "32", "--d-ff", "64", "--num-heads", "2"]


def readme_train_commands():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for command in re.split(r"(?<!\\)\n", block):
            command = command.replace("\\\n", " ").split("#")[0].strip()
            if command.startswith("keras-transformer train") and "--help" not in command:
                commands.append(shlex.split(command)[2:])
    return commands


def test_the_readme_has_train_commands():
    commands = readme_train_commands()
    assert len(commands) >= 4, commands
    assert any("--time-budget" in command for command in commands)


@pytest.mark.slow
@pytest.mark.parametrize("args", readme_train_commands(), ids=" ".join)
def test_readme_train_command_runs(args, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the commands' relative --out paths land here
    extra = list(SHRINK)
    model = args[args.index("--model") + 1] if "--model" in args else "auto"
    if model in ("base", "big"):
        extra += SMALL_SHAPE
    try:
        if any(arg.startswith("tfds:") for arg in args):
            tfds = pytest.importorskip("tensorflow_datasets")
            with tfds.testing.mock_data(num_examples=64):
                code = train.main([*args, *extra])
        else:
            code = train.main([*args, *extra])
    finally:
        keras.config.set_dtype_policy("float32")  # --precision sets the global policy
    output = capsys.readouterr()
    assert code == 0, output.err[-3000:]
    assert "Test BLEU on 2 sentences" in output.out
