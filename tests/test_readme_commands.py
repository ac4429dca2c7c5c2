"""Every command of README.md and docs/ runs: each page's `keras-transformer` commands
(and `saved_model_cli`) in its ```bash blocks, in the page's order, in a fresh
directory, as written but shrunk by flags that keep them the same command (fewer
steps, a smaller vocabulary and batch, fewer test sentences, one exported beam size;
the paper's models at a small width). What a command reads and the page did not make (a run to export, an
export to translate with, your own corpus files) is made first: a tiny trained run,
its export, and files cut from the bundled corpus. TFDS corpora come from
`tfds.testing.mock_data`. ```sh blocks need what CI lacks (a model server, a GPU,
another host) and are not run; tests/test_docs.py checks their flags."""

import contextlib
import gzip
import os
import shutil
import subprocess
import sys

import keras
import pytest

from keras_transformer import cli
from tests import made_once
from tests.test_docs import DOC_PAGES
from tests.test_docs import doc_commands
from tests.test_docs import shell_commands
from tests.test_docs import code_blocks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLED = os.path.join(ROOT, "keras_transformer", "data", "bundled")
# Appended to each train command: later flags win in argparse.
SHRINK = ["--steps", "2", "--checkpoint-every", "1", "--keep-checkpoints", "1",
          "--average-last", "1", "--vocab-size", "600", "--vocab-sentences", "4000",
          "--max-sentence-tokens", "24", "--tokens-per-batch", "256", "--test-sentences", "2",
          "--alpha-sentences", "2",
          "--verbose"]
SMALL_SHAPE = ["--num-layers", "1", "--d-model", "32", "--d-ff", "64", "--num-heads", "2"]
EVALUATE_SHRINK = ["--limit", "2"]
# An export without --beam-sizes traces one search per signature, not four.
EXPORT_SHRINK = ["--beam-sizes", "4"]
# Flags whose value is a file or directory the command reads.
RUN_FLAGS = ("--run", "--init-from")
CORPUS_FLAGS = ("--data", "--test")
TEXT_FLAGS = ("--src", "--ref", "--warmup-file")
WRITTEN_FLAGS = ("--out", "--output", "-o")


def pages_with_commands():
    return [page for page in DOC_PAGES if doc_commands(page)]


def bundled_pairs(split, count, max_chars=80):
    """The first `count` pairs of a bundled split whose sides have at most `max_chars`
    characters (SHRINK's 24-token limit drops longer ones)."""
    pairs = []
    with gzip.open(os.path.join(BUNDLED, f"{split}.tsv.gz"), "rt", encoding="utf-8") as f:
        for line in f:
            pair = line.rstrip("\n").split("\t")
            if max(map(len, pair)) <= max_chars:
                pairs.append(pair)
                if len(pairs) == count:
                    break
    return pairs


def write_lines(path, lines):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def make_corpus(spec):
    """Writes the files of a `--data`/`--test` value ('{split}' paths) that do not exist."""
    if spec == "bundled" or spec.startswith("tfds:"):
        return
    paths = spec.split(",")
    for split, count in (("train", 1000), ("dev", 20), ("test", 20)):
        pairs = bundled_pairs(split, count)
        if len(paths) == 1:
            path = paths[0].replace("{split}", split)
            if not os.path.exists(path):
                write_lines(path, ["\t".join(pair) for pair in pairs])
        for side, path in enumerate(paths if len(paths) == 2 else []):
            path = path.replace("{split}", split)
            if not os.path.exists(path):
                write_lines(path, [pair[side] for pair in pairs])


def value(words, flag):
    return words[words.index(flag) + 1] if flag in words else None


def make_inputs(words, prepared):
    """Makes what the command reads and its page did not make."""
    for flag in RUN_FLAGS:
        path = value(words, flag)
        if path and not path.endswith(".h5") and not os.path.exists(path):
            shutil.copytree(prepared["run"], path)
    path = value(words, "--export")
    if path and not os.path.exists(path):
        shutil.copytree(prepared["export"], path)
    for flag in CORPUS_FLAGS:
        if value(words, flag):
            make_corpus(value(words, flag))
    sentences = [pair[0] for pair in bundled_pairs("test", 3)]
    for flag in TEXT_FLAGS:
        path = value(words, flag)
        if path and not os.path.exists(path):
            write_lines(path, sentences)
    if words[0] == "translate":  # its positional input file
        values = {words[i + 1] for i, word in enumerate(words[:-1]) if word.startswith("-")}
        for word in words[1:]:
            if not word.startswith("-") and word not in values and not os.path.exists(word):
                write_lines(word, sentences)


def shrunk(words):
    if words[0] == "train":
        model = value(words, "--model") or "auto"
        return [*words, *SHRINK, *(SMALL_SHAPE if model in ("base", "big") else [])]
    if words[0] == "evaluate":
        return [*words, *EVALUATE_SHRINK]
    if words[0] == "export" and "--beam-sizes" not in words:
        return [*words, *EXPORT_SHRINK]
    return list(words)


def run_command(words, capsys):
    """Runs `keras-transformer WORDS` in this process; returns (status, stdout, stderr)."""
    mock = contextlib.nullcontext()
    if any(word.startswith("tfds:") for word in words):
        tfds = pytest.importorskip("tensorflow_datasets")
        mock = tfds.testing.mock_data(num_examples=64)
    try:
        with mock:
            status = cli.main(words)
    except SystemExit as exit:  # argparse's usage errors
        status = exit.code
    finally:
        keras.config.set_dtype_policy("float32")  # --precision sets the global policy
    output = capsys.readouterr()
    return status, output.out, output.err


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A tiny trained run and its export, for commands that read ones their page did
    not make."""
    def make(top):
        assert cli.main(["train", "--model", "tiny", *SHRINK, "--test-sentences", "0",
                         "--out", str(top / "run")]) == 0
        keras.config.set_dtype_policy("float32")
        assert cli.main(["export", "--run", str(top / "run"), "--out", str(top / "export"),
                         *EXPORT_SHRINK]) == 0

    top = made_once(tmp_path_factory, "prepared", make)  # once for all the workers
    return {"run": str(top / "run"), "export": str(top / "export")}


def test_every_bash_command_is_run_or_run_elsewhere():
    """A ```bash block holds only commands this module runs, or the set-up and test
    scripts that CI itself runs (scripts/test.sh) and tests/test_wheel.py installs."""
    elsewhere = ("bash scripts/", "pip install ")
    for page in DOC_PAGES:
        for block in code_blocks(page, ("bash",)):
            for command in shell_commands(block):
                assert command.startswith(("keras-transformer ", "saved_model_cli ",
                                           *elsewhere)), f"{page}: {command!r} is not run"


def test_the_docs_have_commands_to_run():
    commands = [words for page in DOC_PAGES for words, _ in doc_commands(page)]
    assert len(commands) >= 15, commands
    ran = {words[0] for words in commands}
    assert {"train", "export", "translate", "evaluate"} <= ran, ran
    assert any("--time-budget" in words for words in commands)
    assert any(any("{split}" in word for word in words) for words in commands)


@pytest.mark.slow
@pytest.mark.parametrize("page", pages_with_commands())
def test_page_commands_run(page, prepared, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the commands' relative paths land here
    bash = [command for block in code_blocks(page, ("bash",))
            for command in shell_commands(block)]
    commands = iter(doc_commands(page))
    for command in bash:
        if command.startswith("saved_model_cli "):
            bin_dir = os.path.dirname(sys.executable)
            result = subprocess.run(command, shell=True, capture_output=True, text=True,
                                    env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                                    timeout=300)
            assert result.returncode == 0, f"{page}: {command}\n{result.stderr[-3000:]}"
            assert "signature_def['serving_default']" in result.stdout
            continue
        if not command.startswith("keras-transformer "):
            continue
        words, redirect = next(commands)
        make_inputs(words, prepared)
        status, out, err = run_command(shrunk(words), capsys)
        assert status == 0, f"{page}: keras-transformer {' '.join(words)}\n{err[-3000:]}"
        if redirect:
            write_lines(redirect, out.splitlines())
        if words[0] == "train" and "--test-sentences" not in words:
            assert "Test BLEU on 2 sentences" in out, out[-2000:]
        elif words[0] == "export":
            out_dir = value(words, "--out")
            assert os.listdir(out_dir), out_dir
        elif words[0] == "evaluate":
            assert "sacreBLEU" in out or '"bleu"' in out, out[-2000:]
        elif words[0] == "translate":
            output = value(words, "--output") or redirect
            translated = open(output).read() if output else out
            assert translated.strip(), words
