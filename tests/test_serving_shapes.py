"""An XLA export's padded request shapes, and the warm-up requests that compile
them all before the first live request."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import saved_model
from keras_transformer import serving
from keras_transformer import serving_shapes
from tests.translation_fixtures import SENTENCES


def test_grids():
    assert serving_shapes.batch_sizes(256) == (1, 4, 16, 64, 256)
    assert serving_shapes.batch_sizes(100) == (1, 4, 16, 64, 100)
    assert serving_shapes.batch_sizes(1) == (1,)
    assert serving_shapes.batch_sizes(8, small_requests_only=True) == (1, 2, 4, 8)
    assert serving_shapes.batch_sizes(6, small_requests_only=True) == (1, 2, 4, 6)
    assert serving_shapes.source_lengths(256) == (16, 32, 64, 128, 256)
    assert serving_shapes.source_lengths(20) == (16, 20)
    assert serving_shapes.source_lengths(10) == (10,)


def test_pad_to_is_the_smallest_size_that_holds_the_value():
    sizes = serving_shapes.batch_sizes(100)
    for value in range(1, 101):
        padded = int(serving_shapes.pad_to(sizes, tf.constant(value)))
        assert padded == min(size for size in sizes if size >= value), value


def test_only_the_small_requests_xla_runs_are_warmed_up_and_padded(model, tokenizer, tmp_path):
    """With `xla_max_batch_size`, the warm-up requests hold that many rows at
    most, on the finer grid (1, 2, 4: a CPU's steps grow with their rows), and
    TF Serving's batching pads no merged batch (larger ones run without XLA at
    their own size)."""
    translator = serving.Translator(model, tokenizer, jit_compile=True, max_batch_size=16,
                                    max_input_length=20, beam_sizes=(4,), xla_max_batch_size=4)
    shapes = translator.shapes
    assert (shapes.batch_sizes, shapes.source_lengths) == ((1, 2, 4), (16, 20))
    requests = serving_shapes.warmup_requests(translator, SENTENCES)
    assert sorted({len(inputs["text"]) for _, inputs in requests}) == [1, 2, 4]
    assert len(requests) == 3 * 2
    for rows in (1, 2, 3, 4):  # padded to the grid
        source_ids, _, _ = translator.shapes.padded(
            True, tokenizer.tokenize(tf.constant(SENTENCES[:rows])),
            tf.fill([rows], 3), tf.constant(50))
        assert source_ids.shape[0] == {1: 1, 2: 2, 3: 4, 4: 4}[rows]
    _, batching = saved_model.write_model_server_files(str(tmp_path / "export"), translator)
    with open(batching) as f:
        text = f.read()
    assert "max_batch_size { value: 16 }" in text and "allowed_batch_sizes" not in text


# Replays the warm-up file as TF Serving does when it loads a version (knobs a
# request leaves out take the export's defaults), counts the programs XLA has
# compiled (its persistent cache writes one file each), then serves live
# requests of every batch size up to the limit and of sources of 1 to 20
# tokens, and counts again. Imports only tensorflow and its serving protos.
_REPLAY = r"""
import glob, json, os, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401
from tensorflow_serving.apis import prediction_log_pb2
path, cache, sentences = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
with open(os.path.join(path, "assets.extra", "config.json")) as f:
    settings = json.load(f)["translator"]
knobs = {"beam_size": tf.constant(settings["beam_size"]),
         "alpha": tf.constant(settings["alpha"]),
         "extra_length": tf.constant(settings["extra_length"]),
         "no_repeat_ngram_size": tf.constant(settings["no_repeat_ngram_size"])}
loaded = tf.saved_model.load(path)
def call(name, inputs):
    signature = loaded.signatures[name]
    wanted = signature.structured_input_signature[1]
    inputs = dict({k: v for k, v in knobs.items() if k in wanted}, **inputs)
    return {key: value.numpy() for key, value in signature(**inputs).items()}
warmup = os.path.join(path, "assets.extra", "tf_serving_warmup_requests")
shapes = 0
for record in tf.data.TFRecordDataset(warmup):
    request = prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
    call(request.model_spec.signature_name,
         {name: tf.constant(tf.make_ndarray(proto)) for name, proto in request.inputs.items()})
after_warmup = len(glob.glob(os.path.join(cache, "*.pb")))
outputs = []
for rows in range(1, settings["max_batch_size"] + 1):
    for start in range(len(sentences)):
        batch = [sentences[(start + i) % len(sentences)] for i in range(rows)]
        outputs.append(call("serving_default", {"text": tf.constant(batch)})["translation"])
print(json.dumps({"after_warmup": after_warmup,
                  "after_requests": len(glob.glob(os.path.join(cache, "*.pb"))),
                  "first": [t.decode() for t in outputs[0].tolist()]}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("xla_max_batch_size,batch_sizes", [(None, (1, 4, 5)), (4, (1, 2, 4))])
def test_no_live_request_compiles_after_the_warm_up(model, tokenizer, tmp_path,
                                                     xla_max_batch_size, batch_sizes):
    """All requests through XLA, or those of up to 4 sentences (5 run the graph)."""
    translator = serving.Translator(model, tokenizer, jit_compile=True, max_batch_size=5,
                                    max_input_length=20, beam_sizes=(4,),
                                    xla_max_batch_size=xla_max_batch_size)
    shapes = translator.shapes
    assert (shapes.batch_sizes, shapes.source_lengths) == (batch_sizes, (16, 20))
    path = saved_model.export_translator(translator, str(tmp_path / "export"), check=False)
    with open(os.path.join(path, "assets.extra", "config.json")) as f:
        settings = json.load(f)["translator"]
    assert settings["padded_batch_sizes"] == list(batch_sizes)
    assert settings["padded_source_lengths"] == [16, 20]
    if xla_max_batch_size is None:  # TF Serving's batching pads merged batches to them
        _, batching = saved_model.write_model_server_files(str(tmp_path / "export"), translator)
        with open(batching) as f:
            assert f.read().endswith(
                "allowed_batch_sizes: 1\nallowed_batch_sizes: 4\nallowed_batch_sizes: 5\n")
    # Sources of 1 to 20 tokens (the longest truncated to 20): every padded length.
    sentences = ["Hi.", *SENTENCES, " ".join(SENTENCES * 3)]
    lengths = tokenizer.tokenize(tf.constant(sentences)).row_lengths().numpy()
    assert lengths.min() < 16 and lengths.max() > 20
    cache = tmp_path / "xla"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               TF_XLA_FLAGS=f"--tf_xla_persistent_cache_directory={cache} "
                            "--tf_xla_persistent_cache_device_types=CPU")
    result = subprocess.run([sys.executable, "-c", _REPLAY, path, str(cache),
                             json.dumps(sentences)],
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    # One program per padded shape (3 x 2 either way), all compiled at load; none after.
    programs = len(batch_sizes) * 2
    assert counts["after_warmup"] == programs and counts["after_requests"] == programs, counts
    # And the padded XLA search translates as the in-memory graph-mode one.
    expected = serving.Translator(model, tokenizer, max_input_length=20, beam_sizes=(4,))
    np.testing.assert_array_equal(
        counts["first"],
        [t.decode() for t in expected.translate(tf.constant(sentences[:1]))["translation"]
         .numpy()])
