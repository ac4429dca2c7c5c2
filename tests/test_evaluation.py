"""Tests for keras_transformer.evaluation: batch translation and BLEU."""

import os
import re
import warnings

import numpy as np
import pytest
import sacrebleu
import tensorflow as tf

from keras_transformer import evaluation
from keras_transformer import loading
from keras_transformer import runs
from keras_transformer import serving
from keras_transformer.decoding_config import DecodingConfig
from keras_transformer.decoding_config import TruncatedInputWarning
from tests.translation_fixtures import SENTENCES
from tests.translation_fixtures import make_model
from tests.translation_fixtures import make_run_dir
from tests.translation_fixtures import strings as _strings


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
    # The in-graph checks' messages without TensorFlow's brackets and details:
    # "[extra_length must be >= 0; received.  ] [Condition x >= 0 did not hold
    # element-wise:] [x (extra_length:0) = ] [-1]" was what a user read.
    for knobs, message in (
            (dict(beam_size=3), "beam_size must be one of [1, 4] (the sizes traced at export); "
                                "received 3"),
            (dict(extra_length=-1), "extra_length must be >= 0; received -1"),
            (dict(no_repeat_ngram_size=-2), "no_repeat_ngram_size must be >= 0 (0 blocks "
                                            "nothing); received -2")):
        with pytest.raises(ValueError) as error:
            evaluation.translate_sentences(translator, SENTENCES[:1], **knobs)
        assert str(error.value) == f"the translator rejected the request: {message}"


def test_translate_sentences_keeps_within_the_request_limits(translator, tokenizer):
    """Batches of at most max_batch_size, whatever batch_size says; a sentence over
    max_input_chars refused by name before any is translated."""
    limited = serving.Translator(translator.model, tokenizer, extra_length=6,
                                 max_input_length=16, beam_sizes=(4,), max_batch_size=2,
                                 max_input_chars=60)
    expected = evaluation.translate_sentences(translator, SENTENCES)
    assert evaluation.translate_sentences(limited, SENTENCES, batch_size=32) == expected
    calls = []
    limited.translate = lambda text, **knobs: calls.append(text) or translator.translate(text)
    with pytest.raises(ValueError, match=r"sentence 3 \(and 1 more\) is longer than the "
                                         r"translator's max_input_chars=60 .*: 61 characters"):
        evaluation.translate_sentences(limited, ["a", "b", "x" * 61, "y" * 70])
    with pytest.raises(ValueError, match=r"^sentence 12 \(and 1 more\) is longer"):
        evaluation.translate_sentences(limited, ["a", "b", "x" * 61, "y" * 70], first_number=10)
    assert not calls


def test_translate_sentences_warns_of_sentences_translated_from_their_first_pieces(
        translator, tokenizer):
    """One `TruncatedInputWarning` a call, naming the first sentence of more
    pieces than max_input_length (numbered from first_number, however the
    batches sorted them) and how many more; none where every sentence fits."""
    short = ["Hi.", "And God saw."]
    long = " ".join(SENTENCES)
    assert max(tokenizer.tokenize(tf.constant(short)).row_lengths()) <= 16
    assert tokenizer.tokenize(SENTENCES[1]).shape[0] > 16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        evaluation.translate_sentences(translator, short)
    sentences = [short[0], SENTENCES[1], short[1], long, long]
    for batch_size, first_number in ((1, 1), (32, 10)):
        with pytest.warns(TruncatedInputWarning) as caught:
            translations = evaluation.translate_sentences(
                translator, sentences, batch_size, first_number=first_number)
        assert [str(warning.message) for warning in caught] == [
            f"sentence {first_number + 1} (and 2 more) has more subword pieces than the "
            "translator's max_input_length=16: only its first 16 were translated, and its "
            "translation misses the rest; split long lines into sentences"]
        assert translations == _strings(translator.translate(tf.constant(sentences))[
            "translation"])


def test_a_translator_without_a_character_limit_translates_a_paragraph_from_its_first_pieces(
        translator, tokenizer):
    """A run's own translators (`in_process_settings`: max_input_chars None)
    translate a test paragraph of more characters than an export's default
    limit from its first pieces, and the warning calls it by the name given,
    where the default limit refuses the corpus. Train died at its first dev
    BLEU this way, and its evaluate --run could not score such a test set."""
    from keras_transformer.decoding_config import DEFAULT_MAX_INPUT_CHARS
    from keras_transformer.decoding_config import in_process_settings

    unlimited = serving.Translator(translator.model, tokenizer, extra_length=6,
                                   max_input_length=16, **in_process_settings(1))
    paragraph = " ".join(SENTENCES * (DEFAULT_MAX_INPUT_CHARS // len(" ".join(SENTENCES)) + 1))
    assert len(paragraph) > DEFAULT_MAX_INPUT_CHARS
    pairs = [("And God saw.", SENTENCES[0]), (paragraph, SENTENCES[1])]
    with pytest.raises(ValueError, match=r"^test sentence 2 is longer than the translator's "
                                         r"max_input_chars=10000 characters"):
        evaluation.evaluate(translator, pairs, named="test sentence", beam_size=1)
    with pytest.warns(TruncatedInputWarning) as caught:
        result = evaluation.evaluate(unlimited, pairs, named="test sentence")
    assert [str(warning.message) for warning in caught] == [
        "test sentence 2 has more subword pieces than the translator's max_input_length=16: "
        "only its first 16 were translated, and its translation misses the rest; split long "
        "lines into sentences"]
    # Its first 16 pieces are those of the first sentences' paragraph.
    assert result["hypotheses"] == _strings(translator.translate(
        tf.constant(["And God saw.", " ".join(SENTENCES)]), beam_size=1)["translation"])


@pytest.mark.slow
def test_translate_sentences_from_an_export_path(translator, tmp_path):
    """The path alone: the export it loads lives as long as the translation."""
    from keras_transformer import saved_model

    path = saved_model.export_translator(translator, str(tmp_path), warmup_texts=(),
                                         check=False)
    expected = evaluation.translate_sentences(translator, SENTENCES)
    # Its recorded max_input_length names the limit of its sentences truncated.
    with pytest.warns(TruncatedInputWarning, match=r"^sentence 1 \(and 3 more\) .* "
                                                   r"max_input_length=16: only its first 16"):
        assert evaluation.translate_sentences(path, SENTENCES, batch_size=2) == expected
    assert evaluation.evaluate(str(tmp_path), list(zip(SENTENCES, SENTENCES)))[
        "hypotheses"] == expected


def test_progress_bar_goes_to_stderr(translator, capsys):
    evaluation.translate_sentences(translator, SENTENCES, batch_size=2, progress=True)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "4/4" in captured.err


class _Terminal:
    """A stderr that says it is a terminal, or not, and keeps what is written."""

    def __init__(self, is_terminal):
        self.is_terminal, self.text = is_terminal, ""

    def isatty(self):
        return self.is_terminal

    def write(self, text):
        self.text += text

    def flush(self):
        pass


@pytest.mark.parametrize("is_terminal", [True, False])
def test_the_automatic_progress_bar_shows_on_a_terminal_and_long_inputs_only(
        translator, monkeypatch, is_terminal):
    """"auto" (translate's and evaluate's default): a bar on a terminal for 200
    sentences or more; none in a log file, where its carriage returns pile up."""
    monkeypatch.setattr(evaluation, "PROGRESS_MIN_SENTENCES", 5)
    stderr = _Terminal(is_terminal)
    monkeypatch.setattr(evaluation.sys, "stderr", stderr)
    evaluation.translate_sentences(translator, SENTENCES[:4], batch_size=4, progress="auto")
    assert stderr.text == ""  # fewer than the minimum
    evaluation.translate_sentences(translator, SENTENCES[:4] * 2, batch_size=4, progress="auto")
    assert ("8/8" in stderr.text) == is_terminal, stderr.text


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


class LengthByAlpha:
    """A stand-in translator whose translation of a source is its reference cut
    to `alpha / best` of its words, or grown by a repeated word beyond `best`:
    the length penalty `best` translates best, as a larger alpha lengthens beam
    search's translations. `blocking` says what blocking repeated n-grams does:
    "neutral" nothing; "mends" without it, every translation ends in a loop;
    "hurts" with it, the first word of each is lost (a repetition the
    reference has)."""

    def __init__(self, references, best, blocking="neutral"):
        self.references, self.best, self.blocking = references, best, blocking
        self.requests = []

    def translate(self, batch, alpha, no_repeat_ngram_size):
        alpha, size = round(float(alpha.numpy()), 6), int(no_repeat_ngram_size.numpy())
        self.requests.append((size, alpha))
        translations = []
        for source in batch.numpy():
            words = self.references[source.decode()].split()
            kept = max(1, round(len(words) * min(1.0, alpha / self.best)))
            extra = round(len(words) * max(0.0, alpha - self.best))
            words = words[:kept] + ["y"] * extra
            if self.blocking == "mends" and not size:
                words += ["de los hijos"] * 3
            if self.blocking == "hurts" and size:
                words = words[1:]
            translations.append(" ".join(words))
        return {"translation": tf.constant(translations)}


def _pairs():
    return [(source, target) for source, target in zip(SENTENCES, SENTENCES[1:] + SENTENCES[:1])]


@pytest.mark.parametrize("blocking, size", [("neutral", 0), ("mends", 4), ("hurts", 0)])
@pytest.mark.parametrize("best, chosen", [
    (1.0, 1.0),  # rises to 1.0, falls at 1.2
    (0.8, 0.8),  # falls after 0.8, all tried still
    (0.5, 0.6),  # the paper's, when a larger alpha only falls
    (1.5, 1.2),  # the largest tried
])
def test_choose_decoding_takes_the_best_alpha_then_blocks_where_that_scores_higher(
        blocking, size, best, chosen):
    pairs = _pairs()
    translator = LengthByAlpha(dict(pairs), best, blocking)
    settings, scores = evaluation.choose_decoding(translator, pairs)
    assert settings == {"no_repeat_ngram_size": size, "alpha": chosen}
    # The alphas with 4-grams blocked, then not blocking at the alpha chosen.
    tried = [(4, alpha) for alpha in evaluation.ALPHAS] + [(0, chosen)]
    assert list(scores) == tried
    assert sorted(set(translator.requests)) == sorted(tried)
    for (n, a), score in scores.items():  # each is sacreBLEU of those translations
        hypotheses = LengthByAlpha(dict(pairs), best, blocking).translate(
            tf.constant([source for source, _ in pairs]), tf.constant(a),
            tf.constant(n))["translation"]
        assert score == pytest.approx(sacrebleu.corpus_bleu(
            [h.decode() for h in hypotheses.numpy()], [[t for _, t in pairs]]).score)


def test_choose_decoding_tries_every_alpha_past_a_fall():
    """BLEU against alpha on a few dev pairs is not smooth: a fall at 0.8 says
    nothing of 1.2 (a Zen 4 quickstart of 2026-12-06: 20.65 at 0.6, 20.64 at
    0.8, 21.54 at 1.2)."""
    pairs = _pairs()
    references = dict(pairs)
    cut = {0.6: 1, 0.8: 2, 1.0: 2, 1.2: 0}  # words cut from the end of each reference

    class Uneven:
        def translate(self, batch, alpha, no_repeat_ngram_size):
            words = [references[source.decode()].split() for source in batch.numpy()]
            n = cut[round(float(alpha.numpy()), 6)]
            return {"translation": tf.constant([" ".join(w[:len(w) - n]) for w in words])}

    settings, scores = evaluation.choose_decoding(Uneven(), pairs)
    assert scores[4, 0.8] < scores[4, 0.6] < scores[4, 1.2] == pytest.approx(100.0)
    assert settings == {"no_repeat_ngram_size": 0, "alpha": 1.2}  # blocking ties: not kept


@pytest.mark.parametrize("effect, chosen", [
    ("mends", {"no_repeat_ngram_size": 4, "alpha": 1.0, "block_adjacent_repeats": True}),
    ("hurts", {"no_repeat_ngram_size": 0, "alpha": 1.0})])
def test_choose_decoding_blocks_on_the_blocking_translator(effect, chosen):
    """With `blocking` (the translator that also blocks words repeated back to
    back), the searches that block run on it and the paper's on the other; where
    blocking wins, the settings say so."""
    pairs = _pairs()
    plain = LengthByAlpha(dict(pairs), 1.0, effect)
    blocking = LengthByAlpha(dict(pairs), 1.0, effect)
    settings, scores = evaluation.choose_decoding(plain, pairs, blocking=blocking)
    assert settings == chosen
    assert blocking.requests == [(4, 0.6), (4, 0.8), (4, 1.0), (4, 1.2)]
    assert plain.requests == [(0, 1.0)]


def test_choose_decoding_keeps_the_first_on_a_tie_and_checks_its_arguments():
    pairs = list(zip(SENTENCES, SENTENCES))
    same = LengthByAlpha(dict(pairs), best=0.1)  # every setting translates alike
    same.translate = lambda batch, **settings: {"translation": batch}
    settings, scores = evaluation.choose_decoding(same, pairs)
    assert settings == {"no_repeat_ngram_size": 0, "alpha": 0.6}  # the paper's
    assert scores == {(4, 0.6): pytest.approx(100.0), (4, 0.8): pytest.approx(100.0),
                      (4, 1.0): pytest.approx(100.0), (4, 1.2): pytest.approx(100.0),
                      (0, 0.6): pytest.approx(100.0)}
    with pytest.raises(ValueError, match="increasing alphas"):
        evaluation.choose_decoding(same, pairs, alphas=(1.0, 0.6))
    with pytest.raises(ValueError, match="an int block >= 0. Received: block=-1"):
        evaluation.choose_decoding(same, pairs, block=-1)
    # block=0: alpha only, the paper's search throughout.
    assert evaluation.choose_decoding(same, pairs, block=0) == (
        {"no_repeat_ngram_size": 0, "alpha": 0.6},
        {(0, alpha): pytest.approx(100.0) for alpha in evaluation.ALPHAS})


def test_load_translator_from_a_run_and_errors(tmp_path, tokenizer):
    run = make_run_dir(tmp_path / "run", tokenizer, make_model(tokenizer.vocab_size))
    translator = loading.load_translator(run=run, beam_sizes=(4,))
    assert isinstance(translator, serving.Translator)
    assert translator.config.beam_sizes == (4,)
    assert translator.config.alpha == 0.6  # the paper's: the run chose it
    # The length penalty train chose on dev pairs (decoding.json), unless told.
    runs.Run(run).write_decoding({"alpha": 1.2, "no_repeat_ngram_size": 4},
                                 {(4, 0.6): 10.0, (0, 0.6): 9.0, (4, 1.0): 12.0,
                                  (4, 1.2): 12.5}, 300)
    chosen = loading.load_translator(run=run, beam_sizes=(4,)).config
    assert (chosen.alpha, chosen.no_repeat_ngram_size) == (1.2, 4)
    told = loading.load_translator(run=run, beam_sizes=(4,), alpha=0.8,
                                   no_repeat_ngram_size=0).config
    assert (told.alpha, told.no_repeat_ngram_size) == (0.8, 0)
    assert not chosen.block_adjacent_repeats  # a run of before 2026-11-29
    runs.Run(run).write_decoding({"alpha": 1.2, "no_repeat_ngram_size": 4,
                                  "block_adjacent_repeats": True}, {(4, 1.2): 12.5}, 300)
    assert runs.Run(run).decoding_settings() == {
        "alpha": 1.2, "no_repeat_ngram_size": 4, "block_adjacent_repeats": True}
    assert loading.translator_from_run(run, beam_sizes=(4,)).config.block_adjacent_repeats
    with open(runs.Run(run).decoding_path, "w") as f:  # a run of 2026-11-26: alpha only
        f.write('{"alpha": 1.0, "dev_bleu": {"0.6": 10.0, "1": 11.0}, "sentences": 300}')
    old = loading.load_translator(run=run, beam_sizes=(4,)).config
    assert (old.alpha, old.no_repeat_ngram_size) == (1.0, 0)
    runs.Run(run).write_decoding(None, {}, 0)
    paper = loading.load_translator(run=run, beam_sizes=(4,)).config
    assert (paper.alpha, paper.no_repeat_ngram_size) == (0.6, 0)
    for bad in ('{"dev_bleu": {}}', '{"alpha": 1.0, "no_repeat_ngram_size": -1}'):
        with open(runs.Run(run).decoding_path, "w") as f:
            f.write(bad)
        with pytest.raises(ValueError, match="decoding.json needs a number \"alpha\".*remove"):
            loading.load_translator(run=run)
    with open(runs.Run(run).decoding_path, "w") as f:
        f.write('{"alpha": 1.0, "block_adjacent_repeats": "yes"}')
    with pytest.raises(ValueError, match="\"block_adjacent_repeats\" must be true or false"):
        loading.load_translator(run=run)
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
    # Weights cut short (a copy that stopped): a sentence naming the file, the other weights.
    for name, weights, other in ((runs.AVERAGED_WEIGHTS, "averaged", "final"),
                                 (runs.FINAL_MODEL, "final", "averaged")):
        path = os.path.join(run, name)
        with open(path, "rb") as f:
            whole = f.read()
        with open(path, "wb") as f:
            f.write(whole[:len(whole) // 2])
        with pytest.raises(ValueError, match=rf"{re.escape(path)} cannot be read: it is cut "
                                             rf"short.*Was it copied whole\? Copy it again, or "
                                             rf"try .*--weights {other} \(weights='{other}'\)"):
            loading.load_translator(run=run, weights=weights)
