"""Builds the English-German corpus in benchmarks/corpora/messages-en-de/.

Free software ships its user-visible messages (compiler diagnostics, errors, --help
texts, a few dialog labels) with translations: each German catalog
(de/LC_MESSAGES/DOMAIN.mo) maps an English msgid to a German msgstr, written by the
Translation Project's and the projects' own translators under the package's free
license. This script gathers those pairs from a fixed list of Debian packages into a
second real parallel corpus, English -> German, beside the bundled English-Spanish
Bible (scripts/build_bundled_corpus.py).

It needs apt-get and dpkg-deb (any Debian or Ubuntu), the network access apt uses,
and nothing but Python's standard library. Nothing is installed: each package is
fetched with `apt-get download` and unpacked with `dpkg-deb -x` into a temporary
directory, which is removed afterwards.

    apt-get update
    python scripts/build_messages_corpus.py            # the archive's current versions
    python scripts/build_messages_corpus.py \\
        --versions-from benchmarks/corpora/messages-en-de/manifest.json   # same versions

The result is committed, so nobody needs to run this to use the corpus. The build is
deterministic: the same package versions give byte-identical files. Debian replaces
versions in a stable release when it updates a package; --versions-from asks apt for
the versions a manifest records, which works while the archive still has them.

Steps:
  1. Every catalog de/LC_MESSAGES/*.mo in each package (sorted by path; de_AT, de_CH
     and LC_TIME catalogs are not read) is parsed in its binary format, its text
     decoded with the charset its header names.
  2. Each entry becomes one pair: the header (empty msgid) is skipped; a message
     context (text before \x04 in the msgid) is dropped, and so is gnupg's
     pseudo-context (a lower-case "|pinentry-label|" before the text); a plural
     entry gives its singular msgid and msgstr[0].
  3. Whitespace runs (newlines and tabs included) become one space and both ends are
     stripped. Keyboard accelerator markers are removed only in the two catalogs of
     the set that have them (ACCELERATORS), by rules that leave identifiers alone:
     vim's '&' before a letter ("&Yes" -> "Yes"), and vim's and gnupg2's '_' before
     a letter at the start of a word when it is the text's only '_' ("_Cancel",
     "Eingabe _Methoden"; not "GPG_TTY" or "_io ... _name"). Everywhere else '_'
     and '&' are part of the text (C identifiers, "AT&T", URLs) and stay.
  4. A pair is dropped (the first rule that applies is counted) when its text cannot
     be decoded, either side is empty, source == target (untranslated), the German
     contains the whole English text of MIN_CHARS_UNTRANSLATED characters or more
     (also untranslated: "Interner Fehler: <English>" in gcc), either side
     has a control or format character (Unicode category Cc, Cf, Co or Cs) left after
     step 3, either side is longer than MAX_CHARS characters, or the longer side is
     more than MAX_LENGTH_RATIO times the shorter (placeholders such as gnupg's
     "13" for a column width, or a translator's note).
  5. Pairs are deduplicated on the English side, packages in sorted order: the first
     German seen is kept, so the same English text never lands in two splits.
  6. The split is by the English text: sha256(en) first 8 bytes big-endian modulo 20
     is 0 for dev, 1 for test and anything else for train.

Output: {train,dev,test}.tsv.gz (English TAB German, one pair a line, in the order
read: package, catalog, then the catalog's msgid order) and manifest.json (package
versions and licenses, the rules, counts, file hashes).
"""

import argparse
import collections
import fnmatch
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unicodedata

from build_bundled_corpus import SPLIT_MODULUS
from build_bundled_corpus import split_of_key
from build_bundled_corpus import write_splits

# Debian packages whose German catalogs are read, in processing order (sorted). Each
# ships at least one de/LC_MESSAGES/*.mo (the *-l10n and *-locales packages hold
# only translations); together they give about 39,000 pairs after cleaning.
PACKAGES = (
    "apt",
    "bash",
    "binutils-common",
    "coreutils",
    "diffutils",
    "dpkg",
    "e2fsprogs-l10n",
    "findutils",
    "gcc-12-locales",
    "gettext",
    "git",
    "gnupg-l10n",
    "grep",
    "libc-l10n",
    "make",
    "sed",
    "tar",
    "util-linux-locales",
    "vim-runtime",
    "wget",
)
LANGUAGE = "de"
MAX_CHARS = 300
MAX_LENGTH_RATIO = 3.0
# An English text this long found verbatim inside its German is untranslated: gcc's
# German catalog labels its internal errors "Interner Fehler: <the English>".
MIN_CHARS_UNTRANSLATED = 20
# Catalog domain -> the accelerator markers it uses; see step 3 of the docstring.
ACCELERATORS = {"gnupg2": "_", "vim": "&_"}
# Licenses read by hand: copyright files that are not machine-readable (DEP-5), and
# findutils, whose catch-all "Files: *" paragraph gives its manual's license.
LICENSE_BY_HAND = {
    "binutils-common": ("GPL-3+", "read by hand from the copyright file"),
    # gcc-12-locales' doc directory links to gcc-12-base's.
    "gcc-12-base": ("GPL-3+", "read by hand from the copyright file"),
    "gettext": ("GPL-3+", "read by hand from the copyright file (gettext tools)"),
    "libc-l10n": ("LGPL-2.1+", "read by hand from the copyright file"),
    "findutils": (
        "GPL-3+",
        'read by hand: the copyright file\'s "Files: *" says GFDL-NIV-1.3+ (the '
        'manual); the programs ("Files: find/*", ...) and their translations are '
        "GPL-3+",
    ),
    "wget": ("GPL-3+", "read by hand from the copyright file"),
}
# gnupg's pseudo-context prefix, e.g. "|pinentry-label|_Cancel"; an upper-case one
# ("|FILE|read options from FILE") names an option's argument and is translated.
_PSEUDO_CONTEXT = re.compile(r"^\|[a-z]+(?:-[a-z]+)*\|")
_AMPERSAND = re.compile(r"&(?=[^\W\d_])")
_UNDERSCORE = re.compile(r"^([^_]*(?:^| ))_(?=[^\W\d_])([^_]*)$")
_CATALOG = re.compile(r"(?:^|/)" + LANGUAGE + r"/LC_MESSAGES/[^/]+\.mo$")
_CHARSET = re.compile(rb"charset=([A-Za-z0-9_.:-]+)")
_CONTROL_CATEGORIES = ("Cc", "Cf", "Co", "Cs")
_DROP_RULES = (
    "undecodable",
    "empty",
    "source_equals_target",
    "source_inside_target",
    "control_character",
    "too_long",
    "length_ratio",
)


def run(command, cwd=None, hint=""):
    try:
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError:
        sys.exit(
            f"build_messages_corpus.py: {command[0]} not found; this needs Debian's "
            "apt-get and dpkg-deb"
        )
    if result.returncode != 0:
        sys.exit(
            f"build_messages_corpus.py: `{' '.join(command)}` failed:\n"
            f"{result.stderr.strip()}{hint}"
        )
    return result.stdout


def download(packages, pins, directory):
    """`apt-get download`s `packages` into `directory`; returns {package: .deb path}."""
    os.makedirs(directory, exist_ok=True)
    specs = [f"{p}={pins[p]}" if p in pins else p for p in packages]
    run(
        ["apt-get", "download", *specs], cwd=directory,
        hint="\n(run `apt-get update` first; a pinned version may have left the archive)",
    )
    debs = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".deb"):
            path = os.path.join(directory, name)
            package = run(["dpkg-deb", "-f", path, "Package"]).strip()
            if package in packages:
                debs[package] = path
    missing = sorted(set(packages) - set(debs))
    if missing:
        sys.exit(f"build_messages_corpus.py: apt-get download gave no .deb for {missing}")
    return debs


def unpack(deb, directory):
    """Unpacks `deb` into `directory`; returns its control fields that we record."""
    os.makedirs(directory, exist_ok=True)
    run(["dpkg-deb", "-x", deb, directory])
    fields = {}
    for name in ("Package", "Version", "Source"):
        fields[name] = run(["dpkg-deb", "-f", deb, name]).strip()
    # "Source: gcc-12 (12.2.0-14)" names the version only when it differs.
    fields["Source"] = fields["Source"].split(" ")[0] or fields["Package"]
    return fields


def catalogs(root):
    """Relative paths of the German catalogs under `root`, sorted; no symlinks."""
    found = []
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            if _CATALOG.search(relative) and not os.path.islink(path):
                found.append(relative)
    return sorted(found)


def read_mo(path):
    """Returns (charset, [(msgid bytes, msgstr bytes)]) of a GNU .mo file."""
    with open(path, "rb") as f:
        data = f.read()
    for order in ("<", ">"):
        magic, _, count, ids, strs = struct.unpack(order + "5I", data[:20])
        if magic == 0x950412DE:
            break
    else:
        raise ValueError(f"{path}: not a GNU .mo file")

    def string(table, index):
        length, offset = struct.unpack(order + "2I", data[table + 8 * index:][:8])
        return data[offset:offset + length]

    entries = [(string(ids, i), string(strs, i)) for i in range(count)]
    charset = "utf-8"
    for msgid, msgstr in entries:
        if msgid == b"":
            match = _CHARSET.search(msgstr)
            if match and match.group(1).upper() != b"CHARSET":
                charset = match.group(1).decode("ascii")
    return charset, entries


def strip_accelerators(text, markers):
    if "&" in markers:
        text = _AMPERSAND.sub("", text)  # vim's catalog has no literal "&&"
    if "_" in markers:
        # Only the text's one '_', starting a word: else it belongs to an identifier.
        text = _UNDERSCORE.sub(r"\1\2", text)
    return text


def clean(msgid, msgstr, charset, domain):
    """Returns (drop rule or None, en, de) for one catalog entry."""
    try:
        en = msgid.decode(charset)
        de = msgstr.decode(charset)
    except (UnicodeDecodeError, LookupError):
        return "undecodable", None, None
    en = en.split("\x04", 1)[-1]  # context
    en = en.split("\x00", 1)[0]  # plural: the singular msgid ...
    de = de.split("\x00", 1)[0]  # ... and msgstr[0]
    en, de = _PSEUDO_CONTEXT.sub("", en), _PSEUDO_CONTEXT.sub("", de)
    en, de = " ".join(en.split()), " ".join(de.split())
    markers = ACCELERATORS.get(domain, "")
    en, de = strip_accelerators(en, markers), strip_accelerators(de, markers)
    if not en or not de:
        return "empty", en, de
    if en == de:
        return "source_equals_target", en, de
    if len(en) >= MIN_CHARS_UNTRANSLATED and en in de:
        return "source_inside_target", en, de
    if any(unicodedata.category(c) in _CONTROL_CATEGORIES for c in en + de):
        return "control_character", en, de
    if max(len(en), len(de)) > MAX_CHARS:
        return "too_long", en, de
    if max(len(en), len(de)) / min(len(en), len(de)) > MAX_LENGTH_RATIO:
        return "length_ratio", en, de
    return None, en, de


def _dep5_paragraphs(text):
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        fields, key = {}, None
        for line in block.split("\n"):
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, value = line.split(":", 1)
                key = key.strip().lower()
                fields[key] = value.strip()
        paragraphs.append(fields)
    return paragraphs


def license_of(package, copyright_text):
    """A short license name for `package`'s translations, and where it came from.

    A machine-readable (DEP-5) copyright file gives the license of the last "Files"
    paragraph matching "po/de.po" (as DEP-5 says: the last match wins), which is
    "Files: *" unless the file names the translations. Others are read by hand.
    """
    if package in LICENSE_BY_HAND:
        return LICENSE_BY_HAND[package]
    if not copyright_text.startswith("Format:"):
        sys.exit(
            f"build_messages_corpus.py: {package}'s copyright file is not "
            "machine-readable; add its license to LICENSE_BY_HAND"
        )
    license_name, matched = None, None
    for fields in _dep5_paragraphs(copyright_text):
        if "files" not in fields or "license" not in fields:
            continue
        for pattern in fields["files"].split():
            if fnmatch.fnmatchcase("po/de.po", pattern):
                license_name = fields["license"].split("\n")[0].strip()
                matched = pattern
    if license_name is None:
        sys.exit(f"build_messages_corpus.py: no Files paragraph in {package}'s copyright")
    return license_name, f'copyright file (DEP-5, "Files: {matched}")'


def copyright_path(root, package):
    """The copyright file in an unpacked package, or the package its doc dir links to."""
    doc = os.path.join(root, "usr", "share", "doc", package)
    if os.path.islink(doc):
        return None, os.path.basename(os.readlink(doc).rstrip("/"))
    return os.path.join(doc, "copyright"), None


def debian_release():
    try:
        with open("/etc/os-release", encoding="utf-8") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return "unknown"


def pinned_versions(manifest_path):
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    pins = {}
    for entry in manifest["packages"]:
        pins[entry["package"]] = entry["version"]
        if "copyright_from" in entry:
            pins[entry["copyright_from"]["package"]] = entry["copyright_from"]["version"]
    return pins


def build(work_dir, pins):
    debs = download(PACKAGES, pins, os.path.join(work_dir, "debs"))
    unpacked, packages = {}, []
    for package in PACKAGES:
        root = os.path.join(work_dir, "root", package)
        unpacked[package] = (root, unpack(debs[package], root))
    # Doc directories that are symlinks into a sibling package of the same source.
    linked = {}
    for package in PACKAGES:
        _, target = copyright_path(unpacked[package][0], package)
        if target:
            linked[package] = target
    if linked:
        targets = sorted(set(linked.values()))
        target_debs = download(targets, pins, os.path.join(work_dir, "debs-copyright"))
        for target in targets:
            root = os.path.join(work_dir, "root-copyright", target)
            unpacked[target] = (root, unpack(target_debs[target], root))

    counts = collections.Counter({f"dropped_{rule}": 0 for rule in _DROP_RULES})
    counts.update(entries_read=0, catalog_headers_skipped=0, dropped_duplicate_source=0)
    seen = set()
    rows = collections.defaultdict(list)
    for package in PACKAGES:
        root, fields = unpacked[package]
        entry = {"package": package, "version": fields["Version"]}
        if fields["Source"] != package:
            entry["source_package"] = fields["Source"]
        license_package = linked.get(package, package)
        license_root, license_fields = unpacked[license_package]
        path, _ = copyright_path(license_root, license_package)
        with open(path, encoding="utf-8") as f:
            copyright_text = f.read()
        entry["license"], entry["license_from"] = license_of(
            license_package, copyright_text
        )
        if license_package != package:
            entry["copyright_from"] = {
                "package": license_package, "version": license_fields["Version"]
            }
        entry["copyright_sha256"] = hashlib.sha256(
            copyright_text.encode("utf-8")
        ).hexdigest()
        entry["catalogs"] = catalogs(root)
        if not entry["catalogs"]:
            sys.exit(f"build_messages_corpus.py: {package} has no {LANGUAGE} catalog")
        read = kept = 0
        for relative in entry["catalogs"]:
            domain = os.path.basename(relative)[:-len(".mo")]
            charset, entries = read_mo(os.path.join(root, relative))
            for msgid, msgstr in entries:
                if msgid == b"":
                    counts["catalog_headers_skipped"] += 1
                    continue
                read += 1
                rule, en, de = clean(msgid, msgstr, charset, domain)
                if rule:
                    counts[f"dropped_{rule}"] += 1
                    continue
                if en in seen:
                    counts["dropped_duplicate_source"] += 1
                    continue
                seen.add(en)
                kept += 1
                assert "\t" not in en + de and "\n" not in en + de
                rows[split_of_key(en)].append(f"{en}\t{de}\n")
        entry["entries_read"], entry["pairs_kept"] = read, kept
        counts["entries_read"] += read
        packages.append(entry)
    for split in ("train", "dev", "test"):
        counts[f"pairs_{split}"] = len(rows[split])
    return packages, counts, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--output-dir",
        default=os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "corpora",
            "messages-en-de",
        ),
    )
    parser.add_argument(
        "--versions-from", metavar="MANIFEST",
        help="download the package versions this manifest.json records",
    )
    parser.add_argument(
        "--work-dir",
        help="where to download and unpack (kept); default: a temporary directory",
    )
    args = parser.parse_args()
    pins = pinned_versions(args.versions_from) if args.versions_from else {}

    work_dir = args.work_dir or tempfile.mkdtemp(prefix="messages-corpus-")
    try:
        packages, counts, rows = build(work_dir, pins)
    finally:
        if not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)

    files = write_splits(args.output_dir, rows)
    manifest = {
        "name": "debian-messages-en-de",
        "columns": ["en", "de"],
        "description": (
            "English msgids and German msgstrs of the gettext message catalogs "
            f"({LANGUAGE}/LC_MESSAGES/*.mo) shipped by the Debian packages below: "
            "compiler diagnostics, command-line help, error messages, a few dialog labels"
        ),
        "debian_release": debian_release(),
        "builder": "scripts/build_messages_corpus.py",
        "packages": packages,
        "cleaning_rules": [
            "skip the catalog header (empty msgid)",
            "msgid context (text before \\x04) removed",
            "plural entries: singular msgid and msgstr[0]",
            "gnupg's lower-case pseudo-context prefix (\"|pinentry-label|\") removed",
            "whitespace runs (Python str.split(): newlines and tabs included) "
            "collapsed to one space, both ends stripped",
            "accelerator markers removed only in the vim and gnupg2 catalogs: '&' "
            "before a letter (vim); '_' before a letter at the start of a word when it "
            "is the text's only '_' (vim, gnupg2); left as they are elsewhere",
            "dropped, first matching rule counted: undecodable text; either side "
            "empty; source == target; the English text, if at least "
            f"{MIN_CHARS_UNTRANSLATED} characters long, found verbatim inside the "
            "German (untranslated, e.g. gcc's \"Interner Fehler: <English>\"); a "
            "character of Unicode category Cc, Cf, Co or Cs; either side longer than "
            f"{MAX_CHARS} characters; longer side more than {MAX_LENGTH_RATIO:g} "
            "times the shorter (characters)",
            "deduplicated on the English side in package order (sorted names), "
            "catalogs by path, entries in catalog order: the first German is kept",
        ],
        "accelerators": ACCELERATORS,
        "max_chars": MAX_CHARS,
        "max_length_ratio": MAX_LENGTH_RATIO,
        "min_chars_untranslated": MIN_CHARS_UNTRANSLATED,
        "split_rule": (
            f"sha256(English text, UTF-8) first 8 bytes big-endian mod {SPLIT_MODULUS}: "
            "0 = dev, 1 = test, else train"
        ),
        "counts": dict(sorted(counts.items())),
        "files": files,
    }
    with open(os.path.join(args.output_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, ensure_ascii=False)
        f.write("\n")
    print(json.dumps({"counts": manifest["counts"], "files": files}, indent=2))


if __name__ == "__main__":
    main()
