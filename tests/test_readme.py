"""The Python examples of README.md and docs/library.md run as written, but shorter:
only sizes change (vocabulary, model, steps). The other Python blocks of the docs
need a model server or name arrays they leave out; tests/test_docs.py compiles them."""

import os
import warnings

import numpy as np
import pytest

from tests.test_docs import code_blocks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def example(page, marker):
    """The one Python block of `page` that holds `marker`."""
    [block] = [block for block in code_blocks(page, ("python",)) if marker in block]
    return block


def shrink(example, replacements):
    for long, short in replacements:
        assert long in example, f"the example no longer has {long!r}; update this test"
        example = example.replace(long, short)
    return example


def run(page, source, namespace):
    """Runs the example; it must print no Python warning, which its reader would
    see (Keras's "`shuffle=True` was passed, but will be ignored" for a `fit` on
    a dataset without `shuffle=False`, for one)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=DeprecationWarning)  # setup.cfg's filter
        exec(compile(source, os.path.join(ROOT, page), "exec"), namespace)
    assert not caught, [f"{w.filename}:{w.lineno}: {w.message}" for w in caught]
    return namespace


@pytest.mark.slow
def test_readme_library_example_trains_translates_and_exports(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # its export lands here
    source = shrink(example("README.md", "kt.export_translator("), [
        ("vocab_size=8000", "vocab_size=600"),
        ("steps_per_epoch=300, epochs=1", "steps_per_epoch=2, epochs=1")])
    namespace = run("README.md", source, {})
    assert int(namespace["model"].optimizer.iterations.numpy()) == 2
    assert os.path.isfile(tmp_path / "exports" / "library" / "1" / "saved_model.pb")


@pytest.mark.slow
def test_library_fit_examples_train():
    page = "docs/library.md"
    namespace = run(page, shrink(example(page, "model.fit(batches.dataset()"), [
        ("vocab_size=8000", "vocab_size=600"),
        ("steps_per_epoch=500, epochs=4", "steps_per_epoch=2, epochs=1")]), {})
    model = namespace["model"]
    assert int(model.optimizer.iterations.numpy()) == 2
    assert np.isfinite(model.get_metrics_result()["loss"])
    # The accumulation example goes on with the first one's corpus and vocabulary.
    namespace = run(page, shrink(example(page, "accumulate_steps=4),"), [
        ("TransformerConfig.base(", "TransformerConfig.tiny("),
        ("tokens_per_batch=6250", "tokens_per_batch=1024"),
        ("steps_per_epoch=4 * 1000, epochs=100", "steps_per_epoch=4 * 2, epochs=1")]), namespace)
    model = namespace["model"]
    assert int(model.optimizer.iterations.numpy()) == 2  # updates, from 8 batches
    assert np.isfinite(model.get_metrics_result()["loss"])
