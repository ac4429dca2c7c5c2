"""Slow, obviously-correct twins: of the layers in NumPy, written from the paper,
and of the request text's casing in Python."""

import unicodedata

import numpy as np


def positional_encoding(length, d_model, start=0):
    """Sec. 3.5, one entry at a time."""
    pe = np.zeros((length, d_model))
    for pos in range(start, start + length):
        for channel in range(d_model):
            i = channel // 2
            angle = pos / 10000 ** (2 * i / d_model)
            pe[pos - start, channel] = np.sin(angle) if channel % 2 == 0 else np.cos(angle)
    return pe


def layer_norm(x, gamma, beta, epsilon):
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def attention(query, value, weights, mask=None):
    """Sec. 3.2 head by head. `weights` are the layer's eight arrays (keras layout);
    `mask` is boolean (B, T, S), True where attending is allowed."""
    wq, bq, wk, bk, wv, bv, wo, bo = weights
    num_heads = wq.shape[1]
    heads = []
    for h in range(num_heads):
        q = query @ wq[:, h] + bq[h]  # (B, T, d_k)
        k = value @ wk[:, h] + bk[h]  # (B, S, d_k)
        v = value @ wv[:, h] + bv[h]  # (B, S, d_v)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])  # (B, T, S)
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        heads.append(softmax(scores) @ v)
    concat = np.concatenate(heads, axis=-1)  # (B, T, h * d_v)
    return concat @ wo.reshape(-1, wo.shape[-1]) + bo


def feed_forward(x, w1, b1, w2, b2):
    """Sec. 3.3: max(0, x W1 + b1) W2 + b2."""
    return np.maximum(0.0, x @ w1 + b1) @ w2 + b2


def causal_mask(length):
    return np.tril(np.ones((length, length), bool))[None]


def lowbias32(x):
    """C. Wellons's 32-bit integer hash, element-wise on a uint32 array."""
    x = np.asarray(x, dtype=np.uint32)
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def random_bits(shape, seed):
    """The dropout mask bits, written out: two keys from the seed words, then
    `mix(mix(index ^ key0) + key1)` for each element's row-major index."""
    golden = np.uint32(0x9E3779B9)
    with np.errstate(over="ignore"):
        seed0, seed1 = (np.uint32(int(s) % 2**32) for s in seed)
        key0 = lowbias32(seed0 + golden)
        key1 = lowbias32((seed1 * golden) ^ key0)
        index = np.arange(int(np.prod(shape)), dtype=np.uint32)
        return (lowbias32(lowbias32(index ^ key0) + key1)).reshape(shape)


def restored_case(text, spellings, sentence_starts=True):
    """`data.Casing(spellings, sentence_starts).restore` of one cleaned
    sentence, word by word."""
    def is_letter(char):
        return unicodedata.category(char)[0] in "LM"

    words, lettered, previous_ends = [], False, False
    for word in text.lower().split(" "):
        letter_at = [i for i, char in enumerate(word) if is_letter(char)]
        if not letter_at:
            words.append(word)
            previous_ends = any(char in ".!?" for char in word)
            continue
        before, letters, after = (word[:letter_at[0]], word[letter_at[0]:letter_at[-1] + 1],
                                  word[letter_at[-1] + 1:])
        letters = spellings.get(letters, letters)
        if sentence_starts and (not lettered or previous_ends
                                or any(char in "\"“„«‹「¿¡" for char in before)):
            letters = letters[0].upper() + letters[1:]
        words.append(before + letters + after)
        lettered, previous_ends = True, any(char in ".!?" for char in after)
    return " ".join(words)


def capitalized_like(source, translation):
    """`translation` with its first letter a capital where it is a small one
    and `source`'s first letter is a capital (`serving_text.RequestText.
    in_source_case`), character by character."""
    def first_letter(text):
        return next((i for i, char in enumerate(text) if unicodedata.category(char)[0] == "L"),
                    None)

    at, to = first_letter(source), first_letter(translation)
    if (at is None or to is None or unicodedata.category(source[at]) not in ("Lu", "Lt")
            or unicodedata.category(translation[to]) != "Ll"):
        return translation
    return translation[:to] + translation[to].upper() + translation[to + 1:]
