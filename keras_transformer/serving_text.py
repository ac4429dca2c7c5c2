"""A translator's text in and out: the request limits, the normalization of the
text, subword tokenization, and back to text.

Bad input is answered, not crashed on: runs of whitespace (tabs, newlines,
Unicode spaces) become one space, ends stripped, as in the training text;
invalid UTF-8 bytes become U+FFFD. A request of more than `max_batch_size`
sentences, or with a sentence of more than `max_input_chars` characters, is
refused with an `InvalidArgument` error naming the limit, before any
tokenization or search.
"""

import tensorflow as tf


class RequestText:
    """The text side of a `serving.Translator`, inside its graphs.

    Args:
        tokenizer: the `SubwordTokenizer` shared by source and target; None for
            an ids-only translator (only `within_batch_limit` then).
        max_batch_size: the most sentences (or id rows) a request may hold.
        max_input_chars: the most characters a request's sentence may have.
    """

    def __init__(self, tokenizer, max_batch_size, max_input_chars):
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_input_chars = max_input_chars

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
        longest = tf.reduce_max(  # 0 for an empty batch
            tf.concat([tf.strings.length(text, unit="UTF8_CHAR"), [0]], axis=0))
        check = tf.debugging.assert_less_equal(
            longest, self.max_input_chars,
            message=f"a sentence of the request is longer than max_input_chars="
                    f"{self.max_input_chars} characters (a limit set at export). Longest:")
        with tf.control_dependencies([check]):
            text = tf.identity(text)
        # Sentencepiece would replace invalid bytes too; doing it here makes
        # the behaviour ours, whatever the tokenizer does.
        text = tf.strings.unicode_transcode(
            text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)
        # Runs of whitespace (tabs, newlines, Unicode spaces) become one space,
        # none at the ends, as in the training text: whitespace-only is empty.
        text = tf.strings.regex_replace(text, r"[\s\pZ]+", " ")
        text = tf.strings.regex_replace(text, r"^ | $", "")
        return self.tokenizer.tokenize(text)

    def detokenize(self, ids):
        """The text of ids `(B, T)`: strings `(B,)`."""
        return self.tokenizer.detokenize(ids)

    def pieces(self, ids):
        """Each id's subword piece: strings of the shape of `ids`."""
        return self.tokenizer.id_to_token(ids)
