"""A shared source-target subword vocabulary that runs as TensorFlow ops.

Sec. 5.1: sentences are encoded with byte-pair encoding over a vocabulary shared by
source and target (about 37000 tokens for WMT 2014 English-German). The vocabulary
is learned with sentencepiece's BPE trainer; tokenization and detokenization run
through `tensorflow_text.SentencepieceTokenizer`, so the same serialized model works
eagerly, inside `tf.data` and inside an exported SavedModel.
"""

import functools
import io
import json
import os
import random
import re
import tempfile

import sentencepiece
import tensorflow as tf
from sentencepiece import sentencepiece_model_pb2
import tensorflow_text

from keras_transformer.config import PAPER_VOCAB_SENTENCES
from keras_transformer.config import PAPER_VOCAB_SIZE
from keras_transformer.data import text_normalization
from keras_transformer.data.casing import Casing
from keras_transformer.hardware import available_cores
from keras_transformer.token_ids import BOS_ID
from keras_transformer.token_ids import EOS_ID
from keras_transformer.token_ids import PAD_ID
from keras_transformer.token_ids import UNK_ID
from keras_transformer.token_ids import smallest_vocab_size

MODEL_FILENAME = "subword.model"
VOCAB_FILENAME = "subword.vocab"
CONFIG_FILENAME = "tokenizer.json"
CASING_FILENAME = "casing.json"

# The default normalization: Unicode NFC, our rules (`text_normalization`).
NFC = "nfc"
# The normalizations `SubwordTokenizer.train` takes: ours, then sentencepiece's.
NORMALIZATIONS = (NFC, "identity", "nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf")


class SubwordTokenizer(tf.Module):
    """Subword tokenizer with a vocabulary shared by source and target.

    Build one with `SubwordTokenizer.train(...)` or `SubwordTokenizer.load(directory)`.
    Token ids are int32; the reserved ids are padding 0, unknown 1, begin of sequence
    2 and end of sequence 3. `tokenize` adds neither BOS nor EOS (batching does), and
    `detokenize` skips the reserved ids, so padded rows detokenize cleanly.

    The default normalization is Unicode NFC with byte fallback: a sentence written
    with combining accents ("e" + U+0301) tokenizes as its precomposed form ("é"),
    nothing else is rewritten (no NFKC), a byte order mark (U+FEFF) is dropped,
    and characters outside the vocabulary become byte tokens instead of the unknown
    id. So `detokenize(tokenize(x)) == x` for any NFC text whose whitespace is
    already single spaces with none leading or trailing (sentencepiece collapses
    runs of whitespace). The normalization is part of the serialized model: it
    runs wherever the tokenizer does, an export included.

    The tokenizer is a `tf.Module` whose ops are built inside every traced function
    that calls it, the serialized model embedded: call `tokenize` / `detokenize`
    in a `tf.data` map or in the `tf.function` of a module being exported, and the
    model travels with the dataset or inside the SavedModel. It survives
    `tf.random.set_seed` (which destroys sentencepiece models held eagerly).

    Args:
        model_proto: bytes, a serialized sentencepiece model whose reserved ids are
            the ones above (as `train` makes).
        casing: the `Casing` of the training text's words, with which a
            translator puts back the capitals of a request in small letters,
            in capitals or in Title Case; None: an empty one (vocabularies from
            before 2026-11-30 have none).
        name: optional module name.

    Attributes:
        model_proto: the serialized sentencepiece model (bytes).
        casing: the `Casing`.
        vocab_size: int, the number of ids, reserved ones included.
        pad_id, unk_id, bos_id, eos_id: the reserved ids (0, 1, 2, 3).

    Example:
    ```python
    pairs = keras_transformer.data.load_parallel("bundled", "train")
    tokenizer = SubwordTokenizer.train(pairs, vocab_size=8000)
    ids = tokenizer.tokenize(tf.constant(["In the beginning."]))  # (1, None) int32
    tokenizer.detokenize(ids)  # [b"In the beginning."]
    tokenizer.save("runs/vocab")
    tokenizer = SubwordTokenizer.load("runs/vocab")
    ```

    References:
        Vaswani et al., 2017, Sec. 5.1. Sennrich et al., 2016, "Neural Machine
        Translation of Rare Words with Subword Units". Kudo and Richardson, 2018,
        "SentencePiece".
    """

    def __init__(self, model_proto, casing=None, name=None):
        super().__init__(name=name)
        if not isinstance(model_proto, bytes) or not model_proto:
            raise ValueError(
                "SubwordTokenizer needs the serialized sentencepiece model as "
                f"non-empty bytes. Received: {type(model_proto).__name__}"
            )
        processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
        reserved = {
            "pad_id": (processor.pad_id(), PAD_ID),
            "unk_id": (processor.unk_id(), UNK_ID),
            "bos_id": (processor.bos_id(), BOS_ID),
            "eos_id": (processor.eos_id(), EOS_ID),
        }
        for attribute, (received, expected) in reserved.items():
            if received != expected:
                raise ValueError(
                    f"SubwordTokenizer: the sentencepiece model has {attribute}="
                    f"{received} but this package reserves {attribute}={expected}; "
                    "train the vocabulary with SubwordTokenizer.train"
                )
        self.model_proto = model_proto
        self.casing = casing if casing is not None else Casing()
        self.vocab_size = processor.get_piece_size()
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = (
            PAD_ID, UNK_ID, BOS_ID, EOS_ID,
        )
        self._processor = processor
        # One tf.function each per tokenizer, not one per class: TensorFlow counts a
        # function's traces by its Python code, so the methods' traces in every
        # tokenizer would add up, and from the fifth tokenizer in a process it would
        # warn of "excessive retracing" that is none.
        self._tokenize, self._detokenize, self._id_to_token = (
            tf.function(functools.partial(function, model_proto))
            for function in (_tokenize, _detokenize, _id_to_token)
        )

    @classmethod
    def train(
        cls,
        texts,
        vocab_size=PAPER_VOCAB_SIZE,
        max_sentences=PAPER_VOCAB_SENTENCES,
        seed=0,
        model_type="bpe",
        character_coverage=1.0,
        byte_fallback=True,
        normalization_rule_name=NFC,
        num_threads=None,
    ):
        """Learns a shared vocabulary from source and target sentences, and the
        usual case of their words (`Casing.learn`).

        Args:
            texts: the training text: a `tf.data.Dataset` of `{"source", "target"}`
                pairs (as `load_parallel` returns; both sides are used) or of
                scalar strings, or a Python iterable of strings, bytes or
                `(source, target)` tuples.
            vocab_size: int, the number of ids wanted, reserved ones included
                (paper: about 37000). A corpus too small to supply that many
                merges gives a smaller vocabulary; read `vocab_size` afterwards.
            max_sentences: int or None, the most sentences used for training. A
                larger corpus is subsampled uniformly (reservoir sampling with
                `seed`); None uses every sentence.
            seed: int, the seed of that subsampling.
            model_type: "bpe" (the paper's) or "unigram".
            character_coverage: float, the fraction of characters covered by
                single-character pieces; the rest fall back to bytes.
            byte_fallback: bool, encode characters outside the vocabulary as UTF-8
                byte tokens rather than the unknown id (256 ids of the vocabulary).
            normalization_rule_name: the text normalization compiled into the
                model: "nfc" (Unicode NFC, `text_normalization.nfc_rules`);
                "identity" keeps text as written, so differently composed
                spellings of a word tokenize differently; or another of
                sentencepiece's rules, such as "nmt_nfkc" (NFKC, which also
                rewrites ligatures, full-width forms and the like).
            num_threads: int or None (all cores) for the trainer.

        Returns:
            A `SubwordTokenizer`. Training twice on the same text with the same
            arguments gives the same vocabulary.
        """
        if normalization_rule_name not in NORMALIZATIONS:
            raise ValueError(
                f"normalization_rule_name must be one of {', '.join(NORMALIZATIONS)}. "
                f"Received: normalization_rule_name={normalization_rule_name!r}"
            )
        if model_type not in ("bpe", "unigram"):
            raise ValueError(
                f"model_type must be 'bpe' or 'unigram'. Received: model_type={model_type!r}"
            )
        minimum = smallest_vocab_size(byte_fallback)
        if vocab_size < minimum:
            raise ValueError(
                f"vocab_size must be at least {minimum} (4 reserved ids"
                f"{' and 256 byte tokens' if byte_fallback else ''} plus pieces). "
                f"Received: vocab_size={vocab_size}"
            )
        if max_sentences is not None and max_sentences < 1:
            raise ValueError(
                f"max_sentences must be positive or None. Received: max_sentences={max_sentences}"
            )
        sentences = _sample(_sentences(texts), max_sentences, seed)
        if not sentences:
            raise ValueError("SubwordTokenizer.train: the training text is empty")

        model = io.BytesIO()
        with tempfile.TemporaryDirectory() as directory:
            try:
                sentencepiece.SentencePieceTrainer.train(
                    sentence_iterator=iter(sentences),
                    model_writer=model,
                    model_type=model_type,
                    vocab_size=vocab_size,
                    # Too small a corpus for vocab_size gives a smaller vocabulary
                    # instead of an error.
                    hard_vocab_limit=False,
                    character_coverage=character_coverage,
                    byte_fallback=byte_fallback,
                    **_normalization_flags(normalization_rule_name, directory),
                    pad_id=PAD_ID,
                    unk_id=UNK_ID,
                    bos_id=BOS_ID,
                    eos_id=EOS_ID,
                    # Sampling happened above, with our seed: the trainer reads
                    # everything it is given, in order, so its result is reproducible.
                    input_sentence_size=0,
                    shuffle_input_sentence=False,
                    max_sentence_length=1 << 16,
                    num_threads=num_threads or available_cores(),
                    minloglevel=2,
                )
            except RuntimeError as error:
                required = _required_vocab_size(error)
                if required is None:
                    raise ValueError(
                        f"SubwordTokenizer.train could not learn a vocabulary of vocab_size="
                        f"{vocab_size} from {len(sentences)} sentences. sentencepiece says: "
                        f"{error}"
                    ) from error
                ids = minimum - 1
                characters = (f"{required - ids} characters" if character_coverage >= 1 else
                              f"{required - ids} most frequent characters (those that make "
                              f"up {character_coverage * 100:g}% of it)")
                raise ValueError(
                    f"SubwordTokenizer.train: vocab_size={vocab_size} is too small for this "
                    f"text: a piece for each of its {characters} and the {ids} reserved "
                    f"{'and byte ' if byte_fallback else ''}ids take {required} before any "
                    f"subword. Pass vocab_size={required} or more (thousands is usual)."
                ) from None
        return cls(_without_machine_settings(model.getvalue()), Casing.learn(sentences))

    def tokenize(self, texts):
        """Token ids of `texts`.

        Args:
            texts: tf.string tensor (or anything convertible), shape (B,) or scalar.

        Returns:
            int32 `tf.RaggedTensor` of shape (B, None) for a vector, or an int32
            tensor of shape (T,) for a scalar. No BOS or EOS is added.
        """
        # A tensor, never a Python string: tf.function would retrace per value.
        return self._tokenize(tf.convert_to_tensor(texts, tf.string))

    def detokenize(self, ids):
        """Text of token ids; the reserved ids (padding, BOS, EOS) are skipped.

        Args:
            ids: int32 `tf.RaggedTensor` or dense tensor of shape (B, T), or (T,).

        Returns:
            tf.string tensor of shape (B,), or a scalar for ids of shape (T,).
        """
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.convert_to_tensor(ids, tf.int32)
        return self._detokenize(ids)

    def id_to_token(self, ids):
        """The subword pieces of `ids` as tf.string (for inspecting a vocabulary)."""
        return self._id_to_token(tf.convert_to_tensor(ids, tf.int32))

    def save(self, directory):
        """Writes the model, a readable vocabulary, the casing and the settings
        to `directory`."""
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, MODEL_FILENAME), "wb") as f:
            f.write(self.model_proto)
        with open(os.path.join(directory, VOCAB_FILENAME), "w", encoding="utf-8") as f:
            for i in range(self.vocab_size):
                f.write(f"{self._processor.id_to_piece(i)}\t{self._processor.get_score(i)}\n")
        self.casing.save(os.path.join(directory, CASING_FILENAME))
        config = {
            "format": "sentencepiece",
            "model_file": MODEL_FILENAME,
            "casing_file": CASING_FILENAME,
            "vocab_size": self.vocab_size,
            "pad_id": self.pad_id,
            "unk_id": self.unk_id,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
        }
        with open(os.path.join(directory, CONFIG_FILENAME), "w") as f:
            json.dump(config, f, indent=2)
            f.write("\n")

    @classmethod
    def load(cls, directory):
        """Loads a tokenizer written by `save`."""
        config_path = os.path.join(directory, CONFIG_FILENAME)
        if not os.path.exists(config_path):
            raise FileNotFoundError(
                f"SubwordTokenizer.load: {config_path} not found; pass a directory "
                "written by SubwordTokenizer.save"
            )
        with open(config_path) as f:
            config = json.load(f)
        casing = None
        if "casing_file" in config:  # vocabularies from before 2026-11-30 have none
            casing = Casing.load(os.path.join(directory, config["casing_file"]))
        with open(os.path.join(directory, config["model_file"]), "rb") as f:
            tokenizer = cls(f.read(), casing)
        if tokenizer.vocab_size != config["vocab_size"]:
            raise ValueError(
                f"SubwordTokenizer.load: {config_path} says vocab_size="
                f"{config['vocab_size']} but the model has {tokenizer.vocab_size}"
            )
        return tokenizer


def _tokenize(model_proto, texts):
    return _sentencepiece(model_proto).tokenize(texts)


def _detokenize(model_proto, ids):
    return _sentencepiece(model_proto).detokenize(ids)


def _id_to_token(model_proto, ids):
    return _sentencepiece(model_proto).id_to_string(ids)


def _sentencepiece(model_proto):
    # Built inside each traced function rather than once in __init__: its model
    # lives in a kernel-owned resource, which `tf.random.set_seed` (it clears the
    # eager kernel cache) would destroy under a tokenizer built eagerly and under
    # every dataset that captured it. Built in the graph, the resource is re-created
    # with the kernel, and the model proto travels in the graph, so tf.data
    # functions and SavedModels carry it.
    return tensorflow_text.SentencepieceTokenizer(model=model_proto, out_type=tf.int32)


def _normalization_flags(rule_name, directory):
    """The trainer's flags for `rule_name`: ours ("nfc") as a rule file written
    to `directory`, sentencepiece's by name."""
    if rule_name != NFC:
        return {"normalization_rule_name": rule_name}
    path = os.path.join(directory, "nfc.tsv")
    text_normalization.write_rule_tsv(text_normalization.nfc_rules(), path)
    return {"normalization_rule_tsv": path}


def _without_machine_settings(model_proto):
    """The model with the trainer's thread count and the rule file's (temporary)
    path cleared: the vocabulary depends on neither, and so the bytes do not
    either, whatever machine trained it."""
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(model_proto)
    model.trainer_spec.ClearField("num_threads")
    model.normalizer_spec.ClearField("normalization_rule_tsv")
    return model.SerializeToString()


def _sentences(texts):
    """Yields the strings of `texts` (see `SubwordTokenizer.train`) as str."""
    if isinstance(texts, tf.data.Dataset):
        texts = _unbatched_numpy(texts)
    for item in texts:
        if isinstance(item, dict):
            parts = (item["source"], item["target"])
        elif isinstance(item, (tuple, list)):
            parts = item
        else:
            parts = (item,)
        for part in parts:
            if isinstance(part, tf.Tensor):
                part = part.numpy()
            if isinstance(part, bytes):
                part = part.decode("utf-8")
            if not isinstance(part, str):
                raise TypeError(
                    "SubwordTokenizer.train: texts must hold strings, bytes, "
                    "(source, target) tuples or {'source', 'target'} dicts. "
                    f"Received an element of type {type(part).__name__}"
                )
            if part:
                yield part


def _unbatched_numpy(dataset):
    """Yields the elements of `dataset` as numpy, reading it in blocks (fast)."""
    for block in dataset.batch(4096).as_numpy_iterator():
        if isinstance(block, dict):
            keys = list(block)
            for values in zip(*(block[key] for key in keys)):
                yield dict(zip(keys, values))
        elif isinstance(block, tuple):
            yield from zip(*block)
        else:
            yield from block


def _required_vocab_size(error):
    """The vocabulary size that sentencepiece's trainer says the text needs at
    the least (its single characters and the reserved ids), where `error` says
    the vocab_size asked is below it; else None."""
    found = re.search(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)",
                      str(error))
    return int(found.group(1)) if found else None


def _sample(sentences, max_sentences, seed):
    """At most `max_sentences` of `sentences`, uniformly (reservoir sampling)."""
    if max_sentences is None:
        return list(sentences)
    rng = random.Random(seed)
    reservoir = []
    for i, sentence in enumerate(sentences):
        if i < max_sentences:
            reservoir.append(sentence)
        else:
            j = rng.randrange(i + 1)
            if j < max_sentences:
                reservoir[j] = sentence
    return reservoir
