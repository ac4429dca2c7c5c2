"""Tests for keras_transformer.saved_model: one export (slow: written, then
reloaded in a separate process), checked as TF Serving and other TensorFlow
programs see it."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from keras_transformer import saved_model
from keras_transformer import serving
from tests.translation_fixtures import BAD_UTF8
from tests.translation_fixtures import EXTRA_LENGTH
from tests.translation_fixtures import SENTENCES
from tests.translation_fixtures import strings as _strings


def batching_parameters(path):
    """A `--batching_parameters_file` parsed as TF Serving parses it: text format
    of its `tensorflow.serving.BatchingParameters` message, whose definition
    (tensorflow_serving/servables/tensorflow/session_bundle_config.proto)
    tensorflow-serving-api does not ship, so it is declared here, field by field.
    An unknown field or a malformed value raises `text_format.ParseError`."""
    from google.protobuf import descriptor_pb2
    from google.protobuf import descriptor_pool
    from google.protobuf import message_factory
    from google.protobuf import text_format
    from google.protobuf import wrappers_pb2

    field = descriptor_pb2.FieldDescriptorProto
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    file = descriptor_pb2.FileDescriptorProto(
        name="tensorflow_serving/servables/tensorflow/session_bundle_config.proto",
        package="tensorflow.serving", dependency=["google/protobuf/wrappers.proto"],
        syntax="proto3")
    message = file.message_type.add(name="BatchingParameters")
    for number, name, wrapper in [(1, "max_batch_size", "Int64Value"),
                                  (2, "batch_timeout_micros", "Int64Value"),
                                  (3, "max_enqueued_batches", "Int64Value"),
                                  (4, "num_batch_threads", "Int64Value"),
                                  (5, "thread_pool_name", "StringValue")]:
        message.field.add(name=name, number=number, type=field.TYPE_MESSAGE,
                          label=field.LABEL_OPTIONAL, type_name=f".google.protobuf.{wrapper}")
    message.field.add(name="allowed_batch_sizes", number=6, type=field.TYPE_INT64,
                      label=field.LABEL_REPEATED)
    message.field.add(name="pad_variable_length_inputs", number=7, type=field.TYPE_BOOL,
                      label=field.LABEL_OPTIONAL)
    pool.Add(file)
    cls = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters"))
    with open(path) as f:
        return text_format.Parse(f.read(), cls())


def model_server_config(path):
    """A `--model_config_file` parsed as TF Serving parses it."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    with open(path) as f:
        return text_format.Parse(f.read(), model_server_config_pb2.ModelServerConfig())


@pytest.mark.parametrize("small_requests_only, allowed", [(False, [1, 4, 16]), (True, [])])
def test_model_server_files_parse_as_tf_serving_reads_them(small_requests_only, allowed,
                                                           tmp_path):
    import types

    translator = types.SimpleNamespace(
        config=types.SimpleNamespace(max_batch_size=16),
        shapes=types.SimpleNamespace(batch_sizes=(1, 4, 16),
                                     xla_small_requests_only=small_requests_only))
    config_path, batching_path = saved_model.write_model_server_files(
        str(tmp_path / "exports" / "demo"), translator, batch_timeout_micros=700,
        num_batch_threads=3)
    [entry] = model_server_config(config_path).model_config_list.config
    assert (entry.name, entry.base_path, entry.model_platform) == (
        "demo", "/models/demo", "tensorflow")
    batching = batching_parameters(batching_path)
    assert (batching.max_batch_size.value, batching.batch_timeout_micros.value,
            batching.num_batch_threads.value, batching.max_enqueued_batches.value) == (
        16, 700, 3, 100)
    assert list(batching.allowed_batch_sizes) == allowed
    named, _ = saved_model.write_model_server_files(
        str(tmp_path / "other"), translator, model_name="wmt", base_path="/srv/wmt")
    [entry] = model_server_config(named).model_config_list.config
    assert (entry.name, entry.base_path) == ("wmt", "/srv/wmt")


@pytest.fixture(scope="module")
def export_path(tmp_path_factory, translator):
    """One export, checked in a separate process by `export_translator` itself."""
    base = tmp_path_factory.mktemp("export")
    return saved_model.export_translator(translator, str(base), config={"note": "test"})


@pytest.mark.slow
def test_export_layout_and_config(export_path):
    assert os.path.basename(export_path) == "1"
    names = set(os.listdir(export_path))
    assert {"saved_model.pb", "variables", "assets.extra"} <= names
    assert not [n for n in os.listdir(os.path.dirname(export_path)) if n.startswith(".")]
    with open(os.path.join(export_path, "assets.extra", "config.json")) as f:
        config = json.load(f)
    assert config["translator"]["beam_size"] == 4 and config["translator"]["alpha"] == 0.6
    assert config["translator"]["beam_sizes"] == [1, 4]
    assert config["model"]["d_model"] == 32 and config["run"] == {"note": "test"}
    assert saved_model.next_version(os.path.dirname(export_path)) == 2


@pytest.mark.slow
def test_reloaded_in_a_process_without_keras_transformer(export_path, translator):
    texts = SENTENCES + ["", "   ", BAD_UTF8.decode("utf-8", "replace")]
    expected = translator.translate(tf.constant(texts))
    report = saved_model.check_export(export_path, {"text": texts}, expected)
    assert set(saved_model.SIGNATURES) <= set(report["signatures"])
    assert "keras_transformer" not in report["modules"]
    wrong = dict(expected, translation=tf.constant(["something else"] * len(texts)))
    with pytest.raises(saved_model.ExportError, match="gives translation="):
        saved_model.compare_outputs(report["outputs"], wrong)


@pytest.mark.slow
def test_ids_only_export_loads_without_tensorflow_text(tmp_path, model):
    ids_only = serving.Translator(model, None, extra_length=EXTRA_LENGTH, beam_sizes=(4,))
    assert sorted(ids_only.signatures()) == ["serving_default", "translate_ids"]
    # export_translator checks it in a process that does not import tensorflow_text.
    path = saved_model.export_translator(ids_only, str(tmp_path))
    with open(os.path.join(path, "assets.extra", "config.json")) as f:
        assert json.load(f)["translator"]["ids_only"] is True


@pytest.mark.slow
def test_reloaded_signatures_answer_bad_input(export_path, translator):
    loaded = tf.saved_model.load(export_path)
    texts = tf.constant([SENTENCES[0], "", "   ", BAD_UTF8, " ".join(SENTENCES * 3)])
    got = loaded.signatures["serving_default"](text=texts)
    want = translator.translate(texts)
    assert _strings(got["translation"]) == _strings(want["translation"])
    empty = loaded.signatures["serving_default"](text=tf.constant([], tf.string))
    assert empty["translation"].shape == (0,)
    # The restored functions apply the defaults; the signatures take every input.
    nbest = loaded.translate_nbest(texts[:2], beam_size=tf.constant(1))
    expected = translator.translate_nbest(texts[:2], beam_size=tf.constant(1))
    assert nbest["translations"].shape == (2, 1)
    assert _strings(nbest["translations"]) == _strings(expected["translations"])
    np.testing.assert_allclose(nbest["scores"], expected["scores"], atol=1e-5)
    ids = loaded.signatures["translate_ids"](
        ids=tf.constant([[5, 6, 7]]), beam_size=tf.constant(1), alpha=tf.constant(0.6),
        extra_length=tf.constant(3), no_repeat_ngram_size=tf.constant(0))
    assert ids["ids"].shape[0] == 1
    with pytest.raises(tf.errors.InvalidArgumentError, match="beam_size must be one of"):
        loaded.translate(texts[:1], beam_size=tf.constant(8))


@pytest.mark.slow
def test_optional_inputs_can_be_left_out_as_tf_serving_does(export_path, translator):
    """TF Serving runs a signature in a TF1 session and feeds only the inputs a
    request has; the knobs are PlaceholderWithDefault with the paper's values."""
    texts = SENTENCES[:2]
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta_graph = tf.compat.v1.saved_model.load(session, ["serve"], export_path)
        signature = meta_graph.signature_def["translate"]
        assert set(signature.defaults) == {"beam_size", "alpha", "extra_length",
                                           "no_repeat_ngram_size"}
        assert tf.make_ndarray(signature.defaults["beam_size"]) == 4
        outputs = session.run(
            {name: info.name for name, info in signature.outputs.items()},
            feed_dict={signature.inputs["text"].name: texts},
        )
    expected = translator.translate(tf.constant(texts))
    assert [t.decode() for t in outputs["translation"]] == _strings(expected["translation"])


@pytest.mark.slow
def test_saved_model_cli_lists_the_signatures(export_path):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    result = subprocess.run(
        [cli, "show", "--dir", export_path, "--all"], capture_output=True, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), check=True,
    )
    for name in saved_model.SIGNATURES:
        assert f"signature_def['{name}']" in result.stdout
    assert "inputs['text'] tensor_info" in result.stdout
    assert "outputs['translations'] tensor_info" in result.stdout


@pytest.mark.slow
def test_warmup_requests_cover_every_signature(export_path):
    path = os.path.join(export_path, "assets.extra", saved_model.WARMUP_FILENAME)
    loaded = tf.saved_model.load(export_path)
    signatures = []
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        log = prediction_log_pb2.PredictionLog.FromString(record)
        request = log.predict_log.request
        name = request.model_spec.signature_name
        signatures.append(name)
        inputs = {key: tf.constant(tf.make_ndarray(value)) for key, value in request.inputs.items()}
        assert all(value.shape[0] >= 1 for value in inputs.values())
        # Replayed as the server would (the knobs left to their defaults): it answers.
        function = loaded.signatures[name] if name == "serving_default" else getattr(loaded, name)
        outputs = function(**inputs)
        assert all(value.shape[0] == len(next(iter(inputs.values())))
                   for value in outputs.values())
    # One request for each signature the export serves, whatever the list says.
    assert sorted(signatures) == sorted(loaded.signatures) == sorted(saved_model.SIGNATURES)


@pytest.mark.slow
def test_existing_version_is_not_overwritten(export_path, translator):
    base, version = os.path.split(export_path)
    with pytest.raises(ValueError, match="exists already"):
        saved_model.export_translator(translator, base, int(version), check=False)


@pytest.mark.slow
def test_a_full_disk_is_named_and_leaves_no_partial_export(translator, tmp_path, monkeypatch):
    """TensorFlow says a full disk as a ResourceExhaustedError ("...; No space left
    on device"): the export raises the system's error naming the version's
    directory, and leaves nothing; running out of memory, also a
    ResourceExhaustedError, is passed on as it is."""
    save = tf.saved_model.save

    def fills_the_disk(obj, path, signatures=None):
        save(obj, path, signatures=signatures)  # the files are written, then the last fails
        raise tf.errors.ResourceExhaustedError(
            None, None, f"{path}/saved_model.pb.tmp3b2; No space left on device")

    monkeypatch.setattr(tf.saved_model, "save", fills_the_disk)
    with pytest.raises(OSError) as raised:
        saved_model.export_translator(translator, str(tmp_path), check=False)
    assert str(raised.value) == f"[Errno 28] No space left on device: '{tmp_path}/1'"
    assert os.listdir(tmp_path) == []

    def out_of_memory(obj, path, signatures=None):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")

    monkeypatch.setattr(tf.saved_model, "save", out_of_memory)
    with pytest.raises(tf.errors.ResourceExhaustedError, match="OOM when allocating"):
        saved_model.export_translator(translator, str(tmp_path), check=False)


def test_a_translator_without_a_character_limit_is_not_exported(tmp_path, model, tokenizer):
    """A run's own translator (max_input_chars None) tokenizes a sentence of any
    length; its model server would too, for whoever sends one: refused, before
    anything is written."""
    unlimited = serving.Translator(model, tokenizer, max_input_chars=None, beam_sizes=(4,))
    with pytest.raises(ValueError, match=r"^export_translator: the translator has "
                                         r"max_input_chars=None \(no limit\), which an export "
                                         r"may not have: .* \(the default: 10000 characters\)$"):
        saved_model.export_translator(unlimited, str(tmp_path / "export"))
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_request_limits_are_refused_before_any_work(tmp_path, model, tokenizer):
    limited = serving.Translator(model, tokenizer, extra_length=EXTRA_LENGTH, beam_sizes=(1, 4),
                                 max_batch_size=4, max_input_chars=40)
    with pytest.raises(ValueError, match="warm-up sentences must fit the request limits"):
        saved_model.export_translator(limited, str(tmp_path / "x"), warmup_texts=["a" * 41])
    export_dir = str(tmp_path / "limited")
    path = saved_model.export_translator(limited, export_dir, warmup_texts=["Hello.", "Hi."])
    with open(os.path.join(path, "assets.extra", "config.json")) as f:
        settings = json.load(f)["translator"]
    assert (settings["max_batch_size"], settings["max_input_chars"]) == (4, 40)

    loaded = tf.saved_model.load(path)
    serve = loaded.signatures["serving_default"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_batch_size=4"):
        serve(text=tf.constant(["Hello."] * 5))
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_batch_size=4"):
        loaded.translate_ids(tf.constant([[5, 6]] * 5))
    for text in ["é" * 41, "word " * 1_000_000]:  # characters, not bytes; 5 MB
        with pytest.raises(tf.errors.InvalidArgumentError, match="max_input_chars=40"):
            serve(text=tf.constant(["Hello.", text]))
    within = tf.constant(["é" * 40, "Hello."])  # 80 bytes, 40 characters: accepted
    assert _strings(serve(text=within)["translation"]) == _strings(
        limited.translate(within)["translation"])
    # extra_length is clamped to the output limit instead of overflowing int32.
    huge = loaded.translate(tf.constant(["Hello."]), extra_length=tf.constant(2_000_000_000))
    capped = limited.translate(tf.constant(["Hello."]),
                               extra_length=tf.constant(limited.config.max_output_length))
    assert _strings(huge["translation"]) == _strings(capped["translation"])

    config_path, batching_path = saved_model.write_model_server_files(export_dir, limited)
    [entry] = model_server_config(config_path).model_config_list.config
    assert (entry.name, entry.base_path, entry.model_platform) == (
        "limited", "/models/limited", "tensorflow")
    assert batching_parameters(batching_path).max_batch_size.value == 4
    assert saved_model.next_version(export_dir) == 2  # the server ignores the two files


@pytest.mark.slow
def test_reloaded_score_and_alignments_equal_the_translators(export_path, translator):
    loaded = tf.saved_model.load(export_path)
    sources, targets = tf.constant(SENTENCES[:2]), tf.constant(["En el principio.", ""])
    got = loaded.signatures["score"](source=sources, target=targets)
    want = translator.score(sources, targets)
    np.testing.assert_allclose(got["token_log_probs"], want["token_log_probs"], atol=1e-5)
    np.testing.assert_array_equal(got["alignment"], want["alignment"])
    assert _strings(got["source_tokens"][0]) == _strings(want["source_tokens"][0])
    aligned = loaded.signatures["translate_aligned"](
        text=sources, beam_size=tf.constant(4), alpha=tf.constant(0.6),
        extra_length=tf.constant(EXTRA_LENGTH), no_repeat_ngram_size=tf.constant(0))
    expected = translator.translate_aligned(sources)
    assert _strings(aligned["translation"]) == _strings(expected["translation"])
    np.testing.assert_array_equal(aligned["alignment"], expected["alignment"])


def test_the_next_version_is_one_past_the_largest_whatever_lies_beside(tmp_path):
    """A new export never lands in an existing version: after versions 1 and 3 (2
    removed by hand) and the server's files, it is 4."""
    assert saved_model.next_version(str(tmp_path / "none")) == 1
    for name in ("1", "3", "tmp"):
        (tmp_path / name).mkdir()
    (tmp_path / "models.config").write_text("")
    assert saved_model.next_version(str(tmp_path)) == 4


def test_the_export_check_refuses_other_values_shapes_and_missing_outputs():
    """The check of a reloaded export (`compare_outputs`) fails on any output that
    differs from the in-memory translator's: strings, scores, ids or shapes."""
    expected = {"translation": np.array([b"a", b"b"], dtype=object),
                "score": np.array([-1.0, -2.0], np.float32),
                "ids": np.array([[1, 2]], np.int32)}
    same = {"translation": ["a", "b"], "score": [-1.0, -2.00001], "ids": [[1, 2]]}
    saved_model.compare_outputs(same, expected)
    for name, value in (("translation", ["a", "c"]), ("score", [-1.0, -2.5]),
                        ("score", [-1.0]), ("ids", [[1, 3]]), ("ids", [[1, 2, 0]])):
        with pytest.raises(saved_model.ExportError, match=f"gives {name}="):
            saved_model.compare_outputs(dict(same, **{name: value}), expected)
    with pytest.raises(saved_model.ExportError, match="has no output 'score'"):
        saved_model.compare_outputs({"translation": ["a", "b"], "ids": [[1, 2]]}, expected)
