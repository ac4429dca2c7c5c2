"""The reserved token ids of the shared subword vocabulary, the one home of each.

`data.SubwordTokenizer` trains its vocabularies with these ids; the model masks
`PAD_ID`, the losses and metrics skip it, and decoding starts from `BOS_ID` and
stops at `EOS_ID`.
"""

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
