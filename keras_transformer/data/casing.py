"""The usual case of a corpus's words, to put back the capitals of a sentence
written in small letters only, in capitals only or in Title Case.

Such a sentence's capitals say nothing of its words, and a model trained on
ordinary text translates it badly: a quickstart export scored 16.8 sacreBLEU
(case-insensitive) on the bundled test split in small letters, 22.2 as written.
`Casing` holds, for each word that the training text usually writes with
capitals, that spelling ("god" -> "God", "yahweh’s" -> "Yahweh’s", "mcdonald"
-> "McDonald"), learned as the Moses truecaser learns it (Koehn et al., 2007):
each word's most frequent spelling, counted where its position does not force a
capital; and whether the text starts its sentences with a capital (a corpus in
small letters does not, and a model trained on one has never seen a capital).
`Casing.restore` rewrites a sentence with those spellings, and with a capital at
each sentence start where the text has them, in TensorFlow's core string ops,
so it runs inside an exported model.

A word is a space-separated token; its letters run from its first letter (or
combining mark) to its last, around them its punctuation ("“God’s," has
letters "God’s"). A word starts a sentence when no word before it has a letter,
when the word before ends in ".", "!" or "?" (then perhaps quotes or brackets),
or when an opening quote or "¿" / "¡" comes before its letters.
"""

import collections
import json
import os
import unicodedata

import numpy as np
import tensorflow as tf

# Characters that end a sentence, in the punctuation after a word's letters.
SENTENCE_ENDS = ".!?"
# Characters before a word's letters that open a sentence: opening quotes, and
# Spanish's opening question and exclamation marks.
SENTENCE_OPENERS = "\"“„«‹「¿¡"
# The hash range of the lookup (`tf.strings.to_hash_bucket_fast`): 62 bits, so
# two words of a table share a hash with odds of about n**2 / 2**63.
_HASH_BUCKETS = 1 << 62
# RE2 classes of what `letters` keeps: letters and combining marks.
_NOT_LETTER = r"[^\pL\pM]"


class Casing:
    """The usual spelling of each word that a corpus writes with capitals.

    Build one with `Casing.learn(sentences)` (`SubwordTokenizer.train` does,
    and saves it with the vocabulary) or `Casing.load(path)`.

    Args:
        spellings: dict from a word's letters in small letters (`str.lower`)
            to its usual spelling ("god" -> "God"); words usually written in
            small letters are left out.
        sentence_starts: whether `restore` puts a capital at each sentence
            start (where the text writes one).

    Example:
    ```python
    casing = Casing.learn(["In the beginning, God created.", "And God said."])
    casing.spellings, casing.sentence_starts  # {"god": "God"}, True
    casing.restore(tf.constant(["and god said."]))  # [b"And God said."]
    ```
    """

    def __init__(self, spellings=None, sentence_starts=True):
        spellings = dict(spellings or {})
        for word, spelling in spellings.items():
            if not isinstance(word, str) or not isinstance(spelling, str) \
                    or not word or word.lower() != spelling.lower() or word != word.lower():
                raise ValueError(
                    "Casing: each entry must map a word in small letters to a spelling of "
                    f"the same word. Received: {word!r} -> {spelling!r}")
        if not isinstance(sentence_starts, bool):
            raise ValueError("Casing: sentence_starts must be True or False. "
                             f"Received: {sentence_starts!r}")
        self.spellings = spellings
        self.sentence_starts = sentence_starts
        # The lookup's table, sorted by hash (`_usual_spelling`).
        words = np.array([word.encode("utf-8") for word in spellings], dtype=object)
        hashes = tf.strings.to_hash_bucket_fast(
            tf.constant(words.tolist(), tf.string, shape=[len(words)]), _HASH_BUCKETS).numpy()
        order = np.argsort(hashes, kind="stable")
        # Two words of one hash (odds ~1e-10): the first is kept.
        order = order[np.diff(hashes[order], prepend=-1) != 0]
        self._hashes = hashes[order]
        self._words = words[order]
        self._spellings = np.array([spellings[word.decode("utf-8")].encode("utf-8")
                                    for word in self._words], dtype=object)

    def __len__(self):
        return len(self.spellings)

    @classmethod
    def learn(cls, sentences, min_count=2, max_words=50_000):
        """The usual spelling of each word of `sentences` that is usually
        written with capitals.

        A word is counted where its position does not force a capital (not at
        a sentence start, see the module docstring), and not in a sentence
        without small letters (a title in capitals). A word enters the table
        when its most frequent spelling has capitals, is seen at least
        `min_count` times, and more often than the word in small letters; the
        `max_words` most frequent such words are kept. `sentence_starts`: more
        sentences start with a capital than with a small letter.

        Args:
            sentences: an iterable of str.
            min_count: int, the fewest times the spelling must be seen.
            max_words: int, the most words kept.
        """
        counts = collections.Counter()  # token -> times seen where its case is free
        kinds = {}  # token -> (has letters, ends a sentence), worked out once a token
        starts = collections.Counter()  # sentences whose first letter is a capital: True
        for sentence in sentences:
            if sentence == sentence.upper():  # no small letter: capitals say nothing
                continue
            first = next((c for c in sentence if c.isalpha()), "")
            if first.upper() != first.lower():  # a letter with case
                starts[first.isupper()] += 1
            lettered = previous_ends = False
            for token in sentence.split():
                kind = kinds.get(token)
                if kind is None:
                    kind = kinds[token] = _kind(token)
                if lettered and not previous_ends:
                    counts[token] += 1
                lettered, previous_ends = lettered or kind[0], kind[1]
        spellings = collections.defaultdict(collections.Counter)
        for token, count in counts.items():
            before, letters, _ = _split_word(token)
            if letters and not any(c in SENTENCE_OPENERS for c in before):
                spellings[letters.lower()][letters] += count
        table = []
        for word, seen in spellings.items():
            # The most frequent spelling; on a tie, the one in small letters.
            spelling, count = max(seen.items(), key=lambda item: (item[1], item[0] == word))
            if spelling != word and count >= min_count:
                table.append((sum(seen.values()), word, spelling))
        table.sort(key=lambda entry: (-entry[0], entry[1]))
        return cls({word: spelling for _, word, spelling in table[:max_words]},
                   sentence_starts=starts[True] > starts[False])

    # One traced function however many graphs call it: an export holds the
    # table once, not in each signature.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def restore(self, text):
        """`text` `(B,)` in small letters, then each word in its usual spelling
        and each sentence start with a capital (if `sentence_starts`): "AND GOD
        SAID. LET THERE BE LIGHT." -> "And God said. Let there be light.".

        `text` is a request's cleaned text: words separated by single spaces.
        """
        words = tf.strings.split(tf.strings.lower(text, encoding="utf-8"), " ")  # (B, None)
        flat = words.flat_values
        before = tf.strings.regex_replace(flat, rf"(?s)^({_NOT_LETTER}*).*$", r"\1")
        letters = tf.strings.regex_replace(
            flat, rf"(?s)^{_NOT_LETTER}*(.*?){_NOT_LETTER}*$", r"\1")
        after = tf.strings.regex_replace(flat, rf"(?s)^.*?({_NOT_LETTER}*)$", r"\1")
        has_letters = letters != ""
        letters = self._usual_spelling(letters)
        if self.sentence_starts:
            starts = _sentence_starts(words, has_letters, before, after)
            first = tf.strings.regex_replace(letters, r"(?s)^(.).*$", r"\1")
            rest = tf.strings.regex_replace(letters, r"(?s)^.", "")
            letters = tf.where(starts, tf.strings.upper(first, encoding="utf-8") + rest, letters)
        flat = tf.where(has_letters, before + letters + after, flat)
        return tf.strings.reduce_join(words.with_flat_values(flat), axis=1, separator=" ")

    def _usual_spelling(self, words):
        """Each of `words` (1-D, small letters) in the table's spelling, or as given."""
        if not len(self._hashes):
            return words
        hashes = tf.strings.to_hash_bucket_fast(words, _HASH_BUCKETS)
        index = tf.minimum(tf.searchsorted(tf.constant(self._hashes), hashes),
                           len(self._hashes) - 1)
        found = tf.gather(tf.constant(self._words, tf.string), index) == words
        return tf.where(found, tf.gather(tf.constant(self._spellings, tf.string), index), words)

    def save(self, path):
        """Writes `{"sentence_starts": ..., "spellings": {...}}` (most frequent
        first) as JSON."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"sentence_starts": self.sentence_starts, "spellings": self.spellings},
                      f, ensure_ascii=False, indent=0)
            f.write("\n")

    @classmethod
    def load(cls, path):
        """Reads a casing written by `save`."""
        try:
            with open(path, encoding="utf-8") as f:
                values = json.load(f)
            return cls(values["spellings"], values["sentence_starts"])
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"{os.fspath(path)} is not a casing written by Casing.save "
                             f"({error}); restore it from the run it came with") from None


def _split_word(token):
    """`(before, letters, after)` of a space-free `token`: its letters run from
    its first letter or combining mark to its last ("" where it has none, and
    then `before` is the whole token)."""
    start = 0
    while start < len(token) and not _is_letter(token[start]):
        start += 1
    end = len(token)
    while end > start and not _is_letter(token[end - 1]):
        end -= 1
    return token[:start], token[start:end], token[end:]


def _is_letter(char):
    return unicodedata.category(char)[0] in "LM"


def _kind(token):
    """Whether `token` has letters, and whether the punctuation after them (all
    of it, where it has none) holds one of `SENTENCE_ENDS`."""
    _, letters, after = _split_word(token)
    return bool(letters), any(c in SENTENCE_ENDS for c in (after if letters else token))


def _sentence_starts(words, has_letters, before, after):
    """bool, flat as `words.flat_values`: which words start a sentence (see
    the module docstring)."""
    row_starts = tf.gather(words.row_splits[:-1], words.value_rowids())
    position = tf.range(tf.shape(has_letters, out_type=tf.int64)[0]) - row_starts
    # How many words with letters come before each word in its sentence.
    lettered = tf.math.cumsum(tf.cast(has_letters, tf.int64), exclusive=True)
    lettered_before = lettered - tf.gather(lettered, row_starts)
    ends = tf.strings.regex_full_match(
        tf.where(has_letters, after, before), rf"(?s).*[{SENTENCE_ENDS}].*")
    after_an_end = (position > 0) & tf.concat([[False], ends], axis=0)[:-1]
    opened = tf.strings.regex_full_match(before, rf"(?s).*[{SENTENCE_OPENERS}].*")
    return has_letters & ((lettered_before == 0) | after_an_end | opened)
