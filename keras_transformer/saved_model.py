"""Writing a `Translator` as a SavedModel that TF Serving runs, and checking it.

`export_translator` writes `EXPORT_DIR/<version>/` (TF Serving's layout) under a
temporary name, adds `assets.extra/config.json` (model, translator and run
settings) and TF Serving's warm-up requests, reloads it in a separate Python
process that imports only TensorFlow (`check_export`), and then renames it into
place, so that a model server watching `EXPORT_DIR` never sees a partial version.
`write_model_server_files` adds the model server's `models.config` and
`batching_parameters.txt` beside the versions.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import tensorflow as tf

from keras_transformer import serving_shapes
from keras_transformer.export_files import ASSETS_EXTRA
from keras_transformer.export_files import CONFIG_FILENAME
from keras_transformer.export_files import WARMUP_FILENAME
from keras_transformer.durable import full_disk_error
from keras_transformer.durable import write_atomically
from keras_transformer.hardware import available_cores
from keras_transformer.decoding_config import exported_limits
from keras_transformer.decoding_config import positive_int

SIGNATURES = ("serving_default", "score", "translate", "translate_aligned", "translate_ids",
              "translate_nbest")
MODELS_CONFIG_FILENAME = "models.config"
BATCHING_FILENAME = "batching_parameters.txt"
WARMUP_TEXTS = (
    "Hello.",
    "This sentence warms up the model server before the first request arrives.",
)


class ExportError(RuntimeError):
    """The export could not be written, or did not pass its check."""


def export_translator(
    translator,
    export_dir,
    version=None,
    *,
    config=None,
    warmup_texts=None,
    check_texts=None,
    check=True,
):
    """Writes `translator` as a SavedModel that TF Serving runs.

    The export is written under a temporary name in `export_dir` (TF Serving
    ignores names that are not numbers), checked, then renamed to
    `export_dir/<version>/`, so a model server watching `export_dir` never
    sees a partial version.

    Args:
        translator: a `Translator` (an ids-only one gives an export without
            tensorflow-text ops).
        export_dir: the model's base directory (TF Serving's `model_base_path`).
        version: int, the version directory; defaults to one more than the
            largest version there (1 for a new directory).
        config: optional JSON-ready dict (e.g. the run's config) written with
            the translator's settings to `assets.extra/config.json`.
        warmup_texts: sentences of the TF Serving warm-up requests
            (`assets.extra/tf_serving_warmup_requests`), within the request
            limits; empty for none. Default: those of `WARMUP_TEXTS` that fit
            the limits.
        check_texts: sentences for the check; defaults to `warmup_texts` plus
            an empty and a whitespace-only string.
        check: reload the export in a separate Python process that imports
            only tensorflow (and tensorflow_text, unless ids-only) and compare
            its outputs with the in-memory translator's (`check_export`).

    Returns:
        The path of the version directory.

    Raises:
        ValueError: the version exists already, a warm-up sentence is over
            the request limits, or the translator has no `max_input_chars`.
        ExportError: the check failed.
        OSError: the disk filled (errno ENOSPC, naming the version's directory);
            nothing of the export is left.
    """
    limits = exported_limits(translator.config, "export_translator")
    if warmup_texts is None:
        warmup_texts = [text for text in WARMUP_TEXTS
                        if len(text) <= limits.max_input_chars][:limits.max_batch_size]
    too_long = [text for text in warmup_texts if len(text) > limits.max_input_chars]
    if len(warmup_texts) > limits.max_batch_size or too_long:
        raise ValueError(
            f"the warm-up sentences must fit the request limits (max_batch_size="
            f"{limits.max_batch_size}, max_input_chars={limits.max_input_chars}), or "
            f"the model server would fail to load the export; received {len(warmup_texts)} "
            f"sentences, {len(too_long)} of them too long")
    version = (next_version(export_dir) if version is None
               else positive_int("version", version, "export_translator"))
    final_path = os.path.join(export_dir, str(version))
    if os.path.exists(final_path):
        raise ValueError(f"{final_path} exists already; pass another version, or none "
                         "for the next one")
    os.makedirs(export_dir, exist_ok=True)
    temporary_path = os.path.join(export_dir, f".partial-{version}-{os.getpid()}")
    shutil.rmtree(temporary_path, ignore_errors=True)
    signatures = translator.signatures()
    try:
        tf.saved_model.save(translator, temporary_path, signatures=signatures)
        extra = os.path.join(temporary_path, ASSETS_EXTRA)
        os.makedirs(extra, exist_ok=True)
        resolved = {
            "model": translator.model.config.to_dict(),
            "translator": translator.settings(),
            "signatures": sorted(signatures),
        }
        if config is not None:
            resolved["run"] = config
        with open(os.path.join(extra, CONFIG_FILENAME), "w") as f:
            json.dump(resolved, f, indent=2, sort_keys=True)
            f.write("\n")
        if warmup_texts:
            # With XLA, also one request of each padded shape: all compile at load.
            shapes = (serving_shapes.warmup_requests(translator, warmup_texts)
                      if translator.shapes.xla else ())
            write_warmup_requests(
                os.path.join(extra, WARMUP_FILENAME), warmup_texts, translator.ids_only, shapes)
        if check:
            _check_against(translator, temporary_path, check_texts, warmup_texts)
        os.rename(temporary_path, final_path)
    except tf.errors.ResourceExhaustedError as error:  # a full disk, or memory
        full = full_disk_error(error, final_path)
        if full is None:
            raise
        raise full from error
    finally:
        shutil.rmtree(temporary_path, ignore_errors=True)
    return final_path


def _check_against(translator, path, check_texts, warmup_texts):
    """`check_export` of the SavedModel at `path` against `translator`: ids for
    an ids-only one, else `check_texts` (default: `warmup_texts`, an empty and
    a whitespace-only string)."""
    if translator.ids_only:
        inputs = {"ids": _example_ids(translator.model.config.vocab_size)}
        expected = translator.translate_ids(tf.constant(inputs["ids"], tf.int32))
    else:
        texts = list(check_texts if check_texts is not None else warmup_texts)
        if check_texts is None:
            texts = (texts + ["", "   "])[:translator.config.max_batch_size]
        inputs = {"text": texts}
        expected = translator.translate(tf.constant(texts, tf.string))
    check_export(path, inputs, expected, text_ops=not translator.ids_only)


def write_model_server_files(export_dir, translator, model_name=None, base_path=None,
                             batch_timeout_micros=5000, num_batch_threads=None):
    """Writes TF Serving's `--model_config_file` and `--batching_parameters_file`
    into `export_dir` (the server ignores what is not a version directory).

    `models.config` serves `export_dir` as `model_name` (default: its base name)
    from `base_path` (default: `/models/<model_name>`, where the docker command
    of docs/export-and-serving.md mounts it). `batching_parameters.txt` lets the
    server merge requests into batches of at most the translator's
    `max_batch_size` (a larger merged batch would be refused by the export's own
    limit), waiting at most `batch_timeout_micros`, on `num_batch_threads`
    threads (default: this machine's cores). The server's batching needs every
    input of a signature to have a batch dimension: with `--enable_batching`,
    call `serving_default` (text only), not `translate` with its scalar knobs.
    For an XLA export, the server pads merged batches to the export's padded
    batch sizes (`allowed_batch_sizes`), unless only small requests run XLA.

    Returns:
        The paths of the two files.
    """
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    model_name = model_name or os.path.basename(os.path.normpath(export_dir))
    config = model_server_config_pb2.ModelServerConfig()
    model = config.model_config_list.config.add()
    model.name = model_name
    model.base_path = base_path or f"/models/{model_name}"
    model.model_platform = "tensorflow"
    batching = {
        "max_batch_size": translator.config.max_batch_size,
        "batch_timeout_micros": batch_timeout_micros,
        "max_enqueued_batches": 100,
        "num_batch_threads": num_batch_threads or available_cores(),
    }
    paths = [os.path.join(export_dir, name) for name in (MODELS_CONFIG_FILENAME, BATCHING_FILENAME)]
    # An XLA export's merged batches are padded to its compiled batch sizes (not
    # where larger requests run without XLA: they would be padded to the largest).
    allowed = "".join(f"allowed_batch_sizes: {size}\n" for size in (
        () if translator.shapes.xla_small_requests_only else translator.shapes.batch_sizes))
    texts = [text_format.MessageToString(config),
             "".join(f"{name} {{ value: {value} }}\n" for name, value in batching.items())
             + allowed]
    os.makedirs(export_dir, exist_ok=True)
    for path, text in zip(paths, texts):
        write_atomically(path, lambda temporary, text=text: _write_text(temporary, text))
    return paths


def _write_text(path, text):
    with open(path, "w") as f:
        f.write(text)


def next_version(export_dir):
    """One more than the largest numeric version directory in `export_dir`."""
    if not os.path.isdir(export_dir):
        return 1
    versions = [int(name) for name in os.listdir(export_dir) if name.isdigit()]
    return max(versions, default=0) + 1


def write_warmup_requests(path, texts, ids_only=False, more_requests=()):
    """Writes TF Serving warm-up requests: one Predict request per signature,
    then `more_requests`, `(signature, {input: list})` pairs.

    TF Serving replays `assets.extra/tf_serving_warmup_requests` (a TFRecord
    file of `PredictionLog` protos) when it loads a version, so the first real
    request does not pay for graph initialization.
    """
    # Only exporting needs TF Serving's protos (the tensorflow-serving-api package).
    from tensorflow_serving.apis import model_pb2
    from tensorflow_serving.apis import predict_pb2
    from tensorflow_serving.apis import prediction_log_pb2

    texts = tf.make_tensor_proto(
        [t.encode("utf-8") if isinstance(t, str) else t for t in texts], tf.string
    )
    ids = tf.make_tensor_proto([[4, 5, 6, 7], [8, 9, 0, 0]], tf.int32)
    if ids_only:
        requests = [("serving_default", {"ids": ids}), ("translate_ids", {"ids": ids})]
    else:
        requests = [
            ("serving_default", {"text": texts}),
            ("translate", {"text": texts}),
            ("translate_nbest", {"text": texts}),
            ("translate_aligned", {"text": texts}),
            ("score", {"source": texts, "target": texts}),
            ("translate_ids", {"ids": ids}),
        ]
    dtypes = dict(ids=tf.int32, text=tf.string)
    requests += [(signature, {name: tf.make_tensor_proto(value, dtypes[name])
                              for name, value in inputs.items()})
                 for signature, inputs in more_requests]
    with tf.io.TFRecordWriter(path) as writer:
        for signature_name, inputs in requests:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(signature_name=signature_name)
            )
            for name, tensor in inputs.items():
                request.inputs[name].CopyFrom(tensor)
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)
            )
            writer.write(log.SerializeToString())


# Run in a fresh interpreter by `check_export`: tensorflow, tensorflow_text if
# asked, and nothing of this package.
_CHECK_SCRIPT = r"""
import json, sys
import tensorflow as tf
request = json.loads(sys.stdin.read())
if request["text_ops"]:
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops)
loaded = tf.saved_model.load(request["path"])
inputs = {name: tf.constant(value, dtype) for name, (value, dtype) in request["inputs"].items()}
outputs = loaded.signatures[request["signature"]](**inputs)

def to_list(tensor):
    value = tensor.numpy()
    if value.dtype == object:
        return [[t.decode("utf-8", "replace") for t in row] if value.ndim == 2
                else row.decode("utf-8", "replace") for row in value]
    return value.tolist()

print(json.dumps({
    "outputs": {name: to_list(tensor) for name, tensor in outputs.items()},
    "signatures": sorted(loaded.signatures),
    "modules": sorted({m.split(".")[0] for m in sys.modules}),
}))
"""


def check_export(path, inputs, expected, *, signature="serving_default", text_ops=True,
                 atol=1e-4):
    """Reloads a SavedModel in a separate process and compares its outputs.

    The process imports only tensorflow, and tensorflow_text if `text_ops` (an
    ids-only export must load without it); it fails if anything imports
    `keras_transformer`. It runs `signature` on `inputs`, whose outputs must
    equal `expected` (strings and ints exactly, floats within `atol`).

    Args:
        path: the SavedModel directory.
        inputs: dict of input name to value: a list of strings for "text", a
            list of int lists for "ids", numbers for the knobs.
        expected: dict of output name to the in-memory translator's tensor.
        signature: the signature to run.
        text_ops: whether the process may import tensorflow_text.
        atol: tolerance of float outputs.

    Returns:
        The child's report: `outputs`, `signatures`, `modules` (top-level
        modules it imported).

    Raises:
        ExportError: the process failed, or its results differ.
    """
    def jsonable(name, value):
        if name == "text":
            return [v.decode("utf-8") if isinstance(v, bytes) else v for v in value], "string"
        if name == "ids":
            return [[int(i) for i in row] for row in value], "int32"
        if name == "alpha":
            return float(value), "float32"
        return int(value), "int32"  # beam_size, extra_length, no_repeat_ngram_size

    request = {
        "path": os.path.abspath(path),
        "signature": signature,
        "text_ops": bool(text_ops),
        "inputs": {name: jsonable(name, value) for name, value in inputs.items()},
    }
    # Run from the export's directory, so the package is not found through the
    # working directory; a leak shows in the report's modules.
    result = subprocess.run(
        [sys.executable, "-c", _CHECK_SCRIPT],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.abspath(path)),
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        check=False,
    )
    if result.returncode != 0:
        raise ExportError(
            f"reloading {path} in a separate process failed:\n{result.stderr[-3000:]}"
        )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    if "keras_transformer" in report["modules"]:
        raise ExportError(f"reloading {path} imported keras_transformer")
    if not text_ops and "tensorflow_text" in report["modules"]:
        raise ExportError(f"reloading {path} imported tensorflow_text")
    compare_outputs(report["outputs"], expected, signature, atol)
    return report


def compare_outputs(outputs, expected, signature="serving_default", atol=1e-4):
    """Raises `ExportError` unless `outputs` (JSON-decoded lists, as the check
    process reports them) equal `expected` (tensors or arrays)."""
    for name, want in expected.items():
        want = np.asarray(want)
        got = outputs.get(name)
        if got is None:
            raise ExportError(f"the reloaded {signature} has no output {name!r}")
        if want.dtype == object:
            want = np.vectorize(lambda t: t.decode("utf-8", "replace"), otypes=[object])(want)
            same = want.shape == np.shape(got) and want.tolist() == got
        elif np.issubdtype(want.dtype, np.floating):
            same = want.shape == np.shape(got) and np.allclose(want, got, atol=atol)
        else:
            same = want.shape == np.shape(got) and np.array_equal(want, got)
        if not same:
            raise ExportError(
                f"the reloaded export's {signature} gives {name}={got!r}; the in-memory "
                f"translator gives {want.tolist()!r}"
            )


def _example_ids(vocab_size):
    """A small batch of source ids for checks: two sentences and an empty one."""
    ids = [[4, 5, 6, 7], [8, 9, 10, 0], [0, 0, 0, 0]]
    return [[min(i, vocab_size - 1) for i in row] for row in ids]
