"""Tests for keras_transformer.serving: the in-memory `Translator` (its export:
tests/test_saved_model.py)."""

import dataclasses
import unicodedata

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import decoding
from keras_transformer import hardware
from keras_transformer import serving
from keras_transformer import serving_text
from keras_transformer.data import BOS_ID, EOS_ID
from keras_transformer.decoding_config import DecodingConfig
from tests.reference import capitalized_like
from tests.reference import restored_case
from tests.translation_fixtures import SENTENCES
from tests.translation_fixtures import make_model
from tests.translation_fixtures import BAD_UTF8
from tests.translation_fixtures import EXTRA_LENGTH
from tests.translation_fixtures import MAX_INPUT_LENGTH
from tests.translation_fixtures import strings as _strings


def full_model_step_fn(model):
    """A step function without a key/value cache: the slow, obvious twin.

    Every step re-runs the whole model (encoder and decoder) on the source and
    on the full prefix `ids[:, :step + 1]`, and returns the logits of its last
    position. Its cache holds only `{"source_ids": (N, S)}`, which beam search
    tiles and reorders like any cache.
    """

    def step_fn(ids, step, cache):
        logits = model(
            {"encoder_inputs": cache["source_ids"], "decoder_inputs": ids[:, : step + 1]},
            training=False,
        )  # (N, step + 1, V)
        return logits[:, -1], cache

    return step_fn


# Decoding with the real model ---------------------------------------------------


def test_cached_decoding_equals_rerunning_the_full_decoder(model, tokenizer):
    """Beam search as the Translator runs it (one cache per source for its K
    hypotheses: keys and values written in place, the slot table reordered)
    gives the ids and scores of beam search over a cache tiled to one copy per
    hypothesis and gathered every step, over a step function that re-runs the
    whole model on the full prefix every step, and over ones that re-run the
    decoder only (memory tiled, or once per source); and so does the search whose
    finished sources leave the batch (`Transformer.select_examples`), here at
    their different limits."""
    source = tokenizer.tokenize(tf.constant(SENTENCES)).to_tensor()  # (B, S)
    batch, max_length, beam_size = source.shape[0], 12, 3
    start = tf.fill([batch], BOS_ID)
    args = dict(vocab_size=model.config.vocab_size, max_output_length=max_length, eos_id=EOS_ID,
                beam_size=beam_size, alpha=0.6, max_output_lengths=tf.constant([5, 12, 8, 3]))

    @tf.function(autograph=False)
    def shared_cache():
        cache = model.initial_cache(source, max_length, beam_size=beam_size)
        return decoding.beam_search(model.step_function(), start, cache,
                                    reorder_cache=model.reorder_cache, **args)

    @tf.function(autograph=False)
    def leaving_the_batch():
        cache = model.initial_cache(source, max_length, beam_size=beam_size)
        return decoding.beam_search(model.step_function(), start, cache,
                                    reorder_cache=model.reorder_cache,
                                    select_examples=model.select_examples, **args)

    @tf.function(autograph=False)
    def tiled_cache():
        cache = model.initial_cache(source, max_output_length=max_length)
        return decoding.beam_search(model.step_function(), start, cache, **args)

    @tf.function(autograph=False)
    def uncached():
        return decoding.beam_search(
            full_model_step_fn(model), start, {"source_ids": source}, **args)

    @tf.function(autograph=False)
    def decoder_only():
        return decoding.beam_search(
            model.step_function(use_cache=False), start, model.initial_cache(source), **args)

    @tf.function(autograph=False)
    def decoder_only_shared_memory():
        return decoding.beam_search(
            model.step_function(use_cache=False), start, model.initial_cache(source),
            reorder_cache=model.reorder_cache, **args)

    cached_ids, cached_scores = shared_cache()
    assert np.all(np.isfinite(cached_scores))
    for twin in (leaving_the_batch, tiled_cache, uncached, decoder_only,
                 decoder_only_shared_memory):
        full_ids, full_scores = twin()
        np.testing.assert_array_equal(cached_ids, full_ids)
        np.testing.assert_allclose(cached_scores, full_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_uncached_translator_equals_cached(translator, tokenizer, norm_first):
    """Post-norm: the shared translator is the cached one; pre-norm: a model of its own."""
    options = dict(extra_length=EXTRA_LENGTH, max_input_length=MAX_INPUT_LENGTH, beam_sizes=(4,))
    source = tokenizer.tokenize(tf.constant(SENTENCES)).to_tensor()
    if norm_first:
        model = make_model(tokenizer.vocab_size, norm_first=True)
        cached = serving.Translator(model, None, **options).translate_ids(source)
    else:
        model, cached = translator.model, translator.translate_ids(source)
    uncached = serving.Translator(model, None, use_cache=False, **options).translate_ids(source)
    np.testing.assert_array_equal(cached["ids"], uncached["ids"])
    np.testing.assert_allclose(cached["score"], uncached["score"], atol=1e-5)


def test_kernel_layouts_translate_alike(translator, tokenizer):
    """Transposed kernels or Keras's (the CPU's choice by default, in the settings):
    the shared translator has the default, one more translator the other."""
    options = dict(extra_length=EXTRA_LENGTH, max_input_length=MAX_INPUT_LENGTH, beam_sizes=(4,))
    default = translator.settings()["transposed_kernels"]
    assert default is hardware.decoding_transposed_kernels()
    other = serving.Translator(translator.model, None, transposed_kernels=not default, **options)
    assert other.settings()["transposed_kernels"] is not default
    source = tokenizer.tokenize(tf.constant(SENTENCES)).to_tensor()
    ours, theirs = translator.translate_ids(source), other.translate_ids(source)
    np.testing.assert_array_equal(ours["ids"], theirs["ids"])
    np.testing.assert_allclose(ours["score"], theirs["score"], atol=1e-5)


@pytest.fixture(scope="module")
def one_and_three_searches(model):
    """Translators that run a request as one search, and as up to 3 side by side."""
    options = dict(extra_length=EXTRA_LENGTH, max_input_length=MAX_INPUT_LENGTH, beam_sizes=(4,))
    return (serving.Translator(model, None, parallel_searches=1, **options),
            serving.Translator(model, None, parallel_searches=3, **options))


@pytest.mark.parametrize("sentences", [1, 2, 5])
def test_searches_side_by_side_translate_as_one(one_and_three_searches, tokenizer, sentences):
    """A request split into up to 3 searches (shares of 1; 1 and 1; 2, 2 and 1
    sentences) translates as one search does, its ids padded to the longest."""
    one, split = one_and_three_searches
    texts = (SENTENCES * 5)[:sentences]
    # Lengths that differ, so the shares' outputs end at different steps.
    texts = [" ".join([text] * (1 + i % 3)) for i, text in enumerate(texts)]
    source = tokenizer.tokenize(tf.constant(texts)).to_tensor()
    assert split.settings()["parallel_searches"] == 3
    expected, outputs = one.translate_ids(source), split.translate_ids(source)
    np.testing.assert_array_equal(outputs["ids"], expected["ids"])
    np.testing.assert_allclose(outputs["score"], expected["score"], atol=1e-5)


def test_search_counts():
    from keras_transformer.serving_search import search_counts

    assert search_counts(1) == [1]
    assert search_counts(2) == [1, 2]
    assert search_counts(6) == [1, 2, 4, 6]
    assert search_counts(8) == [1, 2, 4, 8]


# The signatures -----------------------------------------------------------------


def test_translate_outputs(translator):
    outputs = translator.translate(tf.constant(SENTENCES))
    assert set(outputs) == {"translation", "score", "truncated"}
    assert outputs["translation"].dtype == tf.string and outputs["translation"].shape == (4,)
    assert outputs["score"].dtype == tf.float32 and outputs["score"].shape == (4,)
    assert all(_strings(outputs["translation"]))
    assert np.all(outputs["score"].numpy() < 0)


def test_defaults_are_the_translators_settings(translator):
    texts = tf.constant(SENTENCES[:2])
    implicit = translator.translate(texts)
    explicit = translator.translate(
        texts, beam_size=tf.constant(4), alpha=tf.constant(0.6),
        extra_length=tf.constant(EXTRA_LENGTH),
    )
    assert _strings(implicit["translation"]) == _strings(explicit["translation"])
    served = translator.serve(texts)
    assert _strings(served["translation"]) == _strings(implicit["translation"])


def test_text_signature_equals_ids_signature(translator, tokenizer):
    texts = tf.constant(SENTENCES)
    by_text = translator.translate(texts)
    by_ids = translator.translate_ids(tokenizer.tokenize(texts).to_tensor())
    assert by_ids["ids"].dtype == tf.int32
    ids = by_ids["ids"].numpy()
    assert not np.isin(ids, [BOS_ID, EOS_ID]).any()
    # Text has a first letter to follow: a sentence's capital is its translation's.
    assert [capitalized_like(source, text) for source, text in zip(
        SENTENCES, _strings(tokenizer.detokenize(ids)))] == _strings(by_text["translation"])
    np.testing.assert_allclose(by_ids["score"], by_text["score"], atol=1e-6)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_nbest(translator, beam_size):
    texts = tf.constant(SENTENCES[:3])
    nbest = translator.translate_nbest(texts, beam_size=tf.constant(beam_size))
    assert nbest["translations"].shape == (3, beam_size)
    scores = nbest["scores"].numpy()
    assert scores.shape == (3, beam_size)
    assert np.all(np.diff(scores, axis=1) <= 0), "best first"
    best = translator.translate(texts, beam_size=tf.constant(beam_size))
    assert _strings(nbest["translations"][:, 0]) == _strings(best["translation"])
    np.testing.assert_allclose(scores[:, 0], best["score"])


def test_beam_one_with_alpha_zero_is_greedy(translator, model, tokenizer):
    source = tokenizer.tokenize(tf.constant(SENTENCES)).to_tensor()[:, :MAX_INPUT_LENGTH]
    ids = translator.translate_ids(source, beam_size=tf.constant(1), alpha=tf.constant(0.0))
    lengths = tf.reduce_sum(tf.cast(source != 0, tf.int32), axis=1)
    cache = model.initial_cache(source, max_output_length=source.shape[1] + EXTRA_LENGTH)
    greedy, log_probs = decoding.greedy_search(
        lambda i, step, cache: model.decode_step(i[:, step], cache, step),
        tf.fill([source.shape[0]], BOS_ID), cache, max_output_length=source.shape[1] + EXTRA_LENGTH,
        eos_id=EOS_ID, max_output_lengths=lengths + EXTRA_LENGTH,
    )
    greedy = np.where(greedy.numpy() == EOS_ID, 0, greedy.numpy())[:, : ids["ids"].shape[1]]
    np.testing.assert_array_equal(ids["ids"], greedy)
    np.testing.assert_allclose(ids["score"], log_probs, atol=1e-5)


def test_output_length_is_bounded_by_input_length_plus_extra(translator, tokenizer):
    source = tokenizer.tokenize(tf.constant(SENTENCES)).to_tensor()
    lengths = np.sum(source.numpy() != 0, axis=1)
    for extra in (0, 3):
        ids = translator.translate_ids(source, extra_length=tf.constant(extra))["ids"].numpy()
        # At most input + extra tokens, the end-of-sequence token included.
        assert np.all(np.sum(ids != 0, axis=1) <= np.maximum(lengths + extra, 1))


def test_each_row_stops_at_its_own_output_limit(translator, tokenizer):
    """A row's limit is its own source length (truncated to max_input_length)
    plus extra_length, however long the other rows of the request. This random
    model ends no translation early (no EOS), so every row runs to its limit."""
    sentences = SENTENCES + ["Hi.", "And God saw."]
    source = tokenizer.tokenize(tf.constant(sentences)).to_tensor()
    lengths = np.minimum(np.sum(source.numpy() != 0, axis=1), MAX_INPUT_LENGTH)
    assert len(set(lengths)) > 1  # rows shorter than the longest
    for extra in (0, 3):
        ids = translator.translate_ids(source, extra_length=tf.constant(extra))["ids"].numpy()
        np.testing.assert_array_equal(np.sum(ids != 0, axis=1), lengths + extra)


def _repeats_an_ngram(row, size):
    tokens = [token for token in row if token != 0]
    grams = [tuple(tokens[i:i + size]) for i in range(len(tokens) - size + 1)]
    return len(set(grams)) < len(grams)


def test_a_request_may_block_repeated_ngrams(translator, tokenizer):
    """This random model repeats itself; a request with no_repeat_ngram_size n
    gets translations without a repeated n-gram, of the same lengths (it ends
    none early), and 0 is the default search."""
    source = tokenizer.tokenize(tf.constant(SENTENCES)).to_tensor()
    plain = translator.translate_ids(source, extra_length=tf.constant(6))["ids"].numpy()
    assert any(_repeats_an_ngram(row, 2) for row in plain)
    for size in (1, 2, 3):
        ids = translator.translate_ids(source, extra_length=tf.constant(6),
                                       no_repeat_ngram_size=tf.constant(size))["ids"].numpy()
        assert not any(_repeats_an_ngram(row, size) for row in ids), size
        np.testing.assert_array_equal(np.sum(ids != 0, axis=1), np.sum(plain != 0, axis=1))
    unblocked = translator.translate_ids(source, extra_length=tf.constant(6),
                                         no_repeat_ngram_size=tf.constant(0))["ids"].numpy()
    np.testing.assert_array_equal(unblocked, plain)


def _model_that_says(tokenizer, token):
    """A model that ranks `token` first at every step (its last norm gives that
    token's embedding whatever the input), the others as its random weights do."""
    model = make_model(tokenizer.vocab_size, seed=1, norm_first=True)
    model.decoder_norm.gamma.assign(tf.zeros_like(model.decoder_norm.gamma))
    model.decoder_norm.beta.assign(20.0 * model.embedding.embeddings[token])
    return model


@pytest.mark.parametrize("piece", ["\u2581the", "he"], ids=["word", "inside-a-word"])
def test_a_translator_may_block_runs_of_words_repeated_back_to_back(tokenizer, piece):
    """A model that ranks one piece first at every step (as the EOS test below)
    says it over and over; `block_adjacent_repeats` leaves no run of pieces that
    starts a word right after itself, no piece of letters inside a word three
    times in a row, and blocks nothing else: each token taken is the best one
    not blocked."""
    pieces = _strings(tokenizer.id_to_token(tf.range(tokenizer.vocab_size)))
    starts = np.char.startswith(pieces, "\u2581")
    letters = [text.isalpha() for text in pieces]
    word = pieces.index(piece)
    model = _model_that_says(tokenizer, word)
    options = dict(extra_length=EXTRA_LENGTH, max_input_length=MAX_INPUT_LENGTH,
                   beam_sizes=(1,), beam_size=1)
    source = tokenizer.tokenize(tf.constant(SENTENCES[1:2])).to_tensor()

    def stammers(tokens):
        return [(i, m) for m in range(1, 9) for i in range(len(tokens) - 2 * m + 1)
                if tokens[i:i + m] == tokens[i + m:i + 2 * m] and starts[tokens[i]]] + [
            (i, 3) for i in range(len(tokens) - 2)
            if tokens[i] == tokens[i + 1] == tokens[i + 2] and letters[tokens[i]]]

    plain = serving.Translator(model, tokenizer, **options).translate_ids(source)["ids"][0]
    assert set(plain.numpy()) == {word}  # "the the the ..."
    blocking = serving.Translator(model, tokenizer, block_adjacent_repeats=True, **options)
    assert blocking.settings()["block_adjacent_repeats"] is True
    tokens = [int(t) for t in blocking.translate_ids(source)["ids"][0] if t != 0]
    assert len(tokens) > 4 and not stammers(tokens)
    # Greedy: each token the model's best among those that repeat nothing.
    cache = model.initial_cache(source, max_output_length=len(tokens) + 1)
    prefix = [BOS_ID]
    for step, token in enumerate(tokens):
        logits, cache = model.decode_step(tf.constant(prefix[-1:]), cache, tf.constant(step))
        ranked = np.argsort(-logits.numpy()[0], kind="stable")
        allowed = [t for t in ranked if t != EOS_ID and not stammers(prefix[1:] + [int(t)])]
        assert token == allowed[0], (step, prefix)
        prefix.append(token)
    with pytest.raises(ValueError, match="block_adjacent_repeats needs the tokenizer"):
        serving.Translator(model, None, block_adjacent_repeats=True)


@pytest.mark.parametrize("jit_compile", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["graph", "xla"])
def test_a_model_that_ranks_eos_first_still_says_something(tokenizer, jit_compile):
    """An empty translation tells a user nothing: the quickstart's model ranked
    EOS first for "Good morning". Here a model ranks it first at every step
    (its last norm gives the EOS embedding whatever the input): the best
    translation is its best other token, then EOS, scored from the same logits
    at both steps (the other tokens keep their probabilities)."""
    model = make_model(tokenizer.vocab_size, seed=1, norm_first=True)
    eos_row = model.embedding.embeddings[EOS_ID]
    model.decoder_norm.gamma.assign(tf.zeros_like(model.decoder_norm.gamma))
    model.decoder_norm.beta.assign(20.0 * eos_row)
    log_probs = tf.nn.log_softmax(20.0 * tf.linalg.matvec(model.embedding.embeddings,
                                                          eos_row)).numpy()  # (V,)
    assert log_probs.argmax() == EOS_ID and log_probs[EOS_ID] > -1e-3
    first = np.delete(log_probs, EOS_ID).argmax()  # EOS_ID > 0: index shifts only after it
    first += first >= EOS_ID
    translator = serving.Translator(model, tokenizer, DecodingConfig(
        extra_length=EXTRA_LENGTH, max_input_length=MAX_INPUT_LENGTH, beam_sizes=(1, 4),
        jit_compile=jit_compile))
    texts = tf.constant(["Good morning", "Hello.", SENTENCES[0]])
    expected = (log_probs[first] + log_probs[EOS_ID]) / decoding.length_penalty(2, 0.6)
    for beam_size in (1, 4):
        ids = translator.translate_ids(tokenizer.tokenize(texts).to_tensor(),
                                       beam_size=tf.constant(beam_size))
        np.testing.assert_array_equal(ids["ids"], [[first]] * 3)  # EOS and padding left out
        np.testing.assert_allclose(ids["score"], [expected] * 3, rtol=1e-5)
    assert all(_strings(translator.translate(texts)["translation"]))


# Bad input is answered, not crashed on -------------------------------------------


def test_empty_and_whitespace_strings_translate_to_empty(translator):
    outputs = translator.translate(tf.constant(["", "   ", "\t \n", SENTENCES[0]]))
    assert _strings(outputs["translation"])[:3] == ["", "", ""]
    assert _strings(outputs["translation"])[3] != ""
    np.testing.assert_array_equal(outputs["score"][:3], [0.0, 0.0, 0.0])
    nbest = translator.translate_nbest(tf.constant(["", SENTENCES[0]]))
    assert _strings(nbest["translations"][0]) == ["", "", "", ""]
    assert nbest["scores"][0, 0] == 0.0 and np.all(np.isneginf(nbest["scores"][0, 1:]))
    ids = translator.translate_ids(tf.constant([[0, 0], [5, 6]], tf.int32))
    assert not ids["ids"].numpy()[0].any() and ids["score"][0] == 0.0


def test_invalid_utf8_is_replaced(translator):
    outputs = translator.translate(tf.constant([BAD_UTF8, "God \ufffd\ufffd said"]))
    translations = _strings(outputs["translation"])
    assert translations[0] == translations[1] != ""
    np.testing.assert_allclose(outputs["score"][0], outputs["score"][1], rtol=1e-6)


def test_decomposed_accents_and_invisible_characters_translate_as_plain_text(translator):
    # "Jérusalem" with e + U+0301 (as macOS writes it), and a file's byte order
    # mark: the vocabulary's NFC rules make both the plain sentence.
    plain = "And God said to Jérusalem, Let there be light."
    # And text copied from a web page: zero-width spaces, a soft hyphen, a
    # direction mark.
    copied = "\u200fAnd\u200b God said to Jéru\u00adsalem,\u200b Let there be light."
    written = [unicodedata.normalize("NFD", plain), "\ufeff" + plain, copied, plain]
    assert written[0] != plain
    outputs = translator.translate(tf.constant(written))
    translations = _strings(outputs["translation"])
    assert translations[:3] == [translations[3]] * 3 and translations[3] != ""
    np.testing.assert_allclose(outputs["score"], [outputs["score"][3]] * 4, rtol=1e-6)


def test_sentences_without_telling_capitals_translate_in_their_words_usual_case(
        translator, tokenizer):
    # What the model says to each sentence as written: its ids, searched.
    def as_written(texts):
        ids = translator.translate_ids(tokenizer.tokenize(tf.constant(texts)).to_tensor())
        return _strings(tokenizer.detokenize(ids["ids"])), ids["score"].numpy()

    spellings = tokenizer.casing.spellings
    requests = ["IN THE BEGINNING, GOD CREATED THE HEAVENS.", "  \"WHY?\"  SAID\tGOD ",
                SENTENCES[1], "NOAH", "I", "In The Beginning God Created",
                "and god said, let there be light.", "god"]
    recased = [True, True, False, True, False, True, True, True]
    searched = [restored_case(" ".join(text.split()), spellings) if recase else text
                for text, recase in zip(requests, recased)] + ["God \ufffd\ufffd said"]
    assert searched[0] == "In the beginning, God created the heavens."
    assert searched[6] == "And God said, let there be light." and searched[7] == "God"
    capitals = [True, True, False, True, False, False, False, False, False]  # answered so
    requests = [text.encode() for text in requests] + [BAD_UTF8]
    outputs = translator.translate(tf.constant(requests))
    expected, scores = as_written(searched)
    expected = [capitalized_like(source, text) for source, text in zip(
        _strings(serving_text._cleaned(tf.constant(requests))), expected)]
    expected = [text.upper() if upper else text for text, upper in zip(expected, capitals)]
    assert _strings(outputs["translation"]) == expected
    np.testing.assert_allclose(outputs["score"], scores, rtol=1e-5)
    # Searched as written, the capitals and the small letters get other answers.
    raw, _ = as_written([requests[0], requests[1], requests[6]])
    assert raw[:2] != [text.upper() for text in expected[:2]] and raw[0] != expected[0]
    assert raw[2] != expected[6]
    nbest = translator.translate_nbest(tf.constant(requests[:3]))["translations"]
    best = _strings(nbest[:, 0])
    assert best == expected[:3]
    assert all(text == text.upper() for text in _strings(nbest[:2, 1:]))
    aligned = translator.translate_aligned(tf.constant(requests[:3]))
    assert _strings(aligned["translation"]) == expected[:3]
    # Scoring recases source and target alike.
    scored = translator.score(tf.constant(requests[:1]), tf.constant(["EN EL PRINCIPIO."]))
    reference = translator.score(tf.constant(searched[:1]), tf.constant(
        [restored_case("EN EL PRINCIPIO.", spellings)]))
    np.testing.assert_allclose(scored["log_prob"], reference["log_prob"], rtol=1e-5)


def test_a_translation_starts_with_a_capital_where_its_sentence_does(tokenizer):
    """A model trained on clauses too answered "Love your neighbor as
    yourself." with "y tu prójimo como tu prójimo.": where the translator
    recases capitals, a sentence's first capital letter gives its translation
    one (after quotes, "¿", digits), a small one leaves it be. Here a model that
    says "the" over and over, and the Python twin."""
    texts = ["y tu prójimo.", "¿no teme.", "á la ciudad", "“é”", "123", "", "Ya bien", "ñu",
             "3 hombres", "東京 tokyo", "σοφία", "ǆungla", "- y él"]
    capitalized = _strings(serving_text._capitalized(tf.constant(texts)))
    assert capitalized == [capitalized_like("A", text) for text in texts]
    assert capitalized[:3] == ["Y tu prójimo.", "¿No teme.", "Á la ciudad"]
    model = _model_that_says(tokenizer, _strings(tokenizer.id_to_token(
        tf.range(tokenizer.vocab_size))).index("\u2581the"))
    options = dict(extra_length=EXTRA_LENGTH, max_input_length=MAX_INPUT_LENGTH,
                   beam_sizes=(1,), beam_size=1)
    sources = ["Jesus wept.", "“Who?” he said to Moses.", "3 Men came", "and he said to Moses"]
    plain = _strings(serving.Translator(model, tokenizer, recase_capitals=False, **options)
                     .translate(tf.constant(sources))["translation"])
    assert all(text.startswith("the the") for text in plain)
    recased = _strings(serving.Translator(model, tokenizer, **options)
                       .translate(tf.constant(sources))["translation"])
    assert recased == [capitalized_like(source, text) for source, text in zip(sources, plain)]
    assert [text[:3] for text in recased] == ["The", "The", "The", "the"]


def test_title_case_equals_python_string_methods():
    texts = ["And God Said, Let There Be Light.", "Jesus Wept.", "The Lord of the Rings",
             "“Don’t Be Afraid, Abram”", "AND GOD SAID", "Él Dijo: Así Sea", "1 Kings 2 Kings 3",
             "Ωμέγα Άλφα Βήτα Γάμμα", "東京 Tokyo Osaka Kyoto", "", "In  The   Beginning  God",
             "Hadoram, Uzal, Diklah,"]
    texts = _strings(serving_text._cleaned(tf.constant(texts)))
    title = serving_text._title_case(tf.constant(texts)).numpy().tolist()
    for text, is_title in zip(texts, title):
        words = text.split(" ")
        assert is_title == (sum(word[:1].isupper() for word in words) >= 4
                            and not any(word[:1].islower() for word in words)
                            and any(c.islower() for c in text)), text
    assert title == [True, False, False, False, False, True, False, True, False, False, True,
                     False]


def test_capitals_only_and_small_letters_only_equal_python_string_methods():
    texts = ["AND GOD SAID, LET THERE BE LIGHT.", "«ÉTÉ À L'ÎLE», DIT-IL", "NASA", "42 B.C.",
             "I", "Jesus wept.", "东京 TOKYO", "東京", "ΑΘΗΝΑ Ω", "", "ǅ", "1 2 3", "ÀB",
             "and god said.", "东京 tokyo", "ǆ x", "ǅx", "école"]
    caps = serving_text._all_caps(tf.constant(texts)).numpy().tolist()
    small = tf.strings.regex_full_match(texts, serving_text.SMALL_LETTERS).numpy().tolist()
    for text, is_caps, is_small in zip(texts, caps, small):
        letters = [c for c in text if c.isalpha()]
        cased_letters = [c for c in letters if c.upper() != c.lower()]
        assert is_caps == (len([c for c in letters if c.isupper()]) >= 2
                           and not any(c.islower() for c in cased_letters)), text
        assert is_small == (any(c.islower() for c in letters)
                            and not any(c.isupper() or c.istitle() for c in letters)), text
    assert small == [False] * 13 + [True, True, True, False, True]


def test_invisible_characters_are_dropped_and_whitespace_is_one_space():
    """Every control and format character, and every whitespace character
    (Python's `str.isspace`), between two letters: whitespace gives one space,
    control characters and the invisible format characters vanish, and the
    format characters that spell (zero-width joiners, Arabic number signs,
    emoji tags) stay."""
    spelling = {"\u200c", "\u200d"}
    characters = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000
                  and (unicodedata.category(chr(c)) in ("Cc", "Cf") or chr(c).isspace())]
    texts = [f"a{c}b" for c in characters] + ["  x \u200b\t\u00ad y\x00  ", "\u200e\ufeff"]
    cleaned = _strings(serving_text._cleaned(tf.constant(texts)))
    dropped = set()
    for char, text in zip(characters, cleaned):
        if char.isspace():
            assert text == "a b", repr(char)
        elif unicodedata.category(char) == "Cc":
            assert text == "ab", repr(char)
        elif text == "ab":
            dropped.add(char)
        else:
            assert text == f"a{char}b", repr(char)
    assert cleaned[-2:] == ["x y", ""]
    assert {"\u00ad", "\u200b", "\u200e", "\u200f", "\u202e", "\u2060", "\u2066",
            "\ufeff"} <= dropped
    assert not dropped & spelling and {"\u0600", "\U000e0067"}.isdisjoint(dropped)


def test_a_source_longer_than_max_input_length_is_translated_from_its_first_pieces(
        translator, tokenizer):
    """A source of more than max_input_length pieces is translated as its first
    max_input_length pieces alone are, and each search signature's `truncated`
    says which were: a paragraph on one line had lost its end without a word."""
    texts = SENTENCES + ["Hi.", " ".join(SENTENCES * 3), "And God saw."]
    tokens = tokenizer.tokenize(tf.constant(texts))
    lengths = tokens.row_lengths().numpy()
    assert min(lengths) <= MAX_INPUT_LENGTH < max(lengths)  # both kinds
    cut = tokens[:, :MAX_INPUT_LENGTH].to_tensor()
    expected = lengths > MAX_INPUT_LENGTH
    first_pieces = translator.translate_ids(cut)
    np.testing.assert_array_equal(first_pieces["truncated"], np.zeros(len(texts), bool))
    whole = translator.translate_ids(tokens.to_tensor())
    np.testing.assert_array_equal(whole["ids"], first_pieces["ids"])
    np.testing.assert_array_equal(whole["score"], first_pieces["score"])
    np.testing.assert_array_equal(whole["truncated"], expected)
    by_text = translator.translate(tf.constant(texts))
    assert _strings(by_text["translation"]) == [
        capitalized_like(source, text)
        for source, text in zip(texts, _strings(tokenizer.detokenize(first_pieces["ids"])))]
    for signature in (translator.translate, translator.translate_nbest,
                      translator.translate_aligned):
        truncated = signature(tf.constant(texts))["truncated"]
        assert truncated.dtype == tf.bool
        np.testing.assert_array_equal(truncated, expected)


def test_empty_batch(translator):
    outputs = translator.translate(tf.constant([], tf.string))
    assert outputs["translation"].shape == (0,) and outputs["score"].shape == (0,)
    nbest = translator.translate_nbest(tf.constant([], tf.string))
    assert nbest["translations"].shape[0] == 0
    ids = translator.translate_ids(tf.zeros([0, 5], tf.int32))
    assert ids["ids"].shape[0] == 0 and ids["score"].shape == (0,)
    assert outputs["truncated"].shape == (0,) and ids["truncated"].shape == (0,)


@pytest.mark.parametrize(
    "knobs, message",
    [
        (dict(beam_size=3), "beam_size must be one of [1, 4]"),
        (dict(extra_length=-1), "extra_length must be >= 0"),
        (dict(alpha=float("nan")), "alpha must be finite"),
        (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size must be >= 0"),
    ],
)
def test_bad_knobs_are_answered_with_an_error(translator, knobs, message):
    dtypes = dict(beam_size=tf.int32, extra_length=tf.int32, alpha=tf.float32,
                  no_repeat_ngram_size=tf.int32)
    knobs = {name: tf.constant(value, dtypes[name]) for name, value in knobs.items()}
    with pytest.raises(tf.errors.InvalidArgumentError, match=message.replace("[", r"\[")):
        translator.translate(tf.constant(SENTENCES[:1]), **knobs)


def test_request_limits_admit_exactly_their_value(model, tokenizer):
    """max_batch_size sentences and max_input_chars characters pass; one more is refused."""
    limited = serving.Translator(model, tokenizer, extra_length=2, beam_size=1, beam_sizes=(1,),
                                 max_batch_size=3, max_input_chars=12)
    at_the_limits = ["é" * 12, "Hi.", "Ok."]  # 24 bytes: characters count, not bytes
    assert len(_strings(limited.translate(tf.constant(at_the_limits))["translation"])) == 3
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_batch_size=3"):
        limited.translate(tf.constant([*at_the_limits, "Hi."]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_input_chars=12"):
        limited.translate(tf.constant(["é" * 13]))
    assert limited.translate_ids(tf.constant([[5, 6]] * 3))["ids"].shape[0] == 3
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_batch_size=3"):
        limited.translate_ids(tf.constant([[5, 6]] * 4))


def test_ids_outside_the_vocabulary_are_answered_with_an_error(translator, tokenizer):
    with pytest.raises(tf.errors.InvalidArgumentError, match="ids must be < vocab_size"):
        translator.translate_ids(tf.constant([[tokenizer.vocab_size]], tf.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="ids must be >= 0"):
        translator.translate_ids(tf.constant([[-1]], tf.int32))


def test_the_config_is_taken_whole_and_recorded(model, tokenizer, translator):
    """`Translator(model, tokenizer, config)`; field names replace the config's;
    `settings()` (an export's config.json) reads back as the resolved config."""
    config = DecodingConfig(beam_sizes=(1, 2), beam_size=2, alpha=1.0, max_batch_size=8)
    configured = serving.Translator(model, None, config, extra_length=3)
    assert configured.config == dataclasses.replace(
        config, extra_length=3, max_input_length=model.config.max_positions,
        max_output_length=model.config.max_positions + 3, precision=model.precision,
        transposed_kernels=hardware.decoding_transposed_kernels(),
        parallel_searches=hardware.decoding_parallel_searches(False),
        recase_capitals=False)  # ids-only: no text to recase
    assert DecodingConfig.from_dict(configured.settings()) == configured.config
    assert DecodingConfig.from_dict(translator.settings()) == translator.config
    assert translator.settings()["jit_compile"] is False
    with pytest.raises(TypeError, match="config must be a DecodingConfig"):
        serving.Translator(model, tokenizer, 4)


def test_constructor_checks_its_arguments(model, tokenizer):
    with pytest.raises(ValueError, match="beam_size must be one of"):
        serving.Translator(model, tokenizer, beam_size=3)
    with pytest.raises(ValueError, match="extra_length must be an int >= 0"):
        serving.Translator(model, tokenizer, extra_length=-1)
    with pytest.raises(ValueError, match="XLA cannot compile"):
        serving.Translator(model, tokenizer, jit_compile=True, use_cache=False)
    with pytest.raises(ValueError, match="learned decoder positions"):
        serving.Translator(make_model(tokenizer.vocab_size, positional_encoding="learned"),
                           tokenizer, max_output_length=65)


def test_concurrent_requests_translate_as_one_at_a_time(translator):
    """A model server runs requests side by side; each search overwrites only the
    cache buffers it made, so threads get what sequential calls get."""
    from concurrent.futures import ThreadPoolExecutor

    requests = [SENTENCES[i:] + SENTENCES[:i] for i in range(4)] * 2
    expected = [translator.translate(tf.constant(r)) for r in requests]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda r: translator.translate(tf.constant(r)), requests))
    for result, reference in zip(results, expected):
        assert _strings(result["translation"]) == _strings(reference["translation"])
        np.testing.assert_array_equal(result["score"], reference["score"])


def test_graph_search_compiles_nothing_on_demand(translator):
    """Without XLA, the search writes its caches in place and its slot table with a
    select: no op that TensorFlow runs through an XLA kernel compiled for each new
    request shape (`XlaDynamicUpdateSlice`, which `ops.slice_update` makes)."""
    graph = translator.translate_ids.get_concrete_function().graph
    op_types = {op.type for op in graph.get_operations()} | {
        node.op for function in graph.as_graph_def().library.function
        for node in function.node_def}
    assert "InplaceUpdate" in op_types and "Empty" in op_types
    assert not {op for op in op_types if op.startswith("Xla")}


@pytest.mark.slow
def test_xla_search_equals_graph_search(model, tokenizer, translator):
    compiled = serving.Translator(
        model, tokenizer, extra_length=EXTRA_LENGTH, max_input_length=MAX_INPUT_LENGTH,
        beam_sizes=(4,), jit_compile=True,
    )
    texts = tf.constant(SENTENCES[:3])  # padded to a batch of 4 inside
    for size in (0, 2):
        knobs = dict(no_repeat_ngram_size=tf.constant(size))
        fast, reference = compiled.translate(texts, **knobs), translator.translate(texts, **knobs)
        assert _strings(fast["translation"]) == _strings(reference["translation"])
        np.testing.assert_allclose(fast["score"], reference["score"], atol=1e-4)


@pytest.mark.slow
def test_xla_search_blocks_adjacent_repeats_as_the_graph_does(tokenizer):
    """The model says "the" over and over; both searches block it alike."""
    word = _strings(tokenizer.id_to_token(tf.range(tokenizer.vocab_size))).index("\u2581the")
    model = _model_that_says(tokenizer, word)
    # With the same logits at every step, two hypotheses of the same tokens in
    # another order tie exactly, and the two searches' float sums broke such a tie
    # apart (an AVX2-only AMD EPYC, 2026-12-03: "... the a\x08 the" against "... the
    # a the\x1f"). A little of its input in the last norm tells them apart; it still
    # ranks "the" first (the unblocked search below says nothing else).
    model.decoder_norm.gamma.assign(tf.fill(model.decoder_norm.gamma.shape, 0.05))
    options = dict(extra_length=EXTRA_LENGTH, max_input_length=MAX_INPUT_LENGTH,
                   beam_sizes=(4,), block_adjacent_repeats=True)
    graph = serving.Translator(model, tokenizer, **options)
    compiled = serving.Translator(model, tokenizer, jit_compile=True, **options)
    texts = tf.constant(SENTENCES[:3])
    unblocked = serving.Translator(model, tokenizer, extra_length=EXTRA_LENGTH,
                                   max_input_length=MAX_INPUT_LENGTH, beam_sizes=(1,),
                                   beam_size=1, recase_capitals=False)
    assert all(set(text.split()) == {"the"}
               for text in _strings(unblocked.translate(texts)["translation"]))
    for size in (0, 2):
        knobs = dict(no_repeat_ngram_size=tf.constant(size))
        fast, reference = compiled.translate(texts, **knobs), graph.translate(texts, **knobs)
        assert _strings(fast["translation"]) == _strings(reference["translation"])
        assert all(" the the " not in f" {text} " for text in _strings(fast["translation"]))
        np.testing.assert_allclose(fast["score"], reference["score"], atol=1e-4)


def test_small_requests_run_xla_and_larger_ones_the_graph(model, tokenizer, translator):
    """`xla_max_batch_size=1`: one sentence through the XLA search, more through
    the graph's; both translate as the graph-only translator does."""
    hybrid = serving.Translator(
        model, tokenizer, extra_length=EXTRA_LENGTH, max_input_length=MAX_INPUT_LENGTH,
        beam_sizes=(4,), jit_compile=True, xla_max_batch_size=1)
    assert hybrid.shapes.batch_sizes == (1,) and hybrid.settings()["xla_max_batch_size"] == 1
    assert hybrid.shapes.xla_small_requests_only
    assert not translator.shapes.xla_small_requests_only
    graph = hybrid.translate.get_concrete_function().graph
    nodes = [node for function in graph.as_graph_def().library.function
             for node in function.node_def]
    assert any(node.attr["_XlaMustCompile"].b for node in nodes)  # the small requests'
    assert "InplaceUpdate" in {node.op for node in nodes}  # the larger ones' (graph)
    for texts in (SENTENCES[:1], SENTENCES[:3], []):
        texts = tf.constant(texts, tf.string)
        ours, reference = hybrid.translate(texts), translator.translate(texts)
        assert _strings(ours["translation"]) == _strings(reference["translation"])
        np.testing.assert_allclose(ours["score"], reference["score"], atol=1e-4)
    assert serving.Translator(model, tokenizer).shapes.xla_max_batch_size == 0
    for wrong in (dict(xla_max_batch_size=1), dict(jit_compile=True, xla_max_batch_size=300)):
        with pytest.raises(ValueError, match="xla_max_batch_size needs jit_compile on"):
            serving.Translator(model, tokenizer, **wrong)


# Scoring and alignments ------------------------------------------------------------


def teacher_forced_log_probs(model, tokenizer, sources, targets):
    """Per-piece log P (target pieces, then EOS) from the model's own functional
    call on padded, truncated ids, in numpy."""
    source = tokenizer.tokenize(tf.constant(sources))[:, :MAX_INPUT_LENGTH].to_tensor().numpy()
    rows = [row for row in tokenizer.tokenize(tf.constant(targets)).to_list()]
    length = max(len(row) for row in rows) + 1
    decoder_inputs = np.zeros((len(rows), length), "int32")
    predicted = np.zeros((len(rows), length), "int32")
    for i, row in enumerate(rows):
        decoder_inputs[i, :len(row) + 1] = [BOS_ID] + row
        predicted[i, :len(row) + 1] = row + [EOS_ID]
    logits = model({"encoder_inputs": source, "decoder_inputs": decoder_inputs},
                   training=False).numpy().astype("float64")
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_probs, predicted[..., None], -1)[..., 0]
    return np.where(predicted != 0, picked, 0.0), source, decoder_inputs


def test_score_is_the_teacher_forced_log_probability(translator, model, tokenizer):
    from keras_transformer import visualize

    sources = [SENTENCES[0], SENTENCES[1] + " " + SENTENCES[0], SENTENCES[2]]
    targets = ["En el principio.", "Y lloró Jesús.", ""]
    outputs = translator.score(tf.constant(sources), tf.constant(targets))
    expected, source, decoder_inputs = teacher_forced_log_probs(model, tokenizer, sources,
                                                                targets)
    token_log_probs = outputs["token_log_probs"].numpy()
    np.testing.assert_allclose(token_log_probs[:, :expected.shape[1]], expected, atol=1e-5)
    np.testing.assert_allclose(outputs["log_prob"], expected.sum(axis=1), rtol=1e-5)
    assert _strings(outputs["target_tokens"][2][:1]) == ["</s>"]  # "" is just the end
    # The alignment: argmax over the source of the last layer's cross-attention,
    # averaged over heads, from the decoder pass visualize.py draws.
    weights = visualize.decoder_attention(model, source, decoder_inputs)[1][-1]
    attention = weights["cross_attention"].numpy().mean(axis=1)  # (B, T, S)
    real = expected != 0
    alignment = outputs["alignment"].numpy()[:, :expected.shape[1]]
    np.testing.assert_array_equal(alignment[real], attention.argmax(-1)[real])
    assert (alignment[~real] == -1).all()
    pieces = outputs["source_tokens"].numpy()
    assert all(b"" != pieces[row, index] for row, index in zip(*np.nonzero(real))
               for index in [alignment[row, index]])


def test_translate_aligned_aligns_the_best_translation(translator, model, tokenizer):
    """Its alignment is the teacher-forced one of the best translation's own pieces:
    for each, the argmax over the source of the last layer's cross-attention averaged
    over heads (score's, checked above against the same reference), not another
    beam's, nor shifted by a piece."""
    import sentencepiece

    from keras_transformer import visualize

    texts = tf.constant(SENTENCES[:3] + [""])
    aligned = translator.translate_aligned(texts)
    plain = translator.translate(texts)
    assert _strings(aligned["translation"]) == _strings(plain["translation"])
    np.testing.assert_allclose(aligned["score"], plain["score"], atol=1e-5)
    processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model_proto)
    source = tokenizer.tokenize(texts[:3])[:, :MAX_INPUT_LENGTH].to_tensor().numpy()
    for row in range(3):
        # The pieces, EOS last unless the length limit cut the translation.
        pieces = [p for p in _strings(aligned["target_tokens"][row]) if p]
        assert pieces[-1] == "</s>" or len(pieces) == aligned["alignment"].shape[1]
        decoder_inputs = np.array([[BOS_ID] + [processor.piece_to_id(p) for p in pieces
                                                if p != "</s>"]], "int32")
        weights = visualize.decoder_attention(model, source[row:row + 1], decoder_inputs)
        expected = weights[1][-1]["cross_attention"].numpy().mean(axis=1)[0].argmax(-1)
        np.testing.assert_array_equal(aligned["alignment"][row].numpy()[:len(pieces)],
                                      expected[:len(pieces)])
