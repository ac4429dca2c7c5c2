"""Tests of export.py, translate.py and evaluate.py as a user runs them (subprocesses)."""

import concurrent.futures
import errno
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest
import sacrebleu
import tensorflow as tf

from tests import python_path
from tests.translation_fixtures import SENTENCES
from tests.translation_fixtures import make_model
from tests.translation_fixtures import make_run_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(script, *args, stdin=None):
    environment = dict(os.environ, PYTHONPATH=python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, script), *map(str, args)],
        input=stdin, capture_output=True, text=True, cwd=ROOT, env=environment,
        timeout=600,
    )


def assert_one_line_error(result, script, *fragments):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith(f"{script}:")]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize(
    "script, args, fragments",
    [
        ("export.py", ["--out", "x"], ["--run"]),
        ("export.py", ["--run", "/nonexistent", "--out", "x"], ["/nonexistent is not a directory"]),
        ("export.py", ["--run", ".", "--out", "x", "--beam-sizes", "4,a"], ["--beam-sizes"]),
        ("export.py", ["--run", ".", "--out", "x", "--version", "0"], ["--version must be >= 1"]),
        ("translate.py", [], ["--export", "--run"]),
        ("translate.py", ["--export", "/nonexistent"], ["/nonexistent is not a directory"]),
        ("translate.py", ["--export", ".", "missing.txt"], ["missing.txt does not exist"]),
        ("translate.py", ["--export", ".", "--batch-size", "0"], ["--batch-size must be >= 1"]),
        ("translate.py", ["--export", ".", "--output", "nowhere/x.txt"],
         ["--output nowhere/x.txt", "nowhere does not exist"]),
        ("translate.py", ["--export", ".", "--output", "tests"], ["tests is a directory"]),
        ("evaluate.py", ["--export", ".", "--output", "nowhere/x.txt"],
         ["nowhere does not exist"]),
        ("evaluate.py", ["--export", ".", "--src", "a.txt"], ["--src and --ref go together"]),
        ("evaluate.py", ["--run", ".", "--limit", "0"], ["--limit must be >= 1"]),
        ("evaluate.py", ["--export", ".", "--run", "."], ["not allowed with"]),
    ],
)
def test_bad_flags_give_one_line(script, args, fragments):
    assert_one_line_error(run(script, *args), script, *fragments)


def test_request_flags_the_translator_would_refuse_are_refused_before_it_loads(tmp_path):
    """A request setting the translator refuses was refused only once TensorFlow
    had started and the export had loaded (11 s), in TensorFlow's words: "the
    translator rejected the request: [extra_length must be >= 0; received.  ]
    [Condition x >= 0 did not hold element-wise:] [x (extra_length:0) = ] [-1]",
    and `--alpha nan` as "Graph execution error:". Now at once, in the flags'."""
    export = tmp_path / "export"
    os.makedirs(export / "1" / "assets.extra")
    (export / "1" / "saved_model.pb").write_bytes(b"")
    (export / "1" / "assets.extra" / "config.json").write_text(
        json.dumps({"translator": {"beam_sizes": [1, 4]}}))
    for script, flags, message in (
            ("translate.py", ["--extra-length", "-1"],
             "--extra-length must be an int >= 0. Received: --extra-length=-1"),
            ("evaluate.py", ["--alpha", "nan"],
             "--alpha must be a finite number. Received: --alpha=nan"),
            ("translate.py", ["--no-repeat-ngram-size", "-2"],
             "--no-repeat-ngram-size must be an int >= 0 (0 blocks nothing). Received: "
             "--no-repeat-ngram-size=-2"),
            ("translate.py", ["--beam-size", "0"], "--beam-size must be >= 1. Received: 0"),
            ("evaluate.py", ["--beam-size", "3"],
             "--beam-size 3: the export traced the beam sizes 1, 4 (export's --beam-sizes "
             "chooses them); pass one of those")):
        result = run(script, "--export", export, *flags)
        assert_one_line_error(result, script, f"{script}: {message} (see --help)")
    # A run traces the beam size asked for: any size is one it has.
    result = run("translate.py", "--run", tmp_path, "--beam-size", "3")
    assert "--beam-size" not in result.stderr and result.returncode != 0


def test_a_directory_that_is_not_a_run(tmp_path):
    result = run("export.py", "--run", tmp_path, "--out", tmp_path / "out")
    assert_one_line_error(result, "export.py", "config.json not found")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tokenizer):
    """A run whose final model (seed 1) is not its averaged weights (seed 0)."""
    from keras_transformer import runs

    path = make_run_dir(tmp_path_factory.mktemp("cli") / "run", tokenizer,
                        make_model(tokenizer.vocab_size))
    make_model(tokenizer.vocab_size, seed=1).save(os.path.join(path, runs.FINAL_MODEL))
    return path


@pytest.mark.slow
def test_export_translate_evaluate(run_dir, tmp_path):
    out = tmp_path / "export"
    result = run("export.py", "--run", run_dir, "--out", out, "--beam-sizes", "4",
                 "--extra-length", "8", "--no-check")
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}/1" in result.stdout
    assert os.path.exists(out / "1" / "saved_model.pb")

    source = tmp_path / "source.txt"
    source.write_text("\n".join(SENTENCES[:2] + ["", SENTENCES[3]]) + "\n", encoding="utf-8")
    result = run("translate.py", "--export", out, source)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")[:-1]
    assert len(lines) == 4 and lines[2] == "" and all(lines[i] for i in (0, 1, 3))

    # The run directory gives the same translations as the export. From a program
    # that writes a line and waits for its translation, through pipes, each line
    # is answered before the next is written; a reader that closes stdout ends
    # translate as SIGPIPE would, without a word.
    environment = dict(os.environ, PYTHONPATH=python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    process = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "translate.py"), "--run", str(run_dir),
         "--beam-size", "4", "--extra-length", "8"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=environment)
    watchdog = threading.Timer(300, process.kill)  # an unanswered line: readline gives ""
    watchdog.start()
    answers = []
    for line in source.read_text(encoding="utf-8").split("\n")[:-1]:
        process.stdin.write(line + "\n")
        process.stdin.flush()
        answers.append(process.stdout.readline())
    process.stdout.close()
    process.stdin.write(SENTENCES[0] + "\n")
    process.stdin.close()
    assert process.wait() == 141 and process.stderr.read() == ""
    watchdog.cancel()
    assert answers == [line + "\n" for line in lines]

    result = run("translate.py", "--export", out, source, "--beam-size", "3")
    assert_one_line_error(result, "translate.py", "--beam-size 3", "traced the beam sizes 4")

    # The same version again is refused as a flag's mistake, the export there kept.
    saved = (out / "1" / "saved_model.pb").read_bytes()
    result = run("export.py", "--run", run_dir, "--out", out, "--version", "1", "--no-check")
    assert_one_line_error(result, "export.py", f"{out}/1 exists already", "another version")
    assert "check" not in result.stderr
    assert (out / "1" / "saved_model.pb").read_bytes() == saved
    assert sorted(os.listdir(out)) == ["1", "batching_parameters.txt", "models.config"]

    # Request limits under translate's batch of 32 and the built-in warm-up: the
    # export takes the warm-up sentence that fits, translate batches within the
    # limit, and a line over the character limit is named before any work.
    limited = tmp_path / "limited"
    result = run("export.py", "--run", run_dir, "--out", limited, "--beam-sizes", "4",
                 "--extra-length", "8", "--max-batch-size", "1", "--max-input-chars", "60")
    assert result.returncode == 0, result.stderr
    result = run("translate.py", "--export", limited, source)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:-1] == lines
    result = run("translate.py", "--export", limited, stdin=f"Short.\n{'x' * 61}\n")
    assert_one_line_error(result, "translate.py", "sentence 2 is longer than",
                          "max_input_chars=60", "61 characters")

    # References that are not the sources: scored against the wrong column, BLEU differs.
    references = tmp_path / "references.txt"
    targets = [line if i % 2 else SENTENCES[i] for i, line in enumerate(lines)]
    references.write_text("\n".join(targets) + "\n", encoding="utf-8")
    expected = sacrebleu.corpus_bleu(lines, [targets])
    assert expected.score != sacrebleu.corpus_bleu(lines, [source.read_text().splitlines()]).score
    hypotheses = tmp_path / "hypotheses.txt"
    result = run("evaluate.py", "--export", out, "--src", source, "--ref", references,
                 "--no-progress", "--output", hypotheses)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"sacreBLEU: {expected}\n")
    intl = sacrebleu.corpus_bleu(lines, [targets], tokenize="intl").score
    assert f"tokenized BLEU (paper-style): {intl:.2f}\n" in result.stdout
    assert "signature: nrefs:1|case:mixed|eff:no|tok:13a" in result.stdout
    assert "tokenized BLEU (paper-style)" in result.stdout and "tok:intl" in result.stdout
    assert hypotheses.read_text(encoding="utf-8").split("\n")[:-1] == lines


class Recording:
    """A translator that records the decoding settings of each call."""

    def __init__(self, translator, options=None):
        # options: the DecodingConfig settings the command loaded it with.
        self.translator, self.calls, self.options = translator, [], options

    def translate(self, text, **knobs):
        self.calls.append({name: value.numpy().item() for name, value in knobs.items()})
        return self.translator.translate(text, **knobs)


@pytest.fixture(scope="module")
def run_translators(run_dir):
    """run_dir's translators by --weights, loaded once: each load would trace its
    searches again."""
    from keras_transformer import loading

    return {weights: loading.translator_from_run(run_dir, weights, beam_sizes=(1, 4))
            for weights in ("averaged", "final")}


def _main(module, monkeypatch, capsys, *flags, translators=None):
    """A command's main() in this process (no TensorFlow start-up), its stdout;
    --verbose keeps stderr as it is, the environment is restored afterwards. With
    `translators`, the command's --run loads the one of its --weights (see
    run_translators), wrapped in a `Recording`, returned with the output."""
    for name in ("TF_ENABLE_ONEDNN_OPTS", "TF_ONEDNN_ASSUME_FROZEN_WEIGHTS"):
        monkeypatch.setenv(name, os.environ.get(name, "1"))
    loaded = []
    if translators is not None:
        def run_translator(run, model, tokenizer, **options):
            loaded.append(Recording(translators[model], options))
            return loaded[-1]

        _load_runs_as(monkeypatch, run_translator)
    capsys.readouterr()
    assert module.main([*map(str, flags), "--verbose"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    return (out, loaded[0]) if translators is not None else out


def _load_runs_as(monkeypatch, run_translator):
    """A command's --run gives `run_translator(run, weights, None)`'s translator:
    `Run.load` is stubbed to give the name of its weights as the model."""
    from keras_transformer import loading
    from keras_transformer import runs

    def load(run, weights="averaged"):
        assert os.path.isdir(run.directory)
        return weights, None, {}

    monkeypatch.setattr(runs.Run, "load", load)
    monkeypatch.setattr(loading, "run_translator", run_translator)


def _translations(translator, sentences, **knobs):
    """`translator.translate`'s translations, its knobs given as Python values."""
    dtypes = dict(beam_size=tf.int32, alpha=tf.float32, extra_length=tf.int32,
                  no_repeat_ngram_size=tf.int32)
    outputs = translator.translate(
        tf.constant(sentences), **{k: tf.constant(v, dtypes[k]) for k, v in knobs.items()})
    return [t.decode() for t in outputs["translation"].numpy()]


def test_a_full_disk_keeps_the_output_file_that_was_there_and_says_so(
        run_dir, run_translators, tmp_path, monkeypatch, capsys):
    """translate and evaluate write --output whole or not at all: a disk that
    fills as the file is written (here at its fsync, where a delayed write's
    ENOSPC surfaces) leaves the file that was there, and the command says what
    failed in a line (exit 1) instead of a traceback."""
    from keras_transformer import durable
    from keras_transformer.cli import evaluate
    from keras_transformer.cli import translate

    source = tmp_path / "source.txt"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    output = tmp_path / "out.txt"
    output.write_text("what was there\n", encoding="utf-8")
    _load_runs_as(monkeypatch, lambda *args, **options: run_translators["averaged"])
    for name in ("TF_ENABLE_ONEDNN_OPTS", "TF_ONEDNN_ASSUME_FROZEN_WEIGHTS"):
        monkeypatch.setenv(name, os.environ.get(name, "1"))

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(durable.os, "fsync", full)
    for module, flags in ((translate, [source]), (evaluate, ["--src", source, "--ref", source])):
        capsys.readouterr()
        status = module.main([*map(str, flags), "--run", str(run_dir), "--output", str(output),
                              "--no-progress", "--verbose"])
        err = capsys.readouterr().err
        assert status == 1, err
        assert err.endswith(f": No space left on device: {output}; free some space.\n"), err
        assert output.read_text(encoding="utf-8") == "what was there\n"
        assert sorted(os.listdir(tmp_path)) == ["out.txt", "source.txt"]


def test_a_run_passed_as_an_export_and_an_export_as_a_run_are_named(run_dir, tmp_path, capsys):
    """translate, evaluate and export say which flag a run's or an export's
    directory belongs to (exit 2) as they check their flags, before TensorFlow
    starts, instead of that it holds no SavedModel or no config.json."""
    from keras_transformer.cli import evaluate
    from keras_transformer.cli import export
    from keras_transformer.cli import translate

    exported = tmp_path / "export"
    (exported / "3").mkdir(parents=True)
    (exported / "3" / "saved_model.pb").write_bytes(b"")
    source = tmp_path / "source.txt"
    source.write_text("Jesus wept.\n", encoding="utf-8")
    inputs = {translate: [source, "--no-progress"],
              evaluate: ["--src", source, "--ref", source, "--no-progress"],
              export: ["--out", tmp_path / "out"]}
    run_as_export = (f"--export {run_dir} is a training run's directory, not an export: "
                     f"translate with the run itself (--run {run_dir}), or export it first "
                     f"(keras-transformer export --run {run_dir} --out EXPORT)\n")
    export_as_run = (f"--run {exported} is an export, not a training run's directory: "
                     f"translate and evaluate it with --export {exported}\n")
    cases = [(translate, "--export", run_dir, run_as_export),
             (evaluate, "--export", run_dir, run_as_export),
             (translate, "--run", exported, export_as_run),
             (evaluate, "--run", exported, export_as_run),
             (export, "--run", exported, export_as_run)]
    for module, flag, path, message in cases:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:  # parse_args: before start_decoding
            module.parse_args([*map(str, inputs[module]), flag, str(path)])
        assert exited.value.code == 2
        assert capsys.readouterr().err == f"{module.PROG}: {message}"
    # A run directory that an export was written into is still a run; an
    # export and a run each where they belong pass.
    both = tmp_path / "both"
    shutil.copytree(run_dir, both)
    shutil.copytree(exported / "3", both / "1")
    for module, flag, path in ((export, "--run", both), (translate, "--run", both),
                               (translate, "--export", exported),
                               (evaluate, "--export", exported)):
        assert getattr(module.parse_args([*map(str, inputs[module]), flag, str(path)]),
                       flag[2:]) == str(path)


@pytest.mark.slow
def test_export_on_a_full_disk_says_what_it_wrote(run_dir, tmp_path, monkeypatch, capsys):
    """A disk that fills under the SavedModel: one line, nothing exported (exit 1).
    One that fills under TF Serving's files, after the version is whole: the line
    says the version was written and which file was not."""
    from keras_transformer import saved_model
    from keras_transformer.cli import export

    for name in ("TF_ENABLE_ONEDNN_OPTS", "TF_ONEDNN_ASSUME_FROZEN_WEIGHTS"):
        monkeypatch.setenv(name, os.environ.get(name, "1"))
    flags = ["--run", str(run_dir), "--beam-sizes", "1", "--beam-size", "1", "--jit-compile",
             "off", "--no-check", "--verbose"]
    out = tmp_path / "exports"

    def full_under_the_saved_model(obj, path, signatures=None):
        raise tf.errors.ResourceExhaustedError(
            None, None, f"{path}/saved_model.pb.tmp3b2; No space left on device")

    with monkeypatch.context() as patches:
        patches.setattr(tf.saved_model, "save", full_under_the_saved_model)
        capsys.readouterr()
        assert export.main([*flags, "--out", str(out)]) == 1
    assert capsys.readouterr().err == (
        f"keras-transformer export: No space left on device: {out / '1'}; free some space. "
        "Nothing was exported.\n")
    assert not out.exists() or os.listdir(out) == []

    def full_under_the_server_files(export_dir, *args, **kwargs):
        path = os.path.join(export_dir, saved_model.MODELS_CONFIG_FILENAME)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(saved_model, "write_model_server_files", full_under_the_server_files)
    assert export.main([*flags, "--out", str(out)]) == 1
    assert capsys.readouterr().err == (
        f"keras-transformer export: wrote {out / '1'}, but not TF Serving's files beside it: "
        f"No space left on device: {out / saved_model.MODELS_CONFIG_FILENAME}; free some "
        "space.\n")
    assert sorted(os.listdir(out / "1")) == ["assets", "assets.extra", "fingerprint.pb",
                                             "saved_model.pb", "variables"]


def test_evaluate_scores_the_reference_column_and_writes_the_output(
        run_dir, run_translators, tmp_path, monkeypatch, capsys):
    """evaluate --src/--ref and --test FILE.tsv: the BLEU printed is sacreBLEU's of
    the translations written with --output against the references, not the sources."""
    from keras_transformer.cli import evaluate
    from keras_transformer.cli import translate

    sources = [*SENTENCES, ""]  # an empty source: an empty line, kept in --output
    source = tmp_path / "source.txt"
    source.write_text("\n".join(sources) + "\n", encoding="utf-8")
    decoding = ["--beam-size", "1", "--extra-length", "4", "--batch-size", "3"]
    translations = tmp_path / "translations.txt"
    _main(translate, monkeypatch, capsys, "--run", run_dir, source, "--output", translations,
          *decoding, translators=run_translators)
    lines = translations.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == len(sources)
    targets = [line if i % 2 else sources[(i + 1) % len(sources)]
               for i, line in enumerate(lines)]
    expected = sacrebleu.corpus_bleu(lines, [targets])
    assert 0 < expected.score < 100
    assert expected.score != sacrebleu.corpus_bleu(lines, [sources]).score
    references = tmp_path / "references.txt"
    references.write_text("\n".join(targets) + "\n", encoding="utf-8")
    tsv = tmp_path / "test.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in zip(sources, targets)), encoding="utf-8")

    for corpus in (["--src", source, "--ref", references], ["--test", tsv]):
        output = tmp_path / "hypotheses.txt"
        out, _ = _main(evaluate, monkeypatch, capsys, "--run", run_dir, *corpus, *decoding,
                       "--output", output, "--json", "--no-progress", translators=run_translators)
        scores = json.loads(out)
        assert output.read_text(encoding="utf-8").split("\n")[:-1] == lines
        assert scores["bleu"] == expected.score
        assert scores["tokenized_bleu"] == sacrebleu.corpus_bleu(
            lines, [targets], tokenize="intl").score
        assert scores["sentences"] == len(sources)


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_decoding_flags_and_weights_reach_the_search(
        command, run_dir, run_translators, tmp_path, monkeypatch, capsys):
    """--beam-size, --alpha, --extra-length and --weights: each call of the search
    gets the flag's value, and the lines written are that search's translations."""
    import importlib

    module = importlib.import_module(f"keras_transformer.cli.{command}")
    sources = SENTENCES[:3]
    source = tmp_path / "source.txt"
    source.write_text("\n".join(sources) + "\n", encoding="utf-8")
    output = tmp_path / "output.txt"
    corpus = ([source] if command == "translate"
              else ["--src", source, "--ref", source, "--no-progress"])
    got = {}
    for flags, weights, knobs in [
        (["--extra-length", "3"], "averaged", dict(extra_length=3)),
        (["--extra-length", "3", "--beam-size", "1"], "averaged",
         dict(extra_length=3, beam_size=1)),
        (["--extra-length", "3", "--alpha", "1.5"], "averaged", dict(extra_length=3, alpha=1.5)),
        (["--extra-length", "3", "--weights", "final"], "final", dict(extra_length=3)),
        (["--extra-length", "3", "--no-repeat-ngram-size", "1"], "averaged",
         dict(extra_length=3, no_repeat_ngram_size=1)),
    ]:
        _, recording = _main(module, monkeypatch, capsys, "--run", run_dir, *corpus,
                             "--output", output, *flags, translators=run_translators)
        assert recording.translator is run_translators[weights]
        # The run's translator traces the one search the command asks for, and
        # refuses no sentence for its characters.
        beam_size = knobs.get("beam_size", 4)
        assert recording.options == {"beam_size": beam_size, "beam_sizes": (beam_size,),
                                     "max_input_chars": None}
        assert recording.calls and all(call == knobs for call in recording.calls), flags
        lines = output.read_text(encoding="utf-8").split("\n")[:-1]
        assert lines == _translations(run_translators[weights], sources, **knobs), flags
        got[" ".join(flags)] = lines
    # The flags that should change these translations do.
    assert got["--extra-length 3 --beam-size 1"] != got["--extra-length 3"]
    assert got["--extra-length 3 --weights final"] != got["--extra-length 3"]


def test_stdin_chunks_answer_each_line_once_no_more_are_waiting():
    """Lines are handed on as soon as nothing more is waiting in the pipe (what
    a program that waits for each answer, or a person typing, needs), at most
    `most` at a time, a line written in two parts as one, the last line without
    a newline too; the first line that is not UTF-8 is reported as it comes."""
    from keras_transformer.cli import translate

    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as stream, \
            concurrent.futures.ThreadPoolExecutor(1) as waiting:
        not_utf8 = []
        chunks = translate.stdin_chunks(stream, most=3, first_not_utf8=not_utf8.append)

        def next_chunk():  # a chunk that waits for more lines fails the test, not hangs it
            return waiting.submit(next, chunks).result(timeout=30)

        try:
            os.write(write_end, b"one\n")
            assert next_chunk() == ["one"]  # not waiting for a second line
            os.write(write_end, b"tw")
            os.write(write_end, b"o\r\n\xf1\n")
            assert next_chunk() == ["two", "\ufffd"]
            assert not_utf8 == [3]
            os.write(write_end, "".join(f"{i}\n" for i in range(7)).encode() + b"\xff\xe2 x")
            assert next_chunk() == ["0", "1", "2"]
            assert next_chunk() == ["3", "4", "5"]
            assert next_chunk() == ["6"]  # the unfinished line waits for its newline
        finally:
            os.close(write_end)
        assert list(chunks) == [["\ufffd\ufffd x"]]
        assert not_utf8 == [3]  # the first only


def test_translate_answers_a_pipe_or_a_terminal_line_by_line(
        run_dir, run_translators, tmp_path, monkeypatch, capsys):
    """stdin a pipe (or a terminal) and stdout the output: the translations are
    the search's, in order, chunk after chunk, each chunk numbered on from the
    last in errors; a terminal is told how to type and end; the first line that
    is not UTF-8 is named as it comes, the ones after it not."""
    from keras_transformer import evaluation
    from keras_transformer.cli import translate

    class Terminal:
        def __init__(self, stream):
            self.buffer = stream

        def fileno(self):
            return self.buffer.fileno()

        def isatty(self):
            return True

    def pipe(text, terminal):
        read_end, write_end = os.pipe()
        os.write(write_end, text if isinstance(text, bytes) else text.encode("utf-8"))
        os.close(write_end)
        stream = os.fdopen(read_end, "rb")
        monkeypatch.setattr(sys, "stdin", Terminal(stream) if terminal else
                            io.TextIOWrapper(stream))

    monkeypatch.setattr(translate, "CHUNK_LINES", 3)
    sources = SENTENCES[:2] + ["", SENTENCES[3]]
    expected = _translations(run_translators["averaged"], sources, extra_length=3)
    for terminal in (False, True):
        pipe("\n".join(sources) + "\n", terminal)
        out, _ = _main(translate, monkeypatch, capsys, "--run", run_dir, "--extra-length",
                       "3", translators=run_translators)
        assert out.split("\n")[:-1] == expected
    # A line of more pieces than the model reads, in the second chunk: named by
    # its line's number as its chunk is answered.
    translator = run_translators["averaged"]
    limit, paragraph = translator.config.max_input_length, " ".join(SENTENCES * 4)
    pipe("\n".join(sources + [paragraph]) + "\n", terminal=False)
    out, err = _translate_file("-", run_dir, translator, monkeypatch, capsys)
    assert out.split("\n")[:-1] == _translations(translator, sources + [paragraph])
    assert err == ("keras-transformer translate: sentence 5 has more subword pieces than the "
                   f"translator's max_input_length={limit}: only its first {limit} were "
                   "translated, and its translation misses the rest; split long lines into "
                   "sentences\n")
    calls = []
    monkeypatch.setattr(evaluation, "translate_sentences",
                        lambda translator, chunk, *args, first_number, **knobs:
                        calls.append((len(chunk), first_number)) or [""] * len(chunk))
    pipe("\n".join(sources) + "\n", terminal=True)
    capsys.readouterr()
    assert translate.main(["--run", str(run_dir), "--verbose"]) == 0
    assert calls == [(3, 1), (1, 4)]
    assert capsys.readouterr().err == ("keras-transformer translate: type a sentence and "
                                       "press Enter; Ctrl-D ends\n")

    pipe(b"Jesus wept.\nEl se\xf1or.\nAmen.\nY \xe9l.\n", terminal=False)
    assert translate.main(["--run", str(run_dir), "--verbose"]) == 0
    assert capsys.readouterr().err == (
        "keras-transformer translate: stdin: line 2 is not UTF-8 (the first; later ones are "
        "not named); its bad bytes were read as U+FFFD and translated so. If it is in another "
        "encoding, convert it first, e.g. iconv -f WINDOWS-1252 -t UTF-8\n")


def test_translate_answering_stdin_makes_its_first_call_before_the_first_line(
        run_dir, monkeypatch, capsys):
    """Answering a pipe or a terminal line by line, translate makes the
    translator's first call, seconds long (its graph optimized, or a run's
    search traced), before the first line comes, with the same request settings:
    while a person types it. That call's translation is not written; the lines'
    are, in order."""
    from keras_transformer import evaluation
    from keras_transformer.cli import translate

    read_end, write_end = os.pipe()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(os.fdopen(read_end, "rb")))
    calls, warmed = [], threading.Event()

    def translate_sentences(translator, sentences, *args, **knobs):
        knobs.pop("first_number", None)
        calls.append((list(sentences), knobs))
        warmed.set()
        return [sentence.upper() for sentence in sentences]

    monkeypatch.setattr(evaluation, "translate_sentences", translate_sentences)
    typed = []

    def person():  # types the first line once the first call is made (or after 30 s)
        typed.append(warmed.wait(30))
        os.write(write_end, b"Jesus wept.\nAmen.\n")
        os.close(write_end)

    typing = threading.Thread(target=person)
    typing.start()
    capsys.readouterr()
    assert translate.main(["--run", str(run_dir), "--beam-size", "1", "--verbose"]) == 0
    typing.join()
    assert typed == [True], "no call before the first line"
    settings = {"beam_size": 1, "alpha": None, "extra_length": None,
                "no_repeat_ngram_size": None}
    assert calls == [([translate.WARM_UP_SENTENCE], settings),
                     (["Jesus wept.", "Amen."], settings)]
    assert capsys.readouterr().out == "JESUS WEPT.\nAMEN.\n"


@pytest.mark.parametrize("command", ["translate", "evaluate", "export"])
def test_ctrl_c_ends_a_decoding_command_without_a_stack(command, run_dir, tmp_path,
                                                         monkeypatch, capsys):
    """Ctrl-C (KeyboardInterrupt) while the model loads: exit status 130, stderr
    empty, nothing exported."""
    import importlib

    from keras_transformer import runs

    module = importlib.import_module(f"keras_transformer.cli.{command}")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runs.Run, "load", interrupted)
    for name in ("TF_ENABLE_ONEDNN_OPTS", "TF_ONEDNN_ASSUME_FROZEN_WEIGHTS"):
        monkeypatch.setenv(name, os.environ.get(name, "1"))
    source = tmp_path / "source.txt"
    source.write_text("Jesus wept.\n", encoding="utf-8")
    flags = {"translate": [source], "evaluate": ["--src", source, "--ref", source],
             "export": ["--out", tmp_path / "out"]}[command]
    capsys.readouterr()
    assert module.main([*map(str, flags), "--run", str(run_dir), "--verbose"]) == 130
    assert capsys.readouterr().err == ""
    assert not (tmp_path / "out").exists()


def test_evaluate_a_tfds_corpus_in_the_chosen_direction(
        run_dir, run_translators, tmp_path, monkeypatch, capsys):
    """--test tfds:NAME --split --source-language --target-language (TFDS's mock
    data: nothing is downloaded)."""
    import tensorflow_datasets as tfds

    from keras_transformer.cli import evaluate

    output = tmp_path / "hypotheses.txt"
    with tfds.testing.mock_data(num_examples=3):
        examples = list(tfds.load("wmt14_translate/de-en", split="validation")
                        .as_numpy_iterator())
        out, _ = _main(evaluate, monkeypatch, capsys, "--run", run_dir,
                       "--test", "tfds:wmt14_translate/de-en", "--split", "validation",
                       "--source-language", "de", "--target-language", "en",
                       "--extra-length", "2", "--beam-size", "1",
                       "--output", output, "--json", "--no-progress",
                       translators=run_translators)
    sources = [e["de"].decode() for e in examples]
    references = [e["en"].decode() for e in examples]
    hypotheses = output.read_text(encoding="utf-8").split("\n")[:-1]
    assert hypotheses == _translations(run_translators["averaged"], sources, extra_length=2,
                                       beam_size=1)
    scores = json.loads(out)
    assert scores["sentences"] == 3
    assert scores["bleu"] == sacrebleu.corpus_bleu(hypotheses, [references]).score


@pytest.mark.slow
def test_export_flags_land_where_they_act(run_dir, tokenizer, tmp_path, monkeypatch, capsys):
    """Each export flag observed where it lands: the signatures' defaults, the
    export's config.json, models.config and the batching file as TF Serving
    parses them, the warm-up records, the weights' type and which weights."""
    from keras_transformer import runs
    from keras_transformer import saved_model
    from keras_transformer.cli import export
    from tests.test_saved_model import batching_parameters
    from tests.test_saved_model import model_server_config
    from tensorflow_serving.apis import prediction_log_pb2

    warmup = tmp_path / "warmup.txt"
    warmup.write_text("Jesus wept.\n\nLove your neighbor.\n", encoding="utf-8")
    out = tmp_path / "exports"
    _main(export, monkeypatch, capsys, "--run", run_dir, "--out", out, "--weights", "final",
          "--beam-size", "2", "--beam-sizes", "1,2", "--alpha", "1.25", "--extra-length", "5",
          "--no-repeat-ngram-size", "3", "--max-input-length", "12", "--max-batch-size", "8", "--max-input-chars", "300",
          "--model-name", "wmt", "--warmup-file", warmup, "--precision", "float16",
          "--jit-compile", "off", "--no-check")
    path = str(out / "1")
    with open(os.path.join(path, "assets.extra", saved_model.CONFIG_FILENAME)) as f:
        config = json.load(f)
    settings = config["translator"]
    assert {k: settings[k] for k in ("beam_size", "beam_sizes", "alpha", "extra_length",
                                     "no_repeat_ngram_size", "max_input_length",
                                     "max_batch_size", "max_input_chars")} \
        == {"beam_size": 2, "beam_sizes": [1, 2], "alpha": 1.25, "extra_length": 5,
            "no_repeat_ngram_size": 3, "max_input_length": 12, "max_batch_size": 8,
            "max_input_chars": 300}
    assert config["run"]["weights"] == "final"
    # The defaults a request that leaves the knobs out gets (TF Serving's TF1 session).
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta_graph = tf.compat.v1.saved_model.load(session, ["serve"], path)
        defaults = meta_graph.signature_def["translate"].defaults
        assert {name: tf.make_ndarray(value).item() for name, value in defaults.items()} == {
            "beam_size": 2, "alpha": 1.25, "extra_length": 5, "no_repeat_ngram_size": 3}
    [entry] = model_server_config(out / saved_model.MODELS_CONFIG_FILENAME) \
        .model_config_list.config
    assert (entry.name, entry.base_path) == ("wmt", "/models/wmt")
    assert batching_parameters(out / saved_model.BATCHING_FILENAME).max_batch_size.value == 8
    texts = set()
    for record in tf.data.TFRecordDataset(
            os.path.join(path, "assets.extra", saved_model.WARMUP_FILENAME)).as_numpy_iterator():
        inputs = prediction_log_pb2.PredictionLog.FromString(record).predict_log.request.inputs
        if "text" in inputs:
            texts |= {t.decode() for t in tf.make_ndarray(inputs["text"]).reshape(-1)}
    assert texts == {"Jesus wept.", "Love your neighbor."}
    # The final model's weights (not the averaged ones), held in float16.
    def embedding(model):
        [table] = [w.numpy() for w in model.weights if "shared_embedding" in w.path]
        return table.astype(np.float16)

    reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
    final = embedding(runs.Run(run_dir).load("final")[0])
    tables = [reader.get_tensor(name) for name, shape in
              reader.get_variable_to_shape_map().items() if tuple(shape) == final.shape]
    assert tables and all(table.dtype == np.float16 for table in tables)
    assert any(np.array_equal(table, final) for table in tables)
    averaged = embedding(runs.Run(run_dir).load("averaged")[0])
    assert not any(np.array_equal(table, averaged) for table in tables)
    loaded = tf.saved_model.load(path)
    # Too long for --max-input-chars, too many for --max-batch-size: refused.
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_input_chars=300"):
        loaded.translate(tf.constant(["a" * 301]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_batch_size=8"):
        loaded.translate(tf.constant(["Hi."] * 9))

    _main(export, monkeypatch, capsys, "--run", run_dir, "--out", tmp_path / "ids",
          "--ids-only", "--beam-sizes", "1", "--beam-size", "1", "--jit-compile", "off",
          "--no-check")
    ids_only = tf.saved_model.load(str(tmp_path / "ids" / "1"))
    assert sorted(ids_only.signatures) == ["serving_default", "translate_ids"]


def test_export_takes_the_decoding_the_run_chose_unless_told(run_dir, tmp_path, monkeypatch,
                                                          capsys):
    """The length penalty and blocking train chose on dev pairs (the run's
    decoding.json) are the export's defaults; --alpha, --no-repeat-ngram-size
    and --[no-]block-adjacent-repeats win over them, each on its own; an
    --ids-only export, which cannot tell words, says it leaves that one out."""
    from keras_transformer import runs
    from keras_transformer.cli import export

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    runs.Run(run).write_decoding({"alpha": 1.0, "no_repeat_ngram_size": 4,
                                  "block_adjacent_repeats": True},
                                 {(4, 0.6): 20.0, (0, 0.6): 19.0, (4, 0.8): 21.0,
                                  (4, 1.0): 21.5, (4, 1.2): 19.0}, 300)
    exported = _record_exports(monkeypatch)
    outputs = []
    for flags in ((), ("--alpha", "0.7"), ("--no-repeat-ngram-size", "0"),
                  ("--alpha", "0.7", "--no-repeat-ngram-size", "3"),
                  ("--no-block-adjacent-repeats",), ("--no-recase-capitals",),
                  ("--ids-only",)):
        outputs.append(_main(export, monkeypatch, capsys, "--run", run, "--out",
                             tmp_path / "out", "--beam-sizes", "1", "--beam-size", "1",
                             "--jit-compile", "off", *flags))
    # Sentences in capitals are recased unless told, and an ids-only export has no text.
    assert exported == [(1.0, 4, True, True), (0.7, 4, True, True), (1.0, 0, True, True),
                        (0.7, 3, True, True), (1.0, 4, False, True), (1.0, 4, True, False),
                        (1.0, 4, False, False)]
    assert "an --ids-only export cannot" in outputs[-1]
    assert not any("--ids-only" in output for output in outputs[:-1])


def _record_exports(monkeypatch):
    """Stubs the export's writing (no search traced): a list that gets the
    decoding of each translator exported, `(alpha, no_repeat_ngram_size,
    block_adjacent_repeats, recase_capitals)`."""
    from keras_transformer import saved_model

    exported = []

    def export_translator(translator, out, *args, **kwargs):
        config = translator.config
        exported.append((config.alpha, config.no_repeat_ngram_size,
                         config.block_adjacent_repeats, config.recase_capitals))
        return os.path.join(out, "1")

    monkeypatch.setattr(saved_model, "export_translator", export_translator)
    monkeypatch.setattr(saved_model, "write_model_server_files",
                        lambda out, *args: [os.path.join(out, name)
                                            for name in ("models.config", "batching")])
    return exported


def _stopped_run(run_dir, path, training):
    """A copy of `run_dir` as a run that stopped before its end, trained with
    `training` (a TrainingConfig): its averaged weights are its one checkpoint
    (step 40), and it has no averaged weights, final model or decoding.json."""
    from keras_transformer import runs

    shutil.copytree(run_dir, path)
    run = runs.Run(str(path))
    os.makedirs(run.checkpoints.directory)
    os.replace(run.averaged_weights,
               os.path.join(run.checkpoints.directory, "ckpt-00000040.weights.h5"))
    os.remove(os.path.join(run.directory, runs.FINAL_MODEL))
    os.remove(run.decoding_path)
    run.write_config(runs_model_config(run), training)
    return run


def test_export_of_a_stopped_run_chooses_its_decoding_on_its_dev_pairs(
        run_dir, tokenizer, tmp_path, monkeypatch, capsys):
    """A run that stopped before its end has not chosen its decoding (a run
    chooses it as it ends): its export chooses it as train would have, on the
    run's first --alpha-sentences dev pairs with the run's two translators
    (float32; the paper's search, and one that blocks words repeated back to
    back), says what it chose, and takes it where no flag says otherwise. With
    all three flags given it chooses nothing; where the dev pairs cannot be
    read, it says so and decodes as the paper does. The averaged weights of a
    run that ended before runs chose (2026-11-26) keep the paper's decoding, as
    its exports did (tests/test_legacy_fixture.py)."""
    from keras_transformer import data
    from keras_transformer import evaluation
    from keras_transformer.cli import export
    from keras_transformer.config import TrainingConfig

    run = _stopped_run(run_dir, tmp_path / "run", TrainingConfig(alpha_sentences=3))
    exported = _record_exports(monkeypatch)
    asked, searchers = [], []

    def choose_decoding(translator, pairs, blocking=None):
        asked.append(pairs)
        searchers.append((translator, blocking))
        return ({"no_repeat_ngram_size": 4, "alpha": 1.2, "block_adjacent_repeats": True},
                {(4, 0.6): 3.0, (4, 0.8): 4.0, (4, 1.0): 5.0, (4, 1.2): 6.0, (0, 1.2): 2.0})

    monkeypatch.setattr(evaluation, "choose_decoding", choose_decoding)

    def export_run(*flags):
        return _main(export, monkeypatch, capsys, "--run", run.directory, "--weights",
                     "checkpoints", "--out", tmp_path / "out", "--beam-sizes", "1",
                     "--beam-size", "1", "--jit-compile", "off", *flags)

    out = export_run()
    dev = [(pair["source"].decode(), pair["target"].decode())
           for pair in data.load_parallel("bundled", "dev").take(3).as_numpy_iterator()]
    assert asked == [dev]
    assert exported == [(1.2, 4, True, True)]
    # The checkpoint's weights, in float32: the paper's search, and one that blocks.
    checkpoint = make_model(tokenizer.vocab_size).get_weights()
    assert [searcher.config.block_adjacent_repeats for searcher in searchers[0]] == [False, True]
    for searcher in searchers[0]:
        assert searcher.config.precision == "float32"
        for theirs, ours in zip(searcher.model.get_weights(), checkpoint, strict=True):
            np.testing.assert_array_equal(theirs, ours)
    prog = "keras-transformer export"
    assert (f"{prog}: {run.directory} has not chosen the decoding of its translations (a run "
            "chooses it as it ends): choosing it now, on its first 3 dev pairs\n"
            f"{prog}: Decoding for this export's translations, chosen on 3 dev sentences: "
            "alpha 1.2, repeated 4-grams and words repeated back to back blocked (sacreBLEU "
            "with repeated 4-grams and words repeated back to back blocked: 3.0 at 0.6, 4.0 "
            "at 0.8, 5.0 at 1.0, 6.0 at 1.2; with nothing blocked at 1.2: 2.0. Sec. 6.1's "
            "alpha 0.6 unless another scores higher)\n") in out, out
    export_run("--alpha", "0.7")  # a flag wins over what is chosen
    assert len(asked) == 2 and exported[-1] == (0.7, 4, True, True)
    out = export_run("--alpha", "0.7", "--no-repeat-ngram-size", "0",
                     "--no-block-adjacent-repeats")
    assert len(asked) == 2 and exported[-1] == (0.7, 0, False, True)
    assert "has not chosen" not in out
    # A run that ended before runs chose (2026-11-26): its own weights keep the paper's.
    ended = tmp_path / "ended"
    shutil.copytree(run_dir, ended)
    os.remove(os.path.join(ended, "decoding.json"))
    out = _main(export, monkeypatch, capsys, "--run", ended, "--out", tmp_path / "out2",
                "--beam-sizes", "1", "--beam-size", "1", "--jit-compile", "off")
    assert len(asked) == 2 and exported[-1] == (0.6, 0, False, True)
    assert "has not chosen" not in out
    # Trained on a file that is gone since: the paper's decoding, and why.
    gone = tmp_path / "gone.tsv"
    run.write_config(runs_model_config(run), TrainingConfig(alpha_sentences=3, data=str(gone)))
    out = export_run()
    assert len(asked) == 2 and exported[-1] == (0.6, 0, False, True)
    assert (f"{prog}: the dev pairs of --data '{gone}' cannot be read (") in out, out
    assert ("; the export decodes as the paper does (alpha 0.6, nothing blocked) unless "
            "--alpha and --no-repeat-ngram-size say otherwise\n") in out, out


def runs_model_config(run):
    """The TransformerConfig that `run` (a `runs.Run`) records."""
    from keras_transformer.config import TransformerConfig

    return TransformerConfig.from_dict(run.read_config()["model"])


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_a_stopped_run_translated_says_it_has_not_chosen_its_decoding(
        command, run_dir, run_translators, tmp_path, monkeypatch, capsys):
    """translate and evaluate --run of a run that stopped before its end decode
    as the paper does (they choose no decoding, which takes dev passes), and say
    so, unless --alpha and --no-repeat-ngram-size say how; of a run that chose,
    or that ended before runs chose, they say nothing of it."""
    import importlib

    from keras_transformer.config import TrainingConfig

    module = importlib.import_module(f"keras_transformer.cli.{command}")
    stopped = _stopped_run(run_dir, tmp_path / "run", TrainingConfig()).directory
    source = tmp_path / "source.txt"
    source.write_text("Jesus wept.\n", encoding="utf-8")
    corpus = ([source] if command == "translate"
              else ["--src", source, "--ref", source, "--no-progress"])
    translators = {"checkpoints": run_translators["averaged"], **run_translators}
    _load_runs_as(monkeypatch, lambda run, model, tokenizer, **options: translators[model])
    ended = tmp_path / "ended"  # a run that ended before runs chose (2026-11-26)
    shutil.copytree(run_dir, ended)
    os.remove(os.path.join(ended, "decoding.json"))
    said = []
    for run, weights, flags in [
            (stopped, "checkpoints", []), (stopped, "checkpoints", ["--alpha", "1.0"]),
            (stopped, "checkpoints", ["--alpha", "1.0", "--no-repeat-ngram-size", "0"]),
            (run_dir, "averaged", []), (ended, "averaged", [])]:
        assert module.main([*map(str, ["--run", run, "--weights", weights, *corpus, *flags,
                                       "--output", tmp_path / "out.txt"])]) == 0
        said.append(capsys.readouterr().err)
    note = (f"keras-transformer {command}: {stopped} has not chosen the decoding of its "
            "translations (a run chooses it on its dev set as it ends): this decodes as the "
            "paper does (alpha 0.6, nothing blocked) unless --alpha and "
            "--no-repeat-ngram-size say otherwise; its export chooses it\n")
    # With --alpha alone, --no-repeat-ngram-size is still the run's.
    assert said == [note, note, "", "", ""]


def test_evaluate_reads_corpora_as_train_does(tmp_path):
    """--test takes train's --data forms: '{split}' paths and 'SOURCE,TARGET' files."""
    from keras_transformer.cli import evaluate

    for split in ("dev", "test"):
        (tmp_path / f"{split}.tsv").write_text(f"{split} one\tuno\n{split} two\tdos\n")
        (tmp_path / f"{split}.en").write_text(f"{split} one\n")
        (tmp_path / f"{split}.es").write_text("uno\n")

    def pairs(*flags):
        args = evaluate.parse_args(["--run", str(tmp_path), *flags])
        return [(p["source"].decode(), p["target"].decode())
                for p in evaluate.load_pairs(args)[0].as_numpy_iterator()]

    assert pairs("--test", str(tmp_path / "{split}.tsv"), "--split", "dev") == [
        ("dev one", "uno"), ("dev two", "dos")]
    assert pairs("--test", str(tmp_path / "{split}.en") + "," + str(tmp_path / "{split}.es"),
                 "--split", "test") == [("test one", "uno")]
    assert pairs("--test", str(tmp_path / "test.tsv")) == [("test one", "uno"), ("test two", "dos")]
    with pytest.raises(FileNotFoundError, match="neither 'bundled'"):
        evaluate.load_pairs(evaluate.parse_args(["--run", str(tmp_path), "--test", "no.tsv"]))
    # What its messages call a sentence: by its split, or by its line in a file of one.
    files = [str(tmp_path / name) for name in ("{split}.tsv", "test.tsv", "test.en", "test.es")]
    named = {flags: evaluate.load_pairs(evaluate.parse_args(["--run", str(tmp_path), *flags]))[1]
             for flags in [("--test", files[0], "--split", "dev"), ("--test", "bundled"), (),
                           ("--test", files[1]), ("--src", files[2], "--ref", files[3])]}
    assert list(named.values()) == ["dev sentence", "test sentence", "test sentence", "sentence",
                                    "sentence"]


def test_evaluate_scores_the_corpus_the_run_trained_on_unless_told(tmp_path):
    """Without --test, evaluate scores the --split of the corpus that the --run,
    or the run of the --export, trained on, in its direction: not the bundled
    English-Spanish pairs, whatever the run translates (BLEU near 0, silently)."""
    from keras_transformer import data
    from keras_transformer import export_files
    from keras_transformer.cli import evaluate

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("dev", "test"):
        (corpus / f"{split}.de").write_text(f"{split} eins\n{split} zwei\n")
        (corpus / f"{split}.en").write_text(f"{split} one\n{split} two\n")
    files = f"{corpus}/{{split}}.de,{corpus}/{{split}}.en"
    run, export = tmp_path / "run", tmp_path / "export"
    (export / "1" / "assets.extra").mkdir(parents=True)
    (export / "1" / "saved_model.pb").write_bytes(b"")

    def record(**training):
        run.mkdir(exist_ok=True)
        (run / "config.json").write_text(json.dumps({"model": {}, "training": training}))
        (export / "1" / "assets.extra" / export_files.CONFIG_FILENAME).write_text(
            json.dumps({"run": {"model": {}, "training": training}}))

    def pairs(*flags, take=2):
        found = []
        for where in (["--run", str(run)], ["--export", str(export)]):
            args = evaluate.parse_args([*where, *flags])
            found.append([(p["source"].decode(), p["target"].decode()) for p in
                          evaluate.load_pairs(args)[0].take(take).as_numpy_iterator()])
        assert found[0] == found[1], found  # the run's and its export's alike
        return found[0]

    record(data=files, source_language=None, target_language=None)
    assert pairs() == [("test eins", "test one"), ("test zwei", "test two")]
    assert pairs("--split", "dev", take=1) == [("dev eins", "dev one")]
    assert evaluate.load_pairs(evaluate.parse_args(["--run", str(run)]))[1] == "test sentence"
    bundled = data.load_parallel("bundled", "test").take(1).as_numpy_iterator()
    english, spanish = (text.decode() for text in next(bundled).values())
    assert pairs("--test", "bundled", take=1) == [(english, spanish)]
    # A run of the bundled corpus from Spanish to English: scored in that direction.
    record(data="bundled", source_language="es", target_language="en")
    assert pairs(take=1) == [(spanish, english)]
    assert pairs("--source-language", "en", take=1) == [(english, spanish)]
    # The corpus's files seen from elsewhere (a relative --data): named, and what to do.
    record(data="elsewhere/{split}.tsv", source_language=None, target_language=None)
    with pytest.raises(FileNotFoundError, match=r"elsewhere/test.tsv does not exist or is not "
                       r"a file: the test split of the corpus the run trained on \(--data "
                       r"'elsewhere/\{split\}.tsv'\); pass --test to score another"):
        evaluate.load_pairs(evaluate.parse_args(["--run", str(run)]))
    # Files without splits: the pairs train held out of them, drawn by the run's seed.
    (corpus / "all.de").write_text("".join(f"satz {i}\n" for i in range(40)))
    (corpus / "all.en").write_text("".join(f"sentence {i}\n" for i in range(40)))
    whole = f"{corpus}/all.de,{corpus}/all.en"
    record(data=whole, source_language=None, target_language=None, seed=5)
    held, _ = data.hold_out(data.load_parallel((f"{corpus}/all.de", f"{corpus}/all.en")), 5)
    for split in ("test", "dev"):
        assert pairs("--split", split) == [(p["source"].decode(), p["target"].decode())
                                           for p in held[split].as_numpy_iterator()]
    args = evaluate.parse_args(["--run", str(run), "--split", "dev"])
    assert evaluate.load_pairs(args)[1] == "dev sentence"  # not a line of all.de
    with pytest.raises(ValueError, match="--split validation: the run held dev and test pairs "
                                         "out of --data"):
        evaluate.load_pairs(evaluate.parse_args(["--run", str(run), "--split", "validation"]))
    # An export of the library's records no run: the bundled pairs.
    (export / "1" / "assets.extra" / export_files.CONFIG_FILENAME).write_text("{}")
    args = evaluate.parse_args(["--export", str(export)])
    assert next(evaluate.load_pairs(args)[0].as_numpy_iterator())["source"].decode() == english


def test_translate_and_evaluate_show_the_progress_bar_as_the_library_decides(tmp_path):
    """Both commands leave the bar to `translate_sentences`'s "auto" (a terminal
    and 200 lines or more; tests/test_evaluation.py) unless a flag says."""
    from keras_transformer.cli import evaluate
    from keras_transformer.cli import translate

    for command in (evaluate, translate):
        assert command.parse_args(["--run", str(tmp_path)]).progress == "auto"
        assert command.parse_args(["--run", str(tmp_path), "--progress"]).progress is True
        assert command.parse_args(["--run", str(tmp_path), "--no-progress"]).progress is False


def test_the_weights_flags_name_a_runs_weights(run_dir, capsys):
    """--weights of export, translate and evaluate offers the weights a run loads,
    and each one it offers loads (the run has no checkpoints to average)."""
    import importlib

    from keras_transformer import runs

    offered = set()
    for command in ("export", "translate", "evaluate"):
        module = importlib.import_module(f"keras_transformer.cli.{command}")
        with pytest.raises(SystemExit):
            module.parse_args(["--run", str(run_dir), "--weights", "newest"])
        choices = re.search(r"invalid choice: 'newest' \(choose from (.*?)\)",
                            capsys.readouterr().err).group(1)
        offered.add(tuple(choice.strip("' ") for choice in choices.split(",")))
    assert offered == {("averaged", "final", "checkpoints")}
    for weights in offered.pop():
        try:
            runs.Run(str(run_dir)).load(weights)
        except FileNotFoundError as error:
            assert weights == "checkpoints" and "has no checkpoint yet" in str(error)


def test_a_checkpoint_cut_short_is_one_line_from_each_decoding_command(
        run_dir, tmp_path, capsys):
    """--weights checkpoints of a run whose newest checkpoint is cut short (a
    copy that stopped midway): each decoding command names the file in one line
    and exits 2, where translate and evaluate printed h5py's stack."""
    import importlib

    from keras_transformer import runs

    run = runs.Run(str(tmp_path / "run"))
    shutil.copytree(run_dir, run.directory)
    os.makedirs(run.checkpoints.directory)
    with open(run.averaged_weights, "rb") as f:
        whole = f.read()
    with open(run.checkpoints.path(7), "wb") as f:
        f.write(whole[:10000])
    (tmp_path / "in.txt").write_text("Hello.\n")
    for command, flags in (("export", ["--out", tmp_path / "export"]),
                           ("translate", [tmp_path / "in.txt"]),
                           ("evaluate", ["--src", tmp_path / "in.txt",
                                         "--ref", tmp_path / "in.txt"])):
        module = importlib.import_module(f"keras_transformer.cli.{command}")
        capsys.readouterr()
        assert module.main(["--run", run.directory, "--weights", "checkpoints",
                            *map(str, flags)]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        lines = [line for line in err.splitlines() if line.startswith("keras-transformer")]
        assert lines == [f"keras-transformer {command}: {run.checkpoints.path(7)} cannot be "
                         f"read: it is cut short (10000 of its {len(whole)} bytes). Was it "
                         "copied whole? Copy it again, or rename it to "
                         "ckpt-00000007.weights.h5.unreadable (train does so itself as it "
                         "resumes) to average the checkpoints before it"], err
    assert not os.path.exists(tmp_path / "export")

    # Renamed as the message says, the checkpoints before it are averaged, and
    # translate says which, as export does (on stderr: stdout is the output).
    for step in (3, 5):
        shutil.copyfile(run.averaged_weights, run.checkpoints.path(step))
    os.rename(run.checkpoints.path(7), run.checkpoints.path(7) + ".unreadable")
    from keras_transformer.cli import translate

    capsys.readouterr()
    assert translate.main(["--run", run.directory, "--weights", "checkpoints",
                           str(tmp_path / "in.txt")]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1
    assert (f"keras-transformer translate: the average of the checkpoints of steps 3, 5 "
            f"of {run.directory}\n") in err, err


def _translate_file(source, run_dir, translator, monkeypatch, capsys):
    """`keras-transformer translate SOURCE --run RUN_DIR` in this process (SOURCE
    - for stdin), its run loaded as `translator`: its stdout and stderr."""
    from keras_transformer.cli import translate

    _load_runs_as(monkeypatch, lambda *args, **options: translator)
    for name in ("TF_ENABLE_ONEDNN_OPTS", "TF_ONEDNN_ASSUME_FROZEN_WEIGHTS"):
        monkeypatch.setenv(name, os.environ.get(name, "1"))
    capsys.readouterr()
    assert translate.main([str(source), "--run", str(run_dir), "--no-progress",
                           "--verbose"]) == 0
    return capsys.readouterr()


def test_a_file_not_in_utf8_is_translated_with_a_line_that_says_so(
        run_dir, run_translators, tmp_path, monkeypatch, capsys):
    """A file in Windows-1252 ("se\\xf1or") was translated without a word, its
    accented letters lost as U+FFFD. Each line is still translated (the output
    keeps the input's lines), as its text with U+FFFD; stderr says which lines
    and what to do."""
    from keras_transformer import evaluation

    source = tmp_path / "latin.txt"
    source.write_bytes(b"Jesus wept.\n" + "El se\u00f1or dijo.\nY \u00e9l.\n".encode("cp1252"))
    out, err = _translate_file(source, run_dir, run_translators["averaged"], monkeypatch,
                               capsys)
    assert out.splitlines() == evaluation.translate_sentences(
        run_translators["averaged"], ["Jesus wept.", "El se\ufffdor dijo.", "Y \ufffdl."])
    lines = [line for line in err.splitlines() if line.startswith("keras-transformer")]
    assert lines == [f"keras-transformer translate: {source}: 2 of its 3 lines are not UTF-8 "
                     "(the first: line 2); their bad bytes were read as U+FFFD and translated "
                     "so. If it is in another encoding, convert it first, e.g. iconv -f "
                     "WINDOWS-1252 -t UTF-8"], err


def test_a_line_translated_from_its_first_pieces_only_is_named_in_a_line(
        run_dir, run_translators, tmp_path, monkeypatch, capsys):
    """A paragraph on one line, of more pieces than the model's positions, was
    translated from its beginning alone without a word. Its line is still
    translated (the output keeps the input's lines), and stderr says which was
    cut, as the command's line, not as Python's warning with our code's file."""
    translator = run_translators["averaged"]
    limit = translator.config.max_input_length
    paragraph = " ".join(SENTENCES * 4)
    assert translator.tokenizer.tokenize(paragraph).shape[0] > limit
    source = tmp_path / "paragraph.txt"
    source.write_text(f"Jesus wept.\n{paragraph}\nAnd God saw.\n")
    out, err = _translate_file(source, run_dir, translator, monkeypatch, capsys)
    assert out.splitlines() == _translations(translator, ["Jesus wept.", paragraph,
                                                          "And God saw."])
    assert err.splitlines() == [
        "keras-transformer translate: sentence 2 has more subword pieces than the "
        f"translator's max_input_length={limit}: only its first {limit} were translated, and "
        "its translation misses the rest; split long lines into sentences"], err


def test_the_command_lines_keep_urllib3s_retries_off_stderr():
    """TFDS downloads a corpus on its first use; offline, urllib3 logged a line
    for each of its retries ("Retrying (Retry(total=9, ...)) after connection
    broken by 'NameResolutionError(...)'"), a screenful before the one line
    that says why. The command lines keep them off stderr; their own lines, and
    urllib3's errors, stay."""
    script = (
        "import logging, sys\n"
        "from keras_transformer.cli.common import quiet_libraries\n"
        "quiet_libraries()\n"
        "logging.basicConfig()\n"
        "log = logging.getLogger('urllib3.connectionpool')\n"
        "log.warning('Retrying (Retry(total=9)) after connection broken')\n"
        "log.error('an error of its own')\n"
        "print('train.py: our own line', file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=python_path(ROOT)), timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Retrying" not in result.stderr
    assert "an error of its own" in result.stderr and "our own line" in result.stderr


def test_the_command_dispatches_to_its_sub_commands(capsys):
    """`keras-transformer COMMAND` (and `python -m keras_transformer COMMAND`) runs the
    same command as the clone's COMMAND.py, naming itself in its messages."""
    from keras_transformer import cli

    assert cli.main(["--help"]) == 0
    listing = capsys.readouterr().out
    for command in cli.COMMANDS:
        assert f"\n  {command:<10} " in listing
    assert cli.main([]) == 2
    assert cli.main(["trian"]) == 2
    assert capsys.readouterr().err.strip() == (
        "keras-transformer: unknown command 'trian'; choose one of train, export, translate, "
        "evaluate (see --help)")
    with pytest.raises(SystemExit) as exit:
        cli.main(["translate", "--export", "/nonexistent"])
    assert exit.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "keras-transformer translate: --export /nonexistent is not a directory (see --help)")


def test_xla_max_batch_size_needs_xla(capsys):
    from keras_transformer.cli import export

    for flags, message in (
            (["--jit-compile", "off"], "--xla-max-batch-size needs --jit-compile on (or auto)"),
            (["--max-batch-size", "1"], "at most --max-batch-size=1 sentences"),
            (["--xla-max-batch-size", "0"], "--xla-max-batch-size must be a positive int. "
                                            "Received: --xla-max-batch-size=0")):
        with pytest.raises(SystemExit) as exit:
            export.parse_args(["--run", ROOT, "--out", "x", "--xla-max-batch-size", "2", *flags])
        assert exit.value.code == 2
        assert message in capsys.readouterr().err
    args = export.parse_args(["--run", ROOT, "--out", "x", "--xla-max-batch-size", "1"])
    assert (args.xla_max_batch_size, args.jit_compile) == (1, "auto")


def test_python_dash_m_runs_the_command():
    result = subprocess.run([sys.executable, "-m", "keras_transformer", "export", "--out", "x"],
                            capture_output=True, text=True, cwd=ROOT, timeout=600,
                            env=dict(os.environ, PYTHONPATH=python_path(ROOT)))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "python -m keras_transformer export: the following arguments are required: --run "
        "(see --help)"]


def test_decoding_commands_set_onednn_defaults_the_environment_overrides(monkeypatch):
    """oneDNN on and weights reordered once, unless the environment says otherwise."""
    from keras_transformer.cli import common

    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.setenv("TF_ONEDNN_ASSUME_FROZEN_WEIGHTS", "0")
    monkeypatch.setattr(common, "quiet_libraries", lambda: None)
    common.start_decoding(verbose=False)
    assert os.environ["TF_ENABLE_ONEDNN_OPTS"] == "1"
    assert os.environ["TF_ONEDNN_ASSUME_FROZEN_WEIGHTS"] == "0"
    monkeypatch.delenv("TF_ONEDNN_ASSUME_FROZEN_WEIGHTS")
    common.start_decoding(verbose=False)
    assert os.environ["TF_ONEDNN_ASSUME_FROZEN_WEIGHTS"] == "1"


@pytest.mark.parametrize("command", ["train", "export", "translate", "evaluate"])
def test_every_command_turns_onednn_on_before_tensorflow_starts(command):
    """Train as its export and translate and evaluate: TensorFlow leaves oneDNN off
    on an AVX2-only CPU, where train's translations (its chosen decoding, its test
    BLEU) then ranked near ties otherwise than its export's (test_main_job_end_to_end
    failed so on an EPYC Zen 2, 2026-12-07). Importing the command sets it, unless
    the environment says otherwise."""
    environment = {name: value for name, value in os.environ.items()
                   if name != "TF_ENABLE_ONEDNN_OPTS"}
    code = ("import os, sys; from keras_transformer.cli import {0}; "
            "print(os.environ.get('TF_ENABLE_ONEDNN_OPTS'), 'tensorflow' in sys.modules)")
    for given, expected in ((None, "1 False"), ("0", "0 False")):
        env = dict(environment, PYTHONPATH=python_path(ROOT),
                   **({} if given is None else {"TF_ENABLE_ONEDNN_OPTS": given}))
        result = subprocess.run([sys.executable, "-c", code.format(command)], env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.stdout.strip() == expected, result.stderr


def test_searches_side_by_side_get_a_thread_each(monkeypatch, tmp_path):
    """An export that runs searches side by side (its recorded settings, read
    before TensorFlow starts) gets one intra-op thread and an inter-op thread per
    search and per core; one that does not, or an old one, TensorFlow's defaults."""
    from keras_transformer import hardware
    from keras_transformer.cli import common

    for name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(common, "quiet_libraries", lambda: None)
    export = tmp_path / "export"
    for version, settings in ((1, {"parallel_searches": 1}), (3, {"parallel_searches": 6})):
        (export / str(version) / "assets.extra").mkdir(parents=True)
        (export / str(version) / "saved_model.pb").write_bytes(b"")
        (export / str(version) / "assets.extra" / "config.json").write_text(
            json.dumps({"translator": settings}))
    assert common.parallel_searches(export=str(export)) == 6  # the newest version's
    assert common.parallel_searches(export=str(export / "1")) == 1
    (export / "1" / "assets.extra" / "config.json").write_text(json.dumps({"translator": {}}))
    assert common.parallel_searches(export=str(export / "1")) == 1  # an export from before
    assert common.parallel_searches(export=str(tmp_path)) == 1  # no export: loading says so
    assert common.parallel_searches(run=str(tmp_path)) == min(hardware.available_cores(), 16)

    common.start_decoding(verbose=False, parallel_searches=1)
    assert "TF_NUM_INTRAOP_THREADS" not in os.environ
    common.start_decoding(verbose=False, parallel_searches=6)
    assert os.environ["TF_NUM_INTRAOP_THREADS"] == "1"
    assert os.environ["TF_NUM_INTEROP_THREADS"] == str(max(6, hardware.available_cores()))
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "2")  # the environment wins
    common.start_decoding(verbose=False, parallel_searches=6)
    assert os.environ["TF_NUM_INTRAOP_THREADS"] == "2"


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_decoding_commands_run_without_the_graph_optimizer_and_restore_it(
        command, tmp_path, monkeypatch, capsys):
    """translate and evaluate load and run their translator with Grappler's
    meta-optimizer off on a CPU (a base export's first call 10 s instead of
    16.5 s, `common.graph_optimizer_off`), and leave it as it was."""
    import importlib

    module = importlib.import_module(f"keras_transformer.cli.{command}")
    (tmp_path / "in.txt").write_text("Jesus wept.\n")
    export = tmp_path / "export"
    (export / "1").mkdir(parents=True)
    (export / "1" / "saved_model.pb").write_bytes(b"")
    seen = []

    def load(args, prog):
        seen.append(tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer"))
        raise ValueError("stopped here")

    monkeypatch.setattr(module, "load_command_translator", load)
    flags = ({"translate": [str(tmp_path / "in.txt")],
              "evaluate": ["--src", str(tmp_path / "in.txt"), "--ref", str(tmp_path / "in.txt")]}
             [command])
    assert module.main(["--export", str(export), *flags]) == 2
    assert seen == [True]
    assert "stopped here" in capsys.readouterr().err
    assert not tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer")
