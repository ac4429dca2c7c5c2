"""data.Casing: the usual case of a corpus's words, learned and put back."""

import gzip
import os

import pytest
import tensorflow as tf

from keras_transformer import data
from keras_transformer.data import casing as casing_module
from tests.reference import restored_case

BUNDLED = os.path.dirname(casing_module.__file__) + "/bundled"


def _strings(tensor):
    return [text.decode("utf-8") for text in tensor.numpy().tolist()]


def test_learn_counts_each_word_where_its_case_is_free():
    sentences = [
        "In the beginning God created.",
        "And God said, “Behold, the light.” Then God saw.",  # Behold, Then: forced
        "So god’s word came to God’s people.",
        "AND THE LORD SAID UNTO THE BANK",  # capitals only: says nothing
        "The Lord spoke once.",  # Lord: once, under min_count
        "I went to the Bank and to the bank; then the Bank, the bank.",  # a tie: small
        "— And then god spoke.",  # And: the first word with letters
        "And then god spoke.",
    ]
    # God 3 times where free (created, said, saw), god twice ("then god spoke"):
    # God. Behold, Then, And, I: forced. God’s and god’s once each, Bank and
    # bank twice each: ties, small. Lord: once.
    assert data.Casing.learn(sentences).spellings == {"god": "God"}
    assert data.Casing.learn(sentences, min_count=1).spellings == {"god": "God", "lord": "Lord"}
    # The most frequent words first, up to max_words.
    assert data.Casing.learn(sentences, min_count=1, max_words=1).spellings == {"god": "God"}


def test_learn_takes_the_spelling_seen_most_and_the_letters_inside_punctuation():
    sentences = ["He went to McDonald’s, McDonald’s and mcdonald’s again."] * 2 + \
                ["Then “Jesus,” he said (Jesus) “to” Jesus!"] * 2
    assert data.Casing.learn(sentences).spellings == {"mcdonald’s": "McDonald’s",
                                                      "jesus": "Jesus"}


def test_restore_equals_its_python_twin():
    spellings = {"god": "God", "yahweh’s": "Yahweh’s", "mcdonald": "McDonald", "i": "I",
                 "école": "École", "αθήνα": "Αθήνα"}
    casing = data.Casing(spellings)
    texts = ["and god said, let there be light.", "AND GOD SAID. LET THERE BE LIGHT!",
             "In The Beginning God Created", "he said, “behold, yahweh’s word.” then i went",
             "¿qué dijo dios? ¡la luz!", "— and then mcdonald (god) spoke... «oui»",
             "il est à l’école", "αθήνα είναι", "东京 tokyo", "", "42", "... ?", "a",
             "god-fearing god", "i.e. i am", "e\u0301cole", "1. first 2. second"]
    assert _strings(casing.restore(tf.constant(texts))) == [
        restored_case(text, spellings) for text in texts]
    assert _strings(casing.restore(tf.constant(texts[:4]))) == [
        "And God said, let there be light.", "And God said. Let there be light!",
        "In the beginning God created", "He said, “Behold, Yahweh’s word.” Then I went"]
    # An empty table puts capitals at sentence starts only; an empty batch is one.
    assert _strings(data.Casing().restore(tf.constant(texts[:1]))) == [
        "And god said, let there be light."]
    assert casing.restore(tf.constant([], tf.string)).shape == (0,)


def test_the_bundled_corpus_gets_its_capitals_back():
    """Learned from the bundled training text, the casing gives the test
    sentences written in small letters their words’ capitals back: 98.6% of
    English words and 98.1% of Spanish ones (against 92.7% and 92.4% with
    capitals at sentence starts only), as the twin does."""
    def read(split):
        with gzip.open(f"{BUNDLED}/{split}.tsv.gz", "rt", encoding="utf-8") as f:
            return [line.rstrip("\n").split("\t") for line in f]

    train = read("train")
    casing = data.Casing.learn([text for pair in train for text in pair])
    test = read("test")
    for side, least in ((0, 0.985), (1, 0.975)):
        written = [pair[side] for pair in test]
        restored = _strings(casing.restore(tf.constant([text.lower() for text in written])))
        assert restored == [restored_case(text.lower(), casing.spellings) for text in written]
        pairs = [(a, b) for text, back in zip(written, restored)
                 for a, b in zip(text.split(), back.split())]
        assert sum(a == b for a, b in pairs) / len(pairs) >= least


def test_a_text_in_small_letters_gets_no_capitals():
    """A corpus in small letters (lowercased, or a made-up language) starts no
    sentence with a capital: a model trained on it has never seen one, and a
    request in small letters is searched as written."""
    sentences = ["and so it was.", "he said: “behold, x.” then y.", "— z said", "东京 is far",
                 "AND THE LORD SAID"]  # capitals only: say nothing
    casing = data.Casing.learn(sentences)
    assert (casing.spellings, casing.sentence_starts) == ({}, False)
    texts = ["and god said. let there be light!", "“behold,” he said", "AND GOD SAID"]
    restored = _strings(casing.restore(tf.constant(texts)))
    assert restored == ["and god said. let there be light!", "“behold,” he said", "and god said"]
    assert restored == [restored_case(text, {}, sentence_starts=False) for text in texts]
    assert data.Casing.learn(["And so.", "and so", "So it was."]).sentence_starts
    assert not data.Casing.learn(["And so.", "and so", "so it was."]).sentence_starts


def test_save_and_load_round_trip_and_refuse_a_broken_file(tmp_path):
    casing = data.Casing({"god": "God", "mcdonald": "McDonald"}, sentence_starts=False)
    casing.save(tmp_path / "casing.json")
    loaded = data.Casing.load(tmp_path / "casing.json")
    assert (loaded.spellings, loaded.sentence_starts) == (casing.spellings, False)
    assert list(loaded.spellings) == ["god", "mcdonald"]  # the order kept
    for name, text in (("cut.json", '{"sentence_starts": true, "spellings": {"god": "Go'),
                       ("keys.json", '{"spellings": {}}'),
                       ("other.json", '{"sentence_starts": true, "spellings": {"god": "Lord"}}'),
                       ("flag.json", '{"sentence_starts": 1, "spellings": {}}')):
        (tmp_path / name).write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=rf"{name} is not a casing written by Casing.save"):
            data.Casing.load(tmp_path / name)


def test_tokenizer_learns_saves_and_loads_its_casing(tmp_path):
    pairs = data.load_parallel("bundled", "dev").take(300)
    tokenizer = data.SubwordTokenizer.train(pairs, vocab_size=400)
    assert tokenizer.casing.spellings["god"] == "God" and "dios" in tokenizer.casing.spellings
    tokenizer.save(tmp_path / "vocab")
    loaded = data.SubwordTokenizer.load(tmp_path / "vocab")
    assert loaded.casing.spellings == tokenizer.casing.spellings
    assert loaded.casing.sentence_starts
    # A vocabulary saved before the casing: none, and capitals at sentence starts only.
    (tmp_path / "vocab" / "casing.json").unlink()
    config = (tmp_path / "vocab" / "tokenizer.json").read_text()
    (tmp_path / "vocab" / "tokenizer.json").write_text(
        config.replace('"casing_file": "casing.json",', ""))
    old = data.SubwordTokenizer.load(tmp_path / "vocab").casing
    assert (len(old), old.sentence_starts) == (0, True)
