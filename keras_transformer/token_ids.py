"""The reserved token ids of the shared subword vocabulary, the one home of each.

`data.SubwordTokenizer` trains its vocabularies with these ids; the model masks
`PAD_ID`, the losses and metrics skip it, and decoding starts from `BOS_ID` and
stops at `EOS_ID`.
"""

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
# The 256 byte tokens of a vocabulary with byte fallback (each byte of text
# outside the vocabulary becomes one).
BYTE_TOKENS = 256


def smallest_vocab_size(byte_fallback=True):
    """The fewest ids a vocabulary can have: the reserved ids, the byte tokens
    (with `byte_fallback`) and one piece."""
    return len((PAD_ID, UNK_ID, BOS_ID, EOS_ID)) + (BYTE_TOKENS if byte_fallback else 0) + 1
