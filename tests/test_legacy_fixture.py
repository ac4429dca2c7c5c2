"""A run directory and an export written by an earlier commit (tests/fixtures/legacy_run,
made by tests/fixtures/build_legacy_run.py; expected.json names the commit) still load
and translate exactly as they did then."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the exported tokenizer's ops)
from tests import python_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEGACY = os.path.join(ROOT, "tests", "fixtures", "legacy_run")
EXTRA_LENGTH = 8
# The export's flags in build_legacy_run.py; a new export of the old run uses the same.
EXPORT_FLAGS = ["--beam-sizes", "1,4", "--beam-size", "4", "--max-input-length", "16",
                "--extra-length", str(EXTRA_LENGTH), "--jit-compile", "off",
                "--precision", "float32", "--max-batch-size", "8", "--version", "1"]


@pytest.fixture(scope="module")
def expected():
    with open(os.path.join(LEGACY, "expected.json")) as f:
        return json.load(f)


def signature_outputs(export_dir, sentences):
    """What build_legacy_run.py recorded, from the SavedModel in `export_dir`."""
    loaded = tf.saved_model.load(export_dir)
    text = tf.constant(sentences)

    def knobs(beam_size):
        settings = dict(beam_size=tf.constant(beam_size), alpha=tf.constant(0.6),
                        extra_length=tf.constant(EXTRA_LENGTH))
        # A signature takes every input; exports before 2026-11-26 have no n-gram blocking.
        if "no_repeat_ngram_size" in loaded.signatures["translate"].structured_input_signature[1]:
            settings["no_repeat_ngram_size"] = tf.constant(0)
        return settings

    outputs = {f"translate_beam{k}": loaded.signatures["translate"](text=text, **knobs(k))
               for k in (1, 4)}
    outputs["serving_default"] = loaded.signatures["serving_default"](text=text)
    outputs["translate_nbest"] = loaded.signatures["translate_nbest"](text=text, **knobs(4))
    return {name: {key: _values(value) for key, value in result.items()}
            for name, result in outputs.items()}


def assert_same_outputs(got, expected):
    """Every output recorded, the same in `got` (outputs added since may come too)."""
    for name, outputs in got.items():
        for key, want in expected[name].items():
            value = outputs[key]
            if isinstance(np.asarray(want).reshape(-1)[0], str):
                assert value == want, (name, key)
            else:
                np.testing.assert_allclose(value, want, rtol=0, atol=1e-5, err_msg=name)


def _values(tensor):
    value = tensor.numpy()
    if value.dtype == object:
        return np.vectorize(lambda t: t.decode("utf-8"), otypes=[object])(value).tolist()
    return value.tolist()


def test_the_old_export_loads_and_translates_as_recorded(expected):
    assert_same_outputs(signature_outputs(os.path.join(LEGACY, "export", "1"),
                                          expected["sentences"]), expected)


def test_translate_reads_the_old_export(expected, tmp_path, monkeypatch, capsys):
    from keras_transformer.cli import translate

    for name in ("TF_ENABLE_ONEDNN_OPTS", "TF_ONEDNN_ASSUME_FROZEN_WEIGHTS"):
        monkeypatch.setenv(name, os.environ.get(name, "1"))
    source, output = tmp_path / "source.txt", tmp_path / "output.txt"
    source.write_text("\n".join(expected["sentences"]) + "\n", encoding="utf-8")
    assert translate.main(["--export", os.path.join(LEGACY, "export"), str(source),
                           "--output", str(output), "--verbose"]) == 0, capsys.readouterr().err
    assert output.read_text(encoding="utf-8").splitlines() == \
        expected["serving_default"]["translation"]


@pytest.mark.slow
def test_the_old_run_exports_to_the_same_translations(expected, tmp_path):
    """Today's export of the old run directory: the same outputs as the old export."""
    run_dir = shutil.copytree(os.path.join(LEGACY, "run"), tmp_path / "run")
    environment = dict(os.environ, PYTHONPATH=python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer", "export", "--run", str(run_dir),
         "--out", str(tmp_path / "export"), *EXPORT_FLAGS],
        capture_output=True, text=True, cwd=ROOT, env=environment, timeout=600)
    assert result.returncode == 0, result.stderr
    assert_same_outputs(signature_outputs(str(tmp_path / "export" / "1"),
                                          expected["sentences"]), expected)
