"""Reduced-precision exports (`export --precision bfloat16|float16`): the weights
and matrix multiplies in the reduced type, softmax, layer norm, logits and scores
in float32; the same signatures as a float32 export."""

import json
import os

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import hardware
from keras_transformer import serving
from tests.test_cli import run
from tests.translation_fixtures import SENTENCES

REFERENCES = ["Y dijo Dios: Sea la luz.", "En el principio creó Dios los cielos y la tierra.",
              "Y vió Dios que la luz era buena.", "Jesús lloró."]
# Forced-decoding log-probabilities against float32's. A product's relative
# rounding error is about the type's unit roundoff (2^-8 for bfloat16's 8-bit
# significand, 2^-11 for float16's), and a log-probability sums a few dozen
# logits' worth of it.
TOLERANCES = {"bfloat16": dict(sentence_rtol=5e-3, token_atol=0.1),
              "float16": dict(sentence_rtol=5e-4, token_atol=0.01)}


@pytest.fixture(scope="module")
def float32_scores(model, tokenizer):
    translator = serving.Translator(model, tokenizer, beam_sizes=(4,), extra_length=8)
    return translator.score(tf.constant(SENTENCES), tf.constant(REFERENCES))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_reduced_model_holds_the_rounded_weights(model, dtype):
    reduced = model.with_dtype(dtype)
    assert reduced.precision == dtype and model.precision == "float32"
    for original, rounded in zip(model.get_weights(), reduced.get_weights()):
        assert rounded.dtype == np.dtype(getattr(ml_dtypes, dtype, dtype))
        np.testing.assert_array_equal(rounded, original.astype(rounded.dtype))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_scores_are_float32_and_close(model, tokenizer, float32_scores, dtype):
    translator = serving.Translator(model.with_dtype(dtype), tokenizer, beam_sizes=(4,),
                                    extra_length=8)
    assert translator.settings()["precision"] == dtype
    scores = translator.score(tf.constant(SENTENCES), tf.constant(REFERENCES))
    tolerance = TOLERANCES[dtype]
    assert scores["log_prob"].dtype == scores["token_log_probs"].dtype == tf.float32
    np.testing.assert_allclose(scores["log_prob"], float32_scores["log_prob"],
                               rtol=tolerance["sentence_rtol"])
    np.testing.assert_allclose(scores["token_log_probs"], float32_scores["token_log_probs"],
                               atol=tolerance["token_atol"])
    np.testing.assert_array_equal(scores["target_tokens"], float32_scores["target_tokens"])
    outputs = translator.translate(tf.constant(SENTENCES))
    assert outputs["score"].dtype == tf.float32 and outputs["translation"].shape == (4,)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_searchs_logits_are_the_models(model, tokenizer, dtype):
    """A search's step multiplies by the translator's transposed copy of the
    embedding, in 16 bits plus its bias of zeros (which makes oneDNN fuse the
    product): the logits are the plain decoder step's, to within one rounding of
    the 16-bit product."""
    reduced = model if dtype == "float32" else model.with_dtype(dtype)
    translator = serving.Translator(reduced, tokenizer, beam_sizes=(4,))
    assert (translator.output_bias is None) == (dtype == "float32")
    source = tf.constant([[5, 9, 14, 3, 2], [7, 8, 2, 0, 0]])
    cache = reduced.initial_cache(source, max_output_length=4)
    ids = tf.constant([1, 1])
    plain, _ = reduced.decode_step(ids, cache, 0)
    searched, _ = reduced.decode_step(ids, cache, 0, translator.output_kernel,
                                      translator.output_bias)
    unit = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}[dtype]
    np.testing.assert_allclose(searched, plain, rtol=0,
                               atol=4 * unit * float(tf.reduce_max(tf.abs(plain))))


def test_decoding_jit_compile_auto_follows_the_gpu():
    assert hardware.decoding_jit_compile("auto") == bool(tf.config.list_physical_devices("GPU"))
    assert hardware.decoding_jit_compile("on") and not hardware.decoding_jit_compile("off")
    # XLA for small requests (export --xla-max-batch-size) turns auto on, also on a CPU.
    assert hardware.decoding_jit_compile("auto", 4) and hardware.decoding_jit_compile("on", 4)
    with pytest.raises(ValueError, match="jit_compile must be auto, on or off"):
        hardware.decoding_jit_compile("yes")


def signatures(path):
    """Each signature's inputs and outputs as (name, dtype, shape)."""
    loaded = tf.saved_model.load(path)
    return {name: (sorted((k, v.dtype.name, tuple(v.shape))
                          for k, v in function.structured_input_signature[1].items()),
                   sorted((k, v.dtype.name, tuple(v.shape))
                          for k, v in function.structured_outputs.items()))
            for name, function in loaded.signatures.items()}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tokenizer, model):
    from tests.translation_fixtures import make_run_dir

    return make_run_dir(tmp_path_factory.mktemp("reduced") / "run", tokenizer, model)


@pytest.mark.slow
def test_a_bfloat16_export_has_the_float32_exports_signatures(run_dir, tmp_path):
    exports = {}
    for precision in ("float32", "bfloat16"):
        out = tmp_path / precision
        # Checked in a separate process: the reloaded export must translate as
        # the in-memory bfloat16 model does.
        result = run("export.py", "--run", run_dir, "--out", out, "--beam-sizes", "1,4",
                     "--extra-length", "8", "--precision", precision)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "checked in a separate process" in result.stdout
        exports[precision] = str(out / "1")
    assert signatures(exports["bfloat16"]) == signatures(exports["float32"])
    with open(os.path.join(exports["bfloat16"], "assets.extra", "config.json")) as f:
        settings = json.load(f)["translator"]
    # --jit-compile auto: XLA only where a GPU is visible.
    assert settings["precision"] == "bfloat16"
    assert settings["jit_compile"] == bool(tf.config.list_physical_devices("GPU"))
    variables = tf.saved_model.load(exports["bfloat16"]).model_variables
    assert {v.dtype for v in variables if v.dtype.is_floating} == {tf.bfloat16}
