import io
import os
import unicodedata

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from keras_transformer import data
from keras_transformer.data import tokenizer as tokenizer_module

SENTENCES = [
    "In the beginning, God created the heavens and the earth.",
    "Y dijo Dios: Sea la luz: y fué la luz.",
]


def test_reserved_ids_and_attributes(tokenizer):
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    assert (data.PAD_ID, data.UNK_ID, data.BOS_ID, data.EOS_ID) == (0, 1, 2, 3)
    assert tokenizer.vocab_size == 1000
    pieces = tokenizer.id_to_token(tf.constant([0, 1, 2, 3])).numpy().tolist()
    assert pieces == [b"<pad>", b"<unk>", b"<s>", b"</s>"]
    processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model_proto)
    assert processor.get_piece_size() == 1000


def test_tokenize_matches_sentencepiece_and_adds_no_special_ids(tokenizer):
    ids = tokenizer.tokenize(tf.constant(SENTENCES))
    assert isinstance(ids, tf.RaggedTensor)
    assert ids.dtype == tf.int32
    processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model_proto)
    assert ids.to_list() == processor.encode(SENTENCES)
    assert not np.isin(ids.flat_values.numpy(), [0, 1, 2, 3]).any()
    # A scalar gives one dense row.
    assert tokenizer.tokenize(tf.constant(SENTENCES[0])).numpy().tolist() == ids[0].numpy().tolist()


def test_detokenize_skips_padding_bos_and_eos(tokenizer):
    ids = tokenizer.tokenize(tf.constant(SENTENCES))
    expected = [s.encode("utf-8") for s in SENTENCES]
    assert tokenizer.detokenize(ids).numpy().tolist() == expected
    padded = ids.to_tensor(default_value=0, shape=[2, 40])  # (2, 40), trailing 0s
    assert tokenizer.detokenize(padded).numpy().tolist() == expected
    framed = tf.concat([tf.fill([2, 1], 2), ids, tf.fill([2, 1], 3)], axis=1)
    assert tokenizer.detokenize(framed).numpy().tolist() == expected


def test_round_trip_on_the_bundled_test_split(tokenizer):
    pairs = data.load_parallel("bundled", "test").batch(4096).get_single_element()
    texts = tf.concat([pairs["source"], pairs["target"]], axis=0)  # (3582,)
    restored = tokenizer.detokenize(tokenizer.tokenize(texts))
    exact = float(tf.reduce_mean(tf.cast(tf.equal(restored, texts), tf.float32)))
    # NFC text (as the bundled corpus is) and byte fallback: every verse comes
    # back exactly.
    assert texts.shape[0] == 3582
    assert exact >= 0.99
    assert exact == 1.0


def test_unseen_characters_round_trip_through_byte_fallback(tokenizer):
    text = "Ωμέγα, 東京 and ß — naïve “quotes”"
    ids = tokenizer.tokenize(tf.constant([text]))
    assert tokenizer.unk_id not in ids.flat_values.numpy().tolist()
    assert tokenizer.detokenize(ids).numpy()[0].decode("utf-8") == text


def _round_trip(tokenizer, texts):
    ids = tokenizer.tokenize(tf.constant(texts))
    return [text.decode("utf-8") for text in tokenizer.detokenize(ids).numpy()]


def test_every_decomposed_character_tokenizes_as_its_nfc(tokenizer):
    # The rules compiled into the model against Python's NFC, for every character
    # with a canonical decomposition (Hangul syllables included): written
    # decomposed, it comes back composed. Byte fallback makes detokenize show
    # the normalized text whatever the vocabulary.
    characters = [chr(c) for c in range(0x110000)
                  if not 0xD800 <= c < 0xE000
                  and unicodedata.normalize("NFD", chr(c)) != chr(c)]
    assert len(characters) > 13000
    decomposed = [unicodedata.normalize("NFD", c) for c in characters]
    expected = [unicodedata.normalize("NFC", c) for c in characters]
    restored = _round_trip(tokenizer, decomposed)
    wrong = [(d, e, r) for d, e, r in zip(decomposed, expected, restored) if r != e]
    assert not wrong, f"{len(wrong)} not in NFC, e.g. {wrong[:5]}"


@pytest.mark.parametrize("written, nfc", [
    ("e\u0323\u0302", "\u1ec7"),        # ệ: its decomposition, in canonical order
    ("e\u0302\u0323", "\u1ec7"),        # the marks the other way round
    ("\u00ea\u0323", "\u1ec7"),         # ê, then the dot below
    ("\u1eb9\u0302", "\u1ec7"),         # ẹ, then the circumflex
    ("\u1100\u1161\u11a8", "\uac01"),  # 각 from its three jamo
    ("\uac00\u11a8", "\uac01"),         # 가 + ᆨ
    ("\u212b", "\u00c5"),                # the Angstrom sign is Å in NFC
    ("q\u0301", "q\u0301"),              # no precomposed q́: left as written
    ("\ufeffJesus wept.", "Jesus wept."),  # a byte order mark is dropped
])
def test_canonically_equivalent_spellings_tokenize_alike(tokenizer, written, nfc):
    assert unicodedata.normalize("NFC", written.replace("\ufeff", "")) == nfc
    assert _round_trip(tokenizer, [written]) == [nfc]
    ids = tokenizer.tokenize(tf.constant([written, nfc])).to_list()
    assert ids[0] == ids[1]


def test_a_decomposed_sentence_tokenizes_as_the_composed_one(tokenizer):
    composed = "Y dijo Jesús: Mañana iréis à Jérusalem, naïve Ωμέγα."
    decomposed = unicodedata.normalize("NFD", composed)
    assert decomposed != composed
    ids = tokenizer.tokenize(tf.constant([decomposed, composed, "\ufeff" + composed])).to_list()
    assert ids[0] == ids[1] == ids[2]
    # The identity normalization keeps what was written, decomposed included.
    identity = data.SubwordTokenizer.train(SENTENCES * 10, vocab_size=300,
                                           normalization_rule_name="identity")
    assert _round_trip(identity, [decomposed]) == [decomposed]


def test_training_twice_gives_the_same_vocabulary(dev_pairs, tokenizer):
    again = data.SubwordTokenizer.train(dev_pairs, vocab_size=1000)
    assert again.model_proto == tokenizer.model_proto
    # Whatever the number of trainer threads: the bytes record none of it.
    one_thread = data.SubwordTokenizer.train(dev_pairs, vocab_size=1000, num_threads=1)
    assert one_thread.model_proto == tokenizer.model_proto


def test_a_dataset_of_pairs_and_a_list_of_strings_train_the_same(dev_pairs, tokenizer):
    strings = []
    for pair in dev_pairs.as_numpy_iterator():
        strings += [pair["source"].decode("utf-8"), pair["target"]]  # str and bytes
    assert data.SubwordTokenizer.train(strings, vocab_size=1000).model_proto == tokenizer.model_proto
    tuples = list(zip(strings[0::2], strings[1::2]))
    assert data.SubwordTokenizer.train(tuples, vocab_size=1000).model_proto == tokenizer.model_proto


def test_save_and_load_give_identical_ids(tmp_path, tokenizer):
    tokenizer.save(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [
        "casing.json", "subword.model", "subword.vocab", "tokenizer.json"]
    loaded = data.SubwordTokenizer.load(str(tmp_path))
    assert loaded.model_proto == tokenizer.model_proto
    assert loaded.casing.spellings == tokenizer.casing.spellings
    assert loaded.vocab_size == tokenizer.vocab_size
    texts = tf.constant(SENTENCES + ["Ωμέγα 東京"])
    assert loaded.tokenize(texts).to_list() == tokenizer.tokenize(texts).to_list()
    with open(tmp_path / "subword.vocab", encoding="utf-8") as f:
        assert len(f.readlines()) == 1000


def test_load_names_a_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json not found"):
        data.SubwordTokenizer.load(str(tmp_path / "nowhere"))


def test_runs_inside_tf_data(tokenizer):
    dataset = tf.data.Dataset.from_tensor_slices(SENTENCES).map(tokenizer.tokenize)
    rows = [row.tolist() for row in dataset.as_numpy_iterator()]
    assert rows == tokenizer.tokenize(tf.constant(SENTENCES)).to_list()


def test_runs_inside_a_reloaded_saved_model(tmp_path, tokenizer):
    class Exported(tf.Module):
        def __init__(self, tokenizer):
            super().__init__()
            self.tokenizer = tokenizer

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def round_trip(self, texts):
            ids = self.tokenizer.tokenize(texts)
            return {"ids": ids.to_tensor(), "texts": self.tokenizer.detokenize(ids)}

    module = Exported(tokenizer)
    tf.saved_model.save(module, str(tmp_path))
    reloaded = tf.saved_model.load(str(tmp_path))
    texts = tf.constant(SENTENCES)
    expected = module.round_trip(texts)
    received = reloaded.round_trip(texts)
    np.testing.assert_array_equal(received["ids"].numpy(), expected["ids"].numpy())
    assert received["texts"].numpy().tolist() == [s.encode("utf-8") for s in SENTENCES]


def test_a_corpus_too_small_gives_a_smaller_vocabulary():
    sentences = ["the cat sat on the mat", "a dog ran in the park"] * 20
    small = data.SubwordTokenizer.train(sentences, vocab_size=5000)
    assert 276 < small.vocab_size < 5000


def test_max_sentences_samples_deterministically():
    sentences = [f"sentence {i}" for i in range(1000)]
    first = tokenizer_module._sample(iter(sentences), 100, seed=0)
    assert first == tokenizer_module._sample(iter(sentences), 100, seed=0)
    assert first != tokenizer_module._sample(iter(sentences), 100, seed=1)
    assert len(first) == 100 and len(set(first)) == 100 and set(first) <= set(sentences)
    assert tokenizer_module._sample(iter(sentences), 5000, seed=0) == sentences
    assert tokenizer_module._sample(iter(sentences), None, seed=0) == sentences


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"vocab_size": 100}, "vocab_size must be at least 261"),
        ({"model_type": "word"}, "model_type must be 'bpe' or 'unigram'"),
        ({"normalization_rule_name": "nfd"}, "normalization_rule_name must be one of nfc, identity"),
        ({"max_sentences": 0}, "max_sentences must be positive"),
    ],
)
def test_training_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        data.SubwordTokenizer.train(SENTENCES * 10, **kwargs)


def test_too_small_a_vocabulary_for_the_texts_characters_says_the_size_that_fits():
    """A vocab_size above the fixed minimum but below what the text's characters
    need: the size they need (each distinct character, the word-boundary piece,
    4 reserved and 256 byte ids), which then trains; not sentencepiece's advice of
    a '--character_coverage option' that this package has no flag for."""
    texts = ["abc def", "fed cba ghij"]
    needed = len(set("".join(texts)) - {" "}) + 1 + 4 + 256
    with pytest.raises(ValueError) as raised:
        data.SubwordTokenizer.train(texts, vocab_size=needed - 1)
    assert str(raised.value) == (
        f"SubwordTokenizer.train: vocab_size={needed - 1} is too small for this text: a "
        f"piece for each of its {needed - 260} characters and the 260 reserved and byte ids "
        f"take {needed} before any subword. Pass vocab_size={needed} or more (thousands is "
        "usual).")
    assert data.SubwordTokenizer.train(texts, vocab_size=needed).vocab_size == needed


def test_training_on_nothing_is_an_error():
    with pytest.raises(ValueError, match="the training text is empty"):
        data.SubwordTokenizer.train(["", ""], vocab_size=300)


def test_a_model_with_other_reserved_ids_is_refused():
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES * 10), model_writer=model, vocab_size=40,
        hard_vocab_limit=False, minloglevel=2,
    )  # sentencepiece's defaults: unk 0, bos 1, eos 2, no padding
    with pytest.raises(ValueError, match="pad_id=-1 but this package reserves pad_id=0"):
        data.SubwordTokenizer(model.getvalue())


def test_survives_tf_random_set_seed(tokenizer):
    # set_seed clears TensorFlow's kernel cache, where sentencepiece keeps its model.
    texts = tf.constant(SENTENCES)
    dataset = tf.data.Dataset.from_tensors(texts).map(tokenizer.tokenize)
    expected = tokenizer.tokenize(texts).to_list()
    tf.random.set_seed(5)
    assert tokenizer.tokenize(texts).to_list() == expected
    assert dataset.get_single_element().to_list() == expected


def test_many_tokenizers_in_one_process_warn_of_no_retracing(tokenizer, capfd, caplog):
    # tf.function counts traces by the Python function's code; methods decorated
    # once for the class would add every tokenizer's first call up, and warn of
    # "excessive retracing" from the fifth tokenizer on (a vocabulary sweep).
    capfd.readouterr()
    caplog.clear()
    tokenizers = [data.SubwordTokenizer(tokenizer.model_proto, tokenizer.casing)
                  for _ in range(7)]
    for each in tokenizers:
        ids = each.tokenize(tf.constant(SENTENCES))
        assert each.detokenize(ids).numpy().tolist() == [s.encode() for s in SENTENCES]
        assert each.id_to_token(tf.constant([2, 3])).numpy().tolist() == [b"<s>", b"</s>"]
    # TensorFlow's logger prints to stderr, or hands its records to the root
    # logger's handlers where there are any (pytest's caplog).
    assert "retracing" not in capfd.readouterr().err + caplog.text
    traced = [function.experimental_get_tracing_count() for each in tokenizers
              for function in (each._tokenize, each._detokenize, each._id_to_token)]
    assert traced == [1] * 21
