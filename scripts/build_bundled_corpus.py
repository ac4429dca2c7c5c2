"""Builds the bundled English-Spanish corpus in keras_transformer/data/bundled/.

The corpus is the Bible aligned verse by verse: the World English Bible (English,
SWORD module engWEB2015eb) and the Reina-Valera 1909 (Spanish, spaRV1909eb), both in
the public domain. Debian ships both modules and the exporter:

    apt-get update && apt-get install -y libsword-utils sword-text-web sword-text-sparv
    python scripts/build_bundled_corpus.py

The result is committed, so nobody needs to run this to use the corpus. The build is
deterministic: the same module versions give byte-identical files.

Steps:
  1. `mod2imp MODULE` prints each verse as `$$$Book C:V` followed by OSIS markup.
  2. Markup is stripped: footnotes, section headings and speaker labels are dropped
     (they are editorial, not translation); canonical psalm titles are kept, because
     the Reina-Valera prints them as part of verse 1.
  3. Verses are aligned by reference; a verse missing or empty on either side is
     dropped (the WEB's deuterocanonical books, verses the WEB moves or omits), and so
     is a pair whose character lengths differ by more than MAX_LENGTH_RATIO, which
     flags the few places where the two versifications disagree.
  4. The Reina-Valera prints the opening word or words of each chapter in capitals
     ("EN el principio", "Y LLAMÓ Jehová", "DE SIETE años"): a printer's convention,
     not the text's casing, and one the English does not share. Those words are cased
     as the corpus writes them elsewhere (`recase_chapter_opening`), so that a model
     does not learn to shout the first word of a famous verse.
  5. The split is by chapter so that neighbouring verses never straddle two splits:
     sha256("Book C") modulo 20 is 0 for dev, 1 for test and anything else for train.

Output: {train,dev,test}.tsv.gz (English TAB Spanish, one verse a line, in canonical
order) and manifest.json (counts, module versions, the split rule, file hashes).
"""

import argparse
import collections
import gzip
import hashlib
import html
import json
import os
import re
import subprocess
import sys

ENGLISH_MODULE = "engWEB2015eb"
SPANISH_MODULE = "spaRV1909eb"
MAX_LENGTH_RATIO = 3.0
SPLIT_MODULUS = 20
SPLIT_OF_BUCKET = {0: "dev", 1: "test"}  # every other bucket is train

_KEY = re.compile(r"^\$\$\$(.+) (\d+):(\d+)$")
# Elements dropped with their content: editorial additions, not translated text.
_DROPPED = re.compile(
    r"<note\b.*?</note>"
    r"|<speaker\b.*?</speaker>"
    r'|<title\b(?![^>]*canonical="true")[^>]*>.*?</title>',
    re.DOTALL,
)
# Elements that wrap words inside running text (Strong's numbers, quotations,
# names): their tags vanish and the text closes up.
_INLINE_TAG = re.compile(r"</?(?:w|q|seg|name|title|hi|foreign|divineName)\b[^>]*>")
_ANY_TAG = re.compile(r"<[^>]*>")
# Every other tag (paragraph and line milestones, line breaks, notes removed above,
# the Reina-Valera's <transChange>) separates words: a space goes where one is
# missing between two words, and nowhere else.
_BOUNDARY = "\x00"
# Closing punctuation, and a closing quote after a sentence's end, never follow a
# space (one appears where a dropped footnote stood between them and the text).
_SPACE_BEFORE_CLOSING = re.compile(r"\s+([,.;:!?)\]])|(?<=[.,;:!?’])\s+(?=”)")


def read_module(module):
    """Returns {(book, chapter, verse): raw OSIS markup} from `mod2imp module`."""
    try:
        output = subprocess.run(
            ["mod2imp", module], check=True, capture_output=True
        ).stdout.decode("utf-8")
    except FileNotFoundError:
        sys.exit(
            "build_bundled_corpus.py: mod2imp not found; run `apt-get install -y "
            "libsword-utils sword-text-web sword-text-sparv`"
        )
    verses = {}
    key = None
    lines = []
    for line in output.split("\n") + ["$$$[end]"]:
        if line.startswith("$$$"):
            if key is not None:
                verses[key] = " ".join(lines)
            match = _KEY.match(line)
            key = None
            if match and int(match.group(2)) > 0 and int(match.group(3)) > 0:
                key = (match.group(1), int(match.group(2)), int(match.group(3)))
            lines = []
        elif key is not None:
            lines.append(line)
    return verses


def strip_markup(osis):
    """Plain text of one verse's OSIS markup, on one line."""
    text = _DROPPED.sub(_BOUNDARY, osis)
    text = _INLINE_TAG.sub("", text)
    text = _ANY_TAG.sub(_BOUNDARY, text)
    text = html.unescape(text)
    # A boundary between two visible characters becomes a space unless one is there.
    text = re.sub(r"(?<=\S)\x00+(?=[\w“‘¿¡(])", " ", text)
    text = text.replace(_BOUNDARY, "")
    text = " ".join(text.split())
    return _SPACE_BEFORE_CLOSING.sub(lambda match: match.group(1) or "", text)


_UPPER = "A-ZÁÉÍÓÚÑÜÂÊÎÔÛ"
# The chapter's opening capitals: the first run of words of two or more capitals.
_OPENING_CAPITALS = re.compile(rf"(?<!\w)[{_UPPER}]{{2,}}(?:\s+[{_UPPER}]{{2,}})*(?!\w)")
_WORD = re.compile(r"\w+")
# Text before a word that starts a sentence: nothing, or a sentence's end (a psalm's
# title, "Salmo de David. "), then opening marks.
_SENTENCE_START = re.compile(r"(?:^|[.!?:]\s+)[¿¡«“‘(]*$")


def usual_casing(texts):
    """{word in small letters: its most frequent form inside a sentence} over
    `texts`, so that "jehová" maps to "Jehová", "los" to "los" and "jah" to "JAH"."""
    forms = collections.defaultdict(collections.Counter)
    for text in texts:
        for match in _WORD.finditer(text):
            if not _SENTENCE_START.search(text[: match.start()]):
                forms[match.group().lower()][match.group()] += 1
    return {word: counts.most_common(1)[0][0] for word, counts in forms.items()}


def recase_chapter_opening(text, casing, english=""):
    """`text`, a chapter's first verse, with its opening capitals written as `casing`
    (from `usual_casing`) writes each word, with a capital where a sentence starts:
    "EN el principio" -> "En el principio", "Y LLAMÓ Jehová" -> "Y llamó Jehová",
    "Salmo de David. JEHOVÁ, oye" -> "Salmo de David. Jehová, oye". A word the
    English verse writes in capitals too (Psalm 119's "ALEPH. BIENAVENTURADOS los")
    is left as it is, and the capitals after it are the opening ones."""
    english_words = english.split()
    match = next(
        (run for run in _OPENING_CAPITALS.finditer(text)
         if any(word not in english_words for word in run.group().split())),
        None,
    )
    if match is None:
        return text

    def recase(word_match):
        word = word_match.group()
        if word in english_words:
            return word
        form = casing.get(word.lower(), word.lower())
        start = match.start() + word_match.start()
        if _SENTENCE_START.search(text[:start]):
            form = form[0].upper() + form[1:]
        return form

    return text[: match.start()] + _WORD.sub(recase, match.group()) + text[match.end():]


def split_of_key(key):
    """The split of every pair that shares `key` (a chapter, a message): its
    sha256 bucket, so that a rebuild puts each where it was."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return SPLIT_OF_BUCKET.get(int.from_bytes(digest[:8], "big") % SPLIT_MODULUS, "train")


def split_of(book, chapter):
    return split_of_key(f"{book} {chapter}")


def package_version(package):
    try:
        return subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", package],
            check=True, capture_output=True, text=True,
        ).stdout
    except (FileNotFoundError, subprocess.CalledProcessError):
        return "unknown"


def write_splits(output_dir, rows):
    """Writes `rows[split]` (TSV lines) to `output_dir/{split}.tsv.gz`, byte for byte
    reproducibly; returns the manifest's `files` entry."""
    os.makedirs(output_dir, exist_ok=True)
    files = {}
    for split in ("train", "dev", "test"):
        name = f"{split}.tsv.gz"
        data = "".join(rows[split]).encode("utf-8")
        # mtime=0 and no file name in the header keep the bytes reproducible.
        with open(os.path.join(output_dir, name), "wb") as raw, gzip.GzipFile(
            filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9
        ) as compressed:
            compressed.write(data)
        files[name] = {
            "pairs": len(rows[split]),
            "sha256_uncompressed": hashlib.sha256(data).hexdigest(),
        }
    return files


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--output-dir",
        default=os.path.join(
            os.path.dirname(__file__), "..", "keras_transformer", "data", "bundled"
        ),
    )
    args = parser.parse_args()

    english = read_module(ENGLISH_MODULE)
    spanish = read_module(SPANISH_MODULE)
    counts = collections.Counter(
        dropped_missing_in_english=0, dropped_empty=0, dropped_length_ratio=0,
        recased_chapter_openings=0,
    )
    counts["english_verses"] = len(english)
    counts["spanish_verses"] = len(spanish)
    spanish_text = {key: strip_markup(osis) for key, osis in spanish.items()}
    casing = usual_casing(text for key, text in spanish_text.items() if key[2] != 1)
    rows = collections.defaultdict(list)
    for key, target in spanish_text.items():  # the Reina-Valera's canonical order
        if key not in english:
            counts["dropped_missing_in_english"] += 1
            continue
        source = strip_markup(english[key])
        if key[2] == 1:
            recased = recase_chapter_opening(target, casing, source)
            counts["recased_chapter_openings"] += recased != target
            target = recased
        if not source or not target:
            counts["dropped_empty"] += 1
            continue
        ratio = max(len(source), len(target)) / min(len(source), len(target))
        if ratio > MAX_LENGTH_RATIO:
            counts["dropped_length_ratio"] += 1
            continue
        assert "\t" not in source + target and "\n" not in source + target
        rows[split_of(key[0], key[1])].append(f"{source}\t{target}\n")
    counts["dropped_missing_in_spanish"] = len(set(english) - set(spanish))
    for split in ("train", "dev", "test"):
        counts[f"pairs_{split}"] = len(rows[split])

    files = write_splits(args.output_dir, rows)
    manifest = {
        "name": "bible-en-es",
        "columns": ["en", "es"],
        "source": {
            "en": {
                "title": "World English Bible (2020 stable text)",
                "sword_module": ENGLISH_MODULE,
                "debian_package": "sword-text-web " + package_version("sword-text-web"),
                "license": "public domain",
            },
            "es": {
                "title": "Reina-Valera 1909",
                "sword_module": SPANISH_MODULE,
                "debian_package": "sword-text-sparv " + package_version("sword-text-sparv"),
                "license": "public domain",
            },
        },
        "exporter": "mod2imp (libsword-utils " + package_version("libsword-utils") + ")",
        "split_rule": (
            f'sha256("Book Chapter") first 8 bytes big-endian mod {SPLIT_MODULUS}: '
            "0 = dev, 1 = test, else train"
        ),
        "max_length_ratio": MAX_LENGTH_RATIO,
        "counts": dict(sorted(counts.items())),
        "files": files,
    }
    with open(os.path.join(args.output_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2, ensure_ascii=False)
        f.write("\n")
    print(json.dumps({"counts": manifest["counts"], "files": files}, indent=2))


if __name__ == "__main__":
    main()
