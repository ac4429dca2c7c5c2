"""The export as TF Serving's C++ model server loads it: through TensorFlow's C
API (`TF_LoadSessionFromSavedModel`, tag "serve"), with tensorflow-text's op
libraries loaded by `TF_LoadLibrary`, in a process without Python TensorFlow
(tests/c_api_client.py: ctypes against the wheel's libtensorflow_cc.so.2).

No model-server binary installs here; this is the loader and session it runs.
The C API must answer every warm-up request, and a few sentences, exactly as the
Python loader (`tf.saved_model.load`) does.
"""

import base64
import glob
import json
import os
import subprocess
import sys
import unicodedata

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import prediction_log_pb2

from keras_transformer import saved_model
from tests.translation_fixtures import BAD_UTF8
from tests.translation_fixtures import SENTENCES

CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "c_api_client.py")
FLOAT_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def export_path(tmp_path_factory, translator):
    """One export; the C API run below is its check."""
    base = str(tmp_path_factory.mktemp("export"))
    return saved_model.export_translator(translator, base, check=False)


def warmup_requests(export_path):
    """(signature name, {input name: array}) of every warm-up record, as the
    model server reads them."""
    path = os.path.join(export_path, "assets.extra", saved_model.WARMUP_FILENAME)
    requests = []
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        request = prediction_log_pb2.PredictionLog.FromString(record).predict_log.request
        inputs = {key: tf.make_ndarray(value) for key, value in request.inputs.items()}
        requests.append((request.model_spec.signature_name, inputs))
    return requests


def read_signature_defs(export_path):
    """The export's "serve" signature defs, read from saved_model.pb."""
    with open(os.path.join(export_path, "saved_model.pb"), "rb") as f:
        saved = saved_model_pb2.SavedModel.FromString(f.read())
    [meta_graph] = [m for m in saved.meta_graphs if "serve" in m.meta_info_def.tags]
    return meta_graph.signature_def


def encode(array):
    """An array in the client's JSON encoding: a flat list, strings base64."""
    array = np.asarray(array)
    if array.dtype == object:
        return [base64.b64encode(v).decode() for v in array.reshape(-1)]
    return array.reshape(-1).tolist()


def decode(result):
    """The client's JSON encoding of a fetched tensor as an array."""
    if result["dtype"] == "string":
        values = np.array([base64.b64decode(v) for v in result["values"]], dtype=object)
        return values.reshape(result["shape"])
    return np.array(result["values"], result["dtype"]).reshape(result["shape"])


def plan_run(signature_def, inputs):
    """One TF_SessionRun of a signature: the request's inputs fed by tensor name,
    every output fetched. (A DataType enum value is the same TF_DataType.)"""
    feeds = [
        {"name": signature_def.inputs[key].name, "dtype": signature_def.inputs[key].dtype,
         "shape": list(np.shape(value)), "values": encode(value)}
        for key, value in inputs.items()
    ]
    fetches = [{"key": key, "name": info.name} for key, info in signature_def.outputs.items()]
    return {"feeds": feeds, "fetches": fetches}


def run_c_api_client(export_path, runs):
    """Runs `runs` in tests/c_api_client.py and returns its report."""
    ops_dir = os.path.join(os.path.dirname(tensorflow_text.__file__), "python", "ops")
    plan = {
        "tensorflow_dir": tf.sysconfig.get_lib(),
        # Every tensorflow-text op library, as `import tensorflow_text` loads them.
        "op_libraries": sorted(glob.glob(os.path.join(ops_dir, "_*.so"))),
        "export_dir": os.path.abspath(export_path),
        "runs": runs,
    }
    result = subprocess.run(
        [sys.executable, CLIENT], input=json.dumps(plan), capture_output=True, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_outputs_equal(got, want, what):
    """Strings and ints exactly, floats within FLOAT_TOLERANCE."""
    assert sorted(got) == sorted(want), what
    for key, value in want.items():
        assert got[key].shape == value.shape, f"{what} {key}"
        if np.issubdtype(value.dtype, np.floating):
            np.testing.assert_allclose(got[key], value, rtol=0, atol=FLOAT_TOLERANCE,
                                       err_msg=f"{what} {key}")
        else:
            assert got[key].tolist() == value.tolist(), f"{what} {key}"


@pytest.mark.slow
def test_c_api_answers_as_the_python_loader(export_path):
    signature_defs = read_signature_defs(export_path)
    requests = warmup_requests(export_path)
    assert sorted(name for name, _ in requests) == sorted(saved_model.SIGNATURES)
    # Bytes through TF_TString both ways: a long (heap) string, one of 22 bytes
    # (the most kept inline), an empty one and invalid UTF-8; and a sentence
    # with decomposed accents, which the vocabulary's rules compose in the
    # tokenizer op, with nothing but that op loaded; and one in capitals,
    # recased by TensorFlow's own string ops.
    composed = "And God saw the light of Jérusalem."
    texts = np.array([s.encode() for s in SENTENCES[2:]] + [b"", BAD_UTF8, b"AND GOD SAW."] + [
        unicodedata.normalize(form, composed).encode() for form in ("NFD", "NFC")], dtype=object)
    requests.append(("serving_default", {"text": texts}))
    report = run_c_api_client(
        export_path, [plan_run(signature_defs[name], inputs) for name, inputs in requests])

    assert not {"tensorflow", "tensorflow_text", "keras_transformer"} & set(report["modules"])
    assert "Op type not registered 'Sentencepiece" in report["unregistered_error"]
    meta_graph = meta_graph_pb2.MetaGraphDef.FromString(
        base64.b64decode(report["meta_graph_def"]))
    assert list(meta_graph.meta_info_def.tags) == ["serve"]
    assert dict(meta_graph.signature_def) == dict(signature_defs)

    loaded = tf.saved_model.load(export_path)
    for (name, inputs), result in zip(requests, report["results"]):
        assert "error" not in result, (name, result)
        # Like the C API, the restored functions fill in the knobs' defaults.
        function = loaded.signatures[name] if name == "serving_default" else getattr(loaded, name)
        want = function(**{key: tf.constant(value) for key, value in inputs.items()})
        got = {key: decode(value) for key, value in result.items()}
        assert_outputs_equal(got, {key: value.numpy() for key, value in want.items()}, name)
    capitals, decomposed, precomposed = got["translation"][-3:]  # serving_default's, the last
    assert decomposed == precomposed
    assert capitals == capitals.upper()


# TF_Code of a refused request (tensorflow/c/tf_status.h).
TF_INVALID_ARGUMENT = 3


@pytest.mark.slow
def test_c_api_session_refuses_bad_requests_and_serves_on(export_path):
    """Each bad request a client may send is refused with INVALID_ARGUMENT naming
    what was wrong, and the same session then answers a good request exactly as
    before them: the model server stays up."""
    signature_defs = read_signature_defs(export_path)
    texts = np.array([s.encode() for s in SENTENCES] + [b"", BAD_UTF8], dtype=object)
    good = plan_run(signature_defs["serving_default"], {"text": texts})
    ids = plan_run(signature_defs["translate_ids"], {"ids": np.array([[5, 9, 2]], np.int32)})
    int64_ids = dict(ids, feeds=[dict(feed, dtype=9) for feed in ids["feeds"]])  # TF_INT64
    bad = {
        "max_input_chars": plan_run(signature_defs["serving_default"],
                                    {"text": np.array([b"x" * 10_001], dtype=object)}),
        "max_batch_size": plan_run(signature_defs["serving_default"],
                                   {"text": np.array([b"a"] * 257, dtype=object)}),
        "beam_size": plan_run(signature_defs["translate"],
                              {"text": texts[:1], "beam_size": np.int32(3)}),
        "int32": int64_ids,  # the ids' dtype
    }
    report = run_c_api_client(export_path, [good, *bad.values(), good, ids])
    first, *refused, again, answered = report["results"]
    assert "error" not in first and "error" not in answered, (first, answered)
    for (expected, request), result in zip(bad.items(), refused):
        assert result.get("error", {}).get("code") == TF_INVALID_ARGUMENT, (request, result)
        assert expected in result["error"]["message"], result["error"]["message"][:500]
    assert again == first
