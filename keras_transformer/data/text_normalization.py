"""The vocabulary's text normalization: Unicode NFC as sentencepiece rules.

The same sentence can arrive in more than one Unicode form: "café" as four code
points (precomposed U+00E9, as most text is written) or as five ("e" followed by
the combining acute U+0301, as macOS and some PDFs and keyboards write it). A
vocabulary learned from one form splits the other into rare pieces or bytes, and
the model mistranslates it ("The café is near Jérusalem." came out as "Y la caída
es el pártate de la manera." in decomposed form, "La cueva está cerca de Justo."
precomposed). NFC maps both to the precomposed form and rewrites nothing else a
writer chose (unlike NFKC, which also rewrites ligatures, full-width forms,
superscripts and the like).

tensorflow-text's NFC op needs ICU at run time; sentencepiece instead compiles a
table of string rewrites into the model proto (its "precompiled charsmap"), and
applies it, leftmost-longest match first, before every tokenization: in the
trainer, in `tf.data`, and in an exported SavedModel with no op beyond the
tokenizer's own. `nfc_rules` is that table: every string of up to one base
character and its combining marks, in any order and partial composition that is
canonically equivalent, mapped to its NFC. Like sentencepiece's own NFKC, it does
not reorder marks across longer runs than a single character's decomposition.

The rules also drop U+FEFF, the byte order mark that some editors write at the
start of a UTF-8 file (and once a zero-width no-break space, a role U+2060 has
taken): a sentence read from such a file would otherwise start with it.
"""

import functools
import itertools
import unicodedata

BYTE_ORDER_MARK = "\ufeff"

# Hangul syllables compose algorithmically from their jamo (Unicode Sec. 3.12).
_HANGUL_SYLLABLES = range(0xAC00, 0xD7A4)


@functools.lru_cache(maxsize=1)
def nfc_rules():
    """The (source, target) string rewrites that put text in NFC.

    Returns:
        A tuple of `(source, target)` pairs, sorted by source: every source is a
        string that is not in NFC, every target is `unicodedata.normalize("NFC",
        source)` (or "" for U+FEFF).
    """
    rules = {BYTE_ORDER_MARK: ""}
    for code_point in range(0x110000):
        if 0xD800 <= code_point < 0xE000:  # surrogates: not characters
            continue
        char = chr(code_point)
        if (not unicodedata.decomposition(char)
                and code_point not in _HANGUL_SYLLABLES):
            continue
        for source in _equivalent_spellings(char):
            target = unicodedata.normalize("NFC", source)
            if source != target:
                rules[source] = target
    return tuple(sorted(rules.items()))


def _equivalent_spellings(char):
    """`char` and the strings canonically equivalent to it that a writer might
    use: its decomposition, with its marks in any order that keeps the meaning,
    and with a leading part already composed ("ê" + U+0323 for "ệ")."""
    spellings = {char}
    decomposed = unicodedata.normalize("NFD", char)
    nfc = unicodedata.normalize("NFC", char)
    base, marks = decomposed[0], decomposed[1:]
    for order in set(itertools.permutations(marks)):
        for split in range(len(order) + 1):
            head = unicodedata.normalize("NFC", base + "".join(order[:split]))
            spelling = head + "".join(order[split:])
            if unicodedata.normalize("NFC", spelling) == nfc:
                spellings.add(spelling)
    return spellings


def write_rule_tsv(rules, path):
    """Writes `rules` in sentencepiece's `normalization_rule_tsv` format: a line
    a rule, source and target as space-separated hex code points, tab between."""
    with open(path, "w", encoding="ascii") as f:
        for source, target in rules:
            f.write(f"{_code_points(source)}\t{_code_points(target)}\n")


def _code_points(text):
    return " ".join(f"{ord(char):X}" for char in text)
