"""A translator's text in and out: the request limits, the normalization of the
text, subword tokenization, and back to text.

Bad input is answered, not crashed on: runs of whitespace (tabs, newlines,
Unicode spaces) become one space, ends stripped, as in the training text;
invalid UTF-8 bytes become U+FFFD; characters that show nothing (`INVISIBLE`:
controls, zero-width spaces, direction marks, soft hyphens) are dropped.

Where the translator recases capitals, a sentence whose capitals say nothing of
its words is translated with the capitals the training text gives them (the
tokenizer's `Casing`): one in small letters only ("and god said, let there be
light."), one in capitals only ("AND GOD SAID, LET THERE BE LIGHT.", its
translation given back in capitals), and one in Title Case ("And God Said, Let
There Be Light.": four words or more that start with a capital, none with a
small letter) are all translated as "And God said, let there be light.". A
corpus has few such sentences, and a model trained on one otherwise answers
with noise ("Y CUENDE DENDENDE LACUE LE DE DIDDDDTA.").

A request of more than `max_batch_size` sentences, or with a sentence of more
than `max_input_chars` characters, is refused with an `InvalidArgument` error
naming the limit, before any tokenization or search.
"""

import tensorflow as tf

# Characters that show nothing and mean nothing to a translation: control
# characters (but whitespace), the soft hyphen, zero-width space, word joiner
# and invisible operators, direction marks, embeddings, overrides and isolates,
# and the byte order mark. Web pages and documents carry them into copied text
# ("And\u200b God\u200b said" read as other words). The zero-width joiner
# and non-joiner stay: Persian, Indic scripts and emoji spell with them.
INVISIBLE = (r"[\x00-\x08\x0E-\x1B\x7F-\x84\x86-\x9F\x{AD}\x{61C}\x{180E}\x{200B}"
             r"\x{200E}\x{200F}\x{202A}-\x{202E}\x{2060}-\x{2064}\x{2066}-\x{206F}"
             r"\x{FEFF}]")
# Whitespace, as Python's str.isspace has it: RE2's \s (tab, newline, form
# feed, carriage return, space), Unicode's separators, the vertical tab, the
# information separators and the next-line character.
WHITESPACE = r"[\s\pZ\x0B\x1C-\x1F\x{85}]+"

# A sentence in Title Case has at least this many words that start with a
# capital: with 3, 106 of the bundled corpus's 27687 English training sentences,
# lists of names ("Hadoram, Uzal, Diklah,"), would be taken for Title Case; with
# 4, 19; each of its 500 test sentences, title-cased, has 4 or more.
TITLE_CASE_WORDS = 4
# A sentence in capitals only: two capital letters or more, no small letter
# (a script without case has neither, and is left alone).
ALL_CAPS = r"[^\p{Ll}]*\p{Lu}[^\p{Ll}]*\p{Lu}[^\p{Ll}]*"
# A sentence in small letters only: one small letter or more, no capital.
SMALL_LETTERS = r"[^\p{Lu}\p{Lt}]*\p{Ll}[^\p{Lu}\p{Lt}]*"
# A sentence whose first letter (after any quotes, digits, "¿") is a capital
# (CAPITAL_FIRST), or a small letter (SMALL_FIRST).
CAPITAL_FIRST = r"(?s)\PL*[\p{Lu}\p{Lt}].*"
SMALL_FIRST = r"(?s)\PL*\p{Ll}.*"


class RequestText:
    """The text side of a `serving.Translator`, inside its graphs.

    Args:
        tokenizer: the `SubwordTokenizer` shared by source and target; None for
            an ids-only translator (only `within_batch_limit` then).
        max_batch_size: the most sentences (or id rows) a request may hold.
        max_input_chars: the most characters a request's sentence may have;
            None for no limit.
        recase_capitals: whether sentences in small letters only, in capitals
            only or in Title Case are tokenized with their words' usual capitals
            (`tokens`, the tokenizer's `Casing`), and the translations of those
            in capitals put back in capitals (`in_source_case`).
    """

    def __init__(self, tokenizer, max_batch_size, max_input_chars, recase_capitals=False):
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_input_chars = max_input_chars
        self.recase_capitals = recase_capitals

    def within_batch_limit(self, inputs):
        """`inputs`, once their batch is known to be within `max_batch_size`."""
        check = tf.debugging.assert_less_equal(
            tf.shape(inputs)[0], self.max_batch_size,
            message=f"the request holds more than max_batch_size={self.max_batch_size} "
                    "sentences (a limit set at export); split it. Sentences received:")
        with tf.control_dependencies([check]):
            return tf.identity(inputs)

    def tokens(self, text):
        """Ragged subword ids `(B, None)` of a request's text, once it is within
        the limits."""
        # The limits first: nothing else runs on a request over them.
        text = self.within_batch_limit(text)
        if self.max_input_chars is not None:
            longest = tf.reduce_max(  # 0 for an empty batch
                tf.concat([tf.strings.length(text, unit="UTF8_CHAR"), [0]], axis=0))
            check = tf.debugging.assert_less_equal(
                longest, self.max_input_chars,
                message=f"a sentence of the request is longer than max_input_chars="
                        f"{self.max_input_chars} characters (a limit set at export). Longest:")
            with tf.control_dependencies([check]):
                text = tf.identity(text)
        text = _cleaned(text)
        if self.recase_capitals:
            uninformative = (_all_caps(text) | _title_case(text)
                             | tf.strings.regex_full_match(text, SMALL_LETTERS))
            text = tf.where(uninformative, self.tokenizer.casing.restore(text), text)
        return self.tokenizer.tokenize(text)

    def in_source_case(self, text, translations):
        """`translations` `(B,)` or `(B, K)` of the request's `text` `(B,)`, where
        the translator recases capitals: in capitals where that sentence was in
        capitals only, and with a capital first letter where its first letter
        was one (a model trained on clauses too may start a sentence with a
        small letter: "y tu prójimo como tu prójimo." for "Love your neighbor
        as yourself."; Moses's detruecaser does the same)."""
        if not self.recase_capitals:
            return translations
        text = _cleaned(text)

        def per_translation(flags):  # (B,) -> (B, 1...), against (B, K)
            return tf.reshape(flags, tf.concat([tf.shape(flags), tf.ones(
                [tf.rank(translations) - 1], tf.int32)], axis=0))

        capital_first = per_translation(tf.strings.regex_full_match(text, CAPITAL_FIRST))
        translations = tf.where(capital_first, _capitalized(translations), translations)
        caps = per_translation(_all_caps(text))
        return tf.where(caps, tf.strings.upper(translations, encoding="utf-8"), translations)

    def detokenize(self, ids):
        """The text of ids `(B, T)`: strings `(B,)`."""
        return self.tokenizer.detokenize(ids)

    def pieces(self, ids):
        """Each id's subword piece: strings of the shape of `ids`."""
        return self.tokenizer.id_to_token(ids)


def _cleaned(text):
    """`text` `(B,)` with invalid UTF-8 replaced, `INVISIBLE` characters
    dropped and whitespace as in the training text."""
    # Sentencepiece would replace invalid bytes too; doing it here makes the
    # behaviour ours, whatever the tokenizer does.
    text = tf.strings.unicode_transcode(
        text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)
    text = tf.strings.regex_replace(text, INVISIBLE, "")
    # Runs of whitespace (tabs, newlines, Unicode spaces) become one space, none
    # at the ends, as in the training text: whitespace-only is empty.
    text = tf.strings.regex_replace(text, WHITESPACE, " ")
    return tf.strings.regex_replace(text, r"^ | $", "")


def _capitalized(text):
    """`text` with its first letter a capital where it is a small one; the
    characters before it (quotes, "¿", digits) as they are."""
    head = tf.strings.regex_replace(text, r"^(?s)(\PL*\pL).*", r"\1")  # up to the letter
    rest = tf.strings.regex_replace(text, r"^(?s)\PL*\pL", "", replace_global=False)
    return tf.where(tf.strings.regex_full_match(text, SMALL_FIRST),
                    tf.strings.upper(head, encoding="utf-8") + rest, text)


def _all_caps(text):
    """bool `(B,)`: which sentences of `text` are in capitals only (`ALL_CAPS`)."""
    return tf.strings.regex_full_match(text, ALL_CAPS)


def _title_case(text):
    """bool `(B,)`: which sentences of `text` are in Title Case:
    `TITLE_CASE_WORDS` words or more that start with a capital, none with a
    small letter, a small letter somewhere (not in capitals only)."""
    first = tf.strings.regex_replace(  # each word's first character, (B, None)
        tf.strings.split(text, " "), r"^(?s)(.).*", r"\1", replace_global=False)
    capital = tf.strings.regex_full_match(first, r"\p{Lu}")
    small = tf.strings.regex_full_match(first, r"\p{Ll}")
    return ((tf.reduce_sum(tf.cast(capital, tf.int32), axis=1) >= TITLE_CASE_WORDS)
            & ~tf.reduce_any(small, axis=1)
            & tf.strings.regex_full_match(text, r".*\p{Ll}.*"))
