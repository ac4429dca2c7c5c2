"""Tests for keras_transformer.evaluation: batch translation and BLEU."""

import numpy as np
import pytest
import sacrebleu
import tensorflow as tf

from keras_transformer import evaluation
from keras_transformer import loading
from keras_transformer import serving
from keras_transformer.decoding_config import DecodingConfig
from tests.translation_fixtures import SENTENCES
from tests.translation_fixtures import make_model
from tests.translation_fixtures import make_run_dir

pytestmark = pytest.mark.keeps_graphs


@pytest.fixture(scope="module")
def translator(tokenizer):
    model = make_model(tokenizer.vocab_size)
    return serving.Translator(model, tokenizer, extra_length=6, max_input_length=16,
                              beam_sizes=(1, 4))


# BLEU ---------------------------------------------------------------------------


def test_identical_translations_score_100():
    scores = evaluation.bleu_scores(SENTENCES, SENTENCES)
    assert scores["bleu"] == pytest.approx(100.0)
    assert scores["tokenized_bleu"] == pytest.approx(100.0)
    assert scores["sentences"] == len(SENTENCES)


def test_scores_and_signatures_are_sacrebleus():
    hypotheses = ["The cat sat on the mat.", "A well-known fact, isn't it?"]
    references = ["The cat is on the mat.", "It is a well-known fact, isn't it?"]
    scores = evaluation.bleu_scores(hypotheses, references)
    expected = sacrebleu.corpus_bleu(hypotheses, [references])
    assert scores["bleu"] == pytest.approx(expected.score)
    intl = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="intl")
    assert scores["tokenized_bleu"] == pytest.approx(intl.score)
    assert "tok:13a" in scores["signature"] and "nrefs:1" in scores["signature"]
    assert "version:" in scores["signature"]
    assert "tok:intl" in scores["tokenized_signature"]
    assert scores["text"].startswith("BLEU = ")


def test_tokenized_bleu_splits_hyphenated_compounds():
    # 13a keeps "well-known" one token; the international tokenization splits
    # it in three, as the paper-era compound splitting did, so a matching
    # compound counts as several matching tokens.
    hypothesis, reference = "the cat saw a well-known old house", "the dog saw a well-known old house"
    scores = evaluation.bleu_scores([hypothesis], [reference])
    assert scores["bleu"] == pytest.approx(64.35, abs=0.01)
    assert scores["tokenized_bleu"] == pytest.approx(75.06, abs=0.01)


def test_bleu_checks_its_inputs():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        evaluation.bleu_scores(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="no sentences"):
        evaluation.bleu_scores([], [])


# Translating lists ----------------------------------------------------------------


def test_translate_sentences_keeps_order_across_batches(translator):
    sentences = SENTENCES + ["", "And God saw."]
    expected = [t.decode() for t in
                translator.translate(tf.constant(sentences))["translation"].numpy()]
    for batch_size in (1, 4, 32):
        assert evaluation.translate_sentences(translator, sentences, batch_size) == expected
    assert evaluation.translate_sentences(translator, []) == []


def test_translate_sentences_passes_decoding_settings(translator):
    greedy = translator.translate(tf.constant(SENTENCES[:2]), beam_size=tf.constant(1),
                                  extra_length=tf.constant(2))["translation"].numpy()
    got = evaluation.translate_sentences(translator, SENTENCES[:2], beam_size=1,
                                         extra_length=2)
    assert got == [t.decode() for t in greedy]
    with pytest.raises(ValueError, match=r"beam_size must be one of \[1, 4\]"):
        evaluation.translate_sentences(translator, SENTENCES[:1], beam_size=3)


def test_translate_sentences_from_an_export_path(translator, tmp_path):
    """The path alone: the export it loads lives as long as the translation."""
    from keras_transformer import saved_model

    path = saved_model.export_translator(translator, str(tmp_path), warmup_texts=(),
                                         check=False)
    expected = evaluation.translate_sentences(translator, SENTENCES)
    assert evaluation.translate_sentences(path, SENTENCES, batch_size=2) == expected
    assert evaluation.evaluate(str(tmp_path), list(zip(SENTENCES, SENTENCES)))[
        "hypotheses"] == expected


def test_progress_bar_goes_to_stderr(translator, capsys):
    evaluation.translate_sentences(translator, SENTENCES, batch_size=2, progress=True)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "4/4" in captured.err


def test_evaluate_a_corpus(translator):
    pairs = tf.data.Dataset.from_tensor_slices(
        {"source": SENTENCES, "target": SENTENCES})
    result = evaluation.evaluate(translator, pairs, batch_size=2, limit=3)
    assert result["sentences"] == 3 and len(result["hypotheses"]) == 3
    assert 0.0 <= result["bleu"] <= 100.0 and result["sentences_per_second"] > 0
    as_list = evaluation.evaluate(translator, list(zip(SENTENCES, SENTENCES))[:3])
    assert as_list["hypotheses"] == result["hypotheses"]
    np.testing.assert_allclose(as_list["bleu"], result["bleu"])


def _references_unlike_the_sources(hypotheses):
    """References that are not the sources: every other one the hypothesis itself,
    the rest a sentence of another line, so that BLEU against them is neither 0
    nor 100 and differs from BLEU against the sources."""
    return [hypothesis if i % 2 == 0 else SENTENCES[(i + 1) % len(SENTENCES)]
            for i, hypothesis in enumerate(hypotheses)]


@pytest.mark.parametrize("as_dataset", [True, False], ids=["dataset", "list"])
def test_evaluate_scores_against_the_targets(translator, as_dataset):
    """BLEU is sacreBLEU's of the hypotheses against the target column, not the sources."""
    hypotheses = evaluation.translate_sentences(translator, SENTENCES, beam_size=1)
    targets = _references_unlike_the_sources(hypotheses)
    expected = sacrebleu.corpus_bleu(hypotheses, [targets])
    against_sources = sacrebleu.corpus_bleu(hypotheses, [SENTENCES])
    assert 0 < expected.score < 100 and expected.score != against_sources.score
    pairs = list(zip(SENTENCES, targets))
    if as_dataset:
        pairs = tf.data.Dataset.from_tensor_slices({"source": SENTENCES, "target": targets})
    result = evaluation.evaluate(translator, pairs, batch_size=3, beam_size=1)
    assert result["hypotheses"] == hypotheses
    assert result["bleu"] == expected.score
    assert result["tokenized_bleu"] == sacrebleu.corpus_bleu(
        hypotheses, [targets], tokenize="intl").score
    assert result["text"] == str(expected)


def test_load_translator_from_a_run_and_errors(tmp_path, tokenizer):
    run = make_run_dir(tmp_path / "run", tokenizer, make_model(tokenizer.vocab_size))
    translator = loading.load_translator(run=run, beam_sizes=(4,))
    assert isinstance(translator, serving.Translator)
    assert translator.config.beam_sizes == (4,)
    configured = loading.translator_from_run(run, "final", DecodingConfig(beam_sizes=(1,),
                                                                          beam_size=1))
    assert configured.config.beam_sizes == (1,)
    with pytest.raises(ValueError, match="exactly one of export"):
        loading.load_translator()
    with pytest.raises(FileNotFoundError, match="holds no SavedModel"):
        loading.load_export(run)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        loading.load_export(tmp_path / "nowhere")
    with pytest.raises(TypeError, match="needs a Translator"):
        evaluation.translate_sentences(object(), ["a"])
