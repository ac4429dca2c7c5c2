import collections
import gzip
import hashlib
import os
import re
import sys
import types

import numpy as np
import pytest

from keras_transformer import data
from keras_transformer.data import corpora

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))


def as_pairs(dataset):
    return [
        (pair["source"].decode("utf-8"), pair["target"].decode("utf-8"))
        for pair in dataset.as_numpy_iterator()
    ]


def write(path, text, compress=False):
    raw = text.encode("utf-8") if isinstance(text, str) else text
    if compress:
        raw = gzip.compress(raw)
    with open(path, "wb") as f:
        f.write(raw)
    return str(path)


# The bundled corpus.

@pytest.mark.parametrize("split, size", [("train", 27687), ("dev", 1583), ("test", 1791)])
def test_bundled_splits_have_the_manifest_sizes(split, size):
    pairs = data.load_parallel("bundled", split)
    assert int(pairs.cardinality()) == size
    assert data.bundled_manifest()["files"][f"{split}.tsv.gz"]["pairs"] == size
    assert data.bundled_manifest()["counts"][f"pairs_{split}"] == size


def test_bundled_files_match_their_checksums():
    for name, entry in data.bundled_manifest()["files"].items():
        with gzip.open(os.path.join(corpora.BUNDLED_DIR, name), "rb") as f:
            content = f.read()
        assert hashlib.sha256(content).hexdigest() == entry["sha256_uncompressed"]
        assert content.count(b"\n") == entry["pairs"]


def test_bundled_is_english_to_spanish_and_reverses():
    first = next(iter(data.load_parallel("bundled", "train")))
    assert first["source"].numpy().decode() == "In the beginning, God created the heavens and the earth."
    assert first["target"].numpy().decode() == "En el principio crió Dios los cielos y la tierra."
    reverse = data.load_parallel("bundled", "dev", source_language="es")
    forward = data.load_parallel("bundled", "dev")
    assert int(reverse.cardinality()) == 1583
    assert as_pairs(reverse)[:50] == [(t, s) for s, t in as_pairs(forward)[:50]]
    assert as_pairs(data.load_parallel("bundled", "validation")) == as_pairs(forward)


def test_no_bundled_verse_opens_with_the_printed_chapter_capitals():
    # The Reina-Valera prints each chapter's opening word in capitals ("EN el
    # principio"); a model trained on them answered "In the beginning ..." with
    # "EN el principio ...". The words in capitals that open a verse now are the
    # text's own: Psalm 119's Hebrew letters (capitals in the English too), the name
    # JAH, the writing on the wall, and one opening inside a chapter.
    opening = re.compile(r"^\W*([A-ZÁÉÍÓÚÑÜÂÊÎÔÛ]{2,})(?!\w)")
    words = collections.Counter()
    for split in ("train", "dev", "test"):
        for _, target in as_pairs(data.load_parallel("bundled", split)):
            match = opening.match(target)
            if match:
                words[match.group(1)] += 1
    hebrew_letters = {"ALEPH", "BETH", "GIMEL", "DALETH", "HE", "VAU", "ZAIN", "CHETH",
                      "TETH", "JOD", "CAPH", "LAMED", "MEM", "NUN", "SAMECH", "AIN",
                      "PE", "TZADDI", "COPH", "RESH", "SIN", "TAU"}
    assert set(words) - hebrew_letters == {"JAH", "TEKEL", "PERES", "HUBO"}, words
    assert sum(words.values()) < 30


def test_chapter_openings_are_cased_as_the_text_writes_the_words():
    build = pytest.importorskip("build_bundled_corpus")
    casing = build.usual_casing([
        "y dijo Jehová á los hijos", "Alabad á JAH; los cielos. Los hijos de Dios",
        "y Dios vió", "á los siete años",
    ])
    assert casing["jehová"] == "Jehová" and casing["jah"] == "JAH"
    assert casing["los"] == "los"  # "Los" starts a sentence: not counted
    cases = {
        "EN el principio crió Dios": "En el principio crió Dios",
        "Y LOS hijos de Israel": "Y los hijos de Israel",
        "Y JEHOVÁ dijo": "Y Jehová dijo",
        "DE SIETE años era Joas": "De siete años era Joas",
        "Salmo de David. JEHOVÁ, oye": "Salmo de David. Jehová, oye",
        "¿QUIÉN creyó": "¿Quién creyó",
        "JAH, si mirares": "JAH, si mirares",
        "Y El ángel de Jehová subió": "Y El ángel de Jehová subió",
    }
    for text, expected in cases.items():
        assert build.recase_chapter_opening(text, casing) == expected, text
    assert build.recase_chapter_opening(
        "ALEPH. BIENAVENTURADOS los perfectos", casing, "ALEPH Blessed are those"
    ) == "ALEPH. Bienaventurados los perfectos"


def test_bundled_rejects_unknown_splits_and_languages():
    with pytest.raises(ValueError, match="split must be one of train, dev, test. Received: split='valid'"):
        data.load_parallel("bundled", "valid")
    with pytest.raises(ValueError, match="no language key 'de'; available keys: en, es"):
        data.load_parallel("bundled", "train", target_language="de")
    with pytest.raises(ValueError, match="must differ"):
        data.load_parallel("bundled", "train", source_language="en", target_language="en")


# The user's files.

def test_aligned_files_plain_and_gzip(tmp_path):
    source = write(tmp_path / "train.en", "Hello world.\nSecond line\n\nfourth\n")
    target = write(tmp_path / "train.de.gz", "Hallo Welt.\nZweite Zeile\nleer\nvierte", compress=True)
    pairs = data.load_parallel((source, target))
    assert int(pairs.cardinality()) == 4
    assert as_pairs(pairs) == [
        ("Hello world.", "Hallo Welt."),
        ("Second line", "Zweite Zeile"),
        ("", "leer"),  # an empty line keeps its place
        ("fourth", "vierte"),
    ]


def test_windows_line_ends_and_byte_order_marks_are_dropped(tmp_path):
    # Notepad's UTF-8 starts a file with a byte order mark (U+FEFF): not part of
    # the first sentence, which a reference file would otherwise score lower.
    source = write(tmp_path / "a.src", "\ufeffone\r\ntwo\r\n")
    target = write(tmp_path / "a.tgt", "\ufeffeins\r\nzwei \ufeff\r\n")
    assert as_pairs(data.load_parallel((source, target))) == [
        ("one", "eins"), ("two", "zwei \ufeff")]  # only a line's first character
    tsv = write(tmp_path / "a.tsv.gz", "\ufeffone\teins\r\ntwo\tzwei\r\n", compress=True)
    assert as_pairs(data.load_parallel(tsv)) == [("one", "eins"), ("two", "zwei")]


def test_tab_separated_file_plain_and_gzip(tmp_path):
    text = "A cat.\tUn gato.\n\tvacío\nÚltimo.\t¡Fin!\n"
    for path, compress in ((tmp_path / "pairs.tsv", False), (tmp_path / "pairs.tsv.gz", True)):
        pairs = data.load_parallel(write(path, text, compress))
        assert int(pairs.cardinality()) == 3
        assert as_pairs(pairs) == [("A cat.", "Un gato."), ("", "vacío"), ("Último.", "¡Fin!")]


def test_split_placeholder_in_file_names(tmp_path):
    write(tmp_path / "dev.en", "a\nb\n")
    write(tmp_path / "dev.es", "x\ny\n")
    write(tmp_path / "dev.tsv", "a\tx\n")
    pairs = data.load_parallel((str(tmp_path / "{split}.en"), str(tmp_path / "{split}.es")), "dev")
    assert as_pairs(pairs) == [("a", "x"), ("b", "y")]
    assert as_pairs(data.load_parallel(str(tmp_path / "{split}.tsv"), "dev")) == [("a", "x")]


def test_many_lines_stay_aligned(tmp_path):
    # More lines than one block of the reader (4096), and not a multiple of it.
    n = 9000
    source = write(tmp_path / "s.txt", "".join(f"s{i}\n" for i in range(n)))
    target = write(tmp_path / "t.txt.gz", "".join(f"t{i}\n" for i in range(n)), compress=True)
    pairs = as_pairs(data.load_parallel((source, target)))
    assert pairs == [(f"s{i}", f"t{i}") for i in range(n)]


def test_hold_out_draws_dev_and_test_with_the_seed_and_keeps_their_sources_out_of_train(
        tmp_path):
    """A corpus without splits: a 20th of it each for dev and test (at most
    HELD_OUT_PAIRS), drawn by a seed as NumPy's permutation of the lines draws
    them, in corpus order; train the rest, less each pair whose source is a held
    pair's (here every source stands on 3 lines)."""
    n = 150
    sources, targets = [f"s{i % 50}" for i in range(n)], [f"t{i}" for i in range(n)]
    pairs = data.load_parallel((write(tmp_path / "all.src", "".join(f"{s}\n" for s in sources)),
                                write(tmp_path / "all.tgt", "".join(f"{t}\n" for t in targets))))
    for seed in (0, 7):
        splits, left_out = data.hold_out(pairs, seed)
        order = np.random.default_rng(seed).permutation(n)
        dev, test = sorted(order[:7]), sorted(order[7:14])  # 150 // 20 each
        held = {sources[i] for i in (*dev, *test)}
        train = [i for i in range(n) if i not in (*dev, *test) and sources[i] not in held]
        for name, lines in (("train", train), ("dev", dev), ("test", test)):
            assert as_pairs(splits[name]) == [(sources[i], targets[i]) for i in lines], name
            assert int(splits[name].cardinality()) == len(lines)
        assert left_out == n - 14 - len(train) > 0
    assert as_pairs(data.hold_out(pairs, 0)[0]["test"]) != as_pairs(splits["test"])
    assert int(data.hold_out(data.load_parallel((write(tmp_path / "big.src", "a\n" * 20000),
                                                 write(tmp_path / "big.tgt", "b\n" * 20000))),
                             0)[0]["dev"].cardinality()) == corpora.HELD_OUT_PAIRS
    with pytest.raises(ValueError, match="A corpus without dev and test splits of its own needs "
                                         "20 pairs or more to hold them out of; it has 19. Give "
                                         "more pairs, or dev and test files of their own"):
        data.hold_out(data.load_parallel((write(tmp_path / "few.src", "a\n" * 19),
                                          write(tmp_path / "few.tgt", "b\n" * 19))), 0)


# Bad input: every error names the file and the line.

def test_line_counts_that_differ(tmp_path):
    source = write(tmp_path / "train.src", "a\nb\nc\n")
    target = write(tmp_path / "train.tgt", "x\ny\n")
    with pytest.raises(ValueError) as error:
        data.load_parallel((source, target))
    assert str(error.value) == (
        f"{source} has 3 lines but {target} has 2; parallel files must align line by line"
    )


def test_empty_corpus(tmp_path):
    source = write(tmp_path / "empty.src", "")
    target = write(tmp_path / "empty.tgt", "")
    with pytest.raises(ValueError, match=f"{source} is empty; a parallel corpus needs at least one pair"):
        data.load_parallel((source, target))
    with pytest.raises(ValueError, match="empty.tsv.gz is empty"):
        data.load_parallel(write(tmp_path / "empty.tsv.gz", "", compress=True))


def test_undecodable_bytes_name_file_line_and_bytes(tmp_path):
    source = write(tmp_path / "latin1.src", "fine\nalso fine\nSe\xf1or\n".encode("latin-1"))
    target = write(tmp_path / "ok.tgt", "a\nb\nc\n")
    with pytest.raises(ValueError) as error:
        data.load_parallel((source, target))
    assert str(error.value).startswith(
        f"{source} line 3: bytes b'\\xf1' at byte 2 are not UTF-8; re-encode the file as UTF-8"
    )
    tsv = write(tmp_path / "bad.tsv.gz", b"ok\tok\n\xff\tx\n", compress=True)
    with pytest.raises(ValueError, match="bad.tsv.gz line 2: bytes"):
        data.load_parallel(tsv)


@pytest.mark.parametrize("line, columns", [("no tab here", 1), ("one\ttwo\tthree", 3)])
def test_tab_separated_lines_need_exactly_one_tab(tmp_path, line, columns):
    path = write(tmp_path / "pairs.tsv", f"a\tb\nc\td\n{line}\ne\tf\n")
    with pytest.raises(ValueError) as error:
        data.load_parallel(path)
    assert str(error.value) == (
        f"{path} line 3: {columns} tab-separated columns; a parallel tab-separated "
        "file has exactly 2 (source<TAB>target) on every line"
    )


def test_missing_file_and_corrupt_gzip(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.tsv does not exist"):
        data.load_parallel(str(tmp_path / "nowhere.tsv"))
    corrupt = write(tmp_path / "corrupt.tsv.gz", b"not gzip at all")
    with pytest.raises(ValueError, match="corrupt.tsv.gz: cannot be read"):
        data.load_parallel(corrupt)


def test_file_sources_refuse_splits_and_languages(tmp_path):
    path = write(tmp_path / "p.tsv", "a\tb\n")
    with pytest.raises(ValueError, match="A file source has no splits"):
        data.load_parallel(path, "train")
    with pytest.raises(ValueError, match="has a \\{split\\} placeholder; pass split="):
        data.load_parallel(str(tmp_path / "{split}.tsv"))
    with pytest.raises(ValueError, match="files are read in the order given"):
        data.load_parallel(path, source_language="en")
    with pytest.raises(ValueError, match="A file source is \\(source_path, target_path\\)"):
        data.load_parallel((path, path, path))
    with pytest.raises(TypeError, match="The source must be 'bundled', 'tfds:NAME'"):
        data.load_parallel(42)


# TFDS, through tfds.testing.mock_data: nothing is downloaded.

@pytest.fixture(scope="module")
def tfds():
    import tensorflow_datasets

    return tensorflow_datasets


def raw_examples(tfds, name, split):
    return [
        {key: value.decode("utf-8") for key, value in example.items()}
        for example in tfds.load(name, split=split).as_numpy_iterator()
    ]


@pytest.mark.parametrize(
    "name, source_language, target_language",
    [
        ("wmt14_translate/de-en", "en", "de"),  # the paper's EN->DE by default
        ("wmt14_translate/fr-en", "en", "fr"),
        ("ted_hrlr_translate/pt_to_en", "pt", "en"),
    ],
)
def test_tfds_default_directions(tfds, name, source_language, target_language):
    with tfds.testing.mock_data(num_examples=5):
        pairs = as_pairs(data.load_parallel(f"tfds:{name}", "train"))
        expected = [
            (example[source_language], example[target_language])
            for example in raw_examples(tfds, name, "train")
        ]
    assert len(pairs) == 5
    assert pairs == expected


def test_tfds_chosen_direction_and_split(tfds):
    with tfds.testing.mock_data(num_examples=3):
        pairs = as_pairs(
            data.load_parallel("tfds:wmt14_translate/de-en", "validation", source_language="de")
        )
        expected = [(e["de"], e["en"]) for e in raw_examples(tfds, "wmt14_translate/de-en", "validation")]
    assert pairs == expected and len(pairs) == 3


def test_tfds_dev_means_validation(tfds):
    """train.py and evaluate call it dev; WMT's TFDS datasets call it validation.
    (tfds.testing.mock_data ignores the split, so the rule is checked alone.)"""
    from keras_transformer.data.corpora import _tfds_split

    wmt = {"train", "validation", "test"}
    assert _tfds_split("dev", wmt) == "validation"
    assert _tfds_split("dev[:10%]", wmt) == "validation[:10%]"
    assert _tfds_split("dev", {"train", "dev"}) == "dev"
    assert _tfds_split("development", wmt) == "development"
    assert _tfds_split("test", wmt) == "test"
    with tfds.testing.mock_data(num_examples=2):
        assert len(as_pairs(data.load_parallel("tfds:wmt14_translate/de-en", "dev"))) == 2


class _Network:
    """`socket.create_connection` stubbed: hosts in `reachable` accept, the others
    fail as offline (a name that does not resolve); `tried` lists each call."""

    def __init__(self, reachable=()):
        self.reachable, self.tried = set(reachable), []

    def __call__(self, address, timeout=None, *args, **kwargs):
        import socket

        self.tried.append((address, timeout))
        if address[0] not in self.reachable:
            raise socket.gaierror(-2, "Name or service not known")
        return types.SimpleNamespace(close=lambda: None)


def _download_fails(tfds, monkeypatch):
    import requests

    calls = []

    def offline(self, urls, *args, **kwargs):
        calls.append(urls)
        raise requests.exceptions.ConnectionError(
            "HTTPConnectionPool(host='www.statmt.org', port=80): Max retries exceeded")

    monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract", offline)
    for proxy in ("http_proxy", "https_proxy", "all_proxy", "ftp_proxy"):
        monkeypatch.delenv(proxy, raising=False)
        monkeypatch.delenv(proxy.upper(), raising=False)
    return calls


def test_an_unprepared_tfds_corpus_downloads_and_says_why_it_could_not(tfds, tmp_path,
                                                                       monkeypatch, caplog):
    """The first use of a TFDS corpus downloads and prepares it. Everything that
    path needs is installed (TFDS 4.9.10 needs importlib_resources on Python 3.11
    but declares it for Python < 3.9 only: without it, `train --data
    tfds:wmt14_translate/de-en` stopped with a ModuleNotFoundError), up to the
    download; the download's failure (stubbed to fail at once, with the hosts
    reachable) says which corpus, where, and what to do."""
    calls = _download_fails(tfds, monkeypatch)
    network = _Network(reachable={"www.statmt.org"})
    monkeypatch.setattr(corpora.socket, "create_connection", network)
    with pytest.raises(ConnectionError) as error:
        data.load_parallel("tfds:wmt14_translate/de-en", "train", data_dir=str(tmp_path))
    assert calls, "the download was never reached"
    message = str(error.value)
    assert message.startswith(f"'tfds:wmt14_translate/de-en' is not prepared in "
                              f"{tmp_path}/wmt14_translate/de-en/"), message
    assert "downloading it failed (HTTPConnectionPool(host='www.statmt.org'" in message
    assert "needs the network" in message and "$TFDS_DATA_DIR" in message
    # Reading the corpus's features used their deprecated `dtype`: TFDS logged a
    # warning about it twice, for the user to read.
    assert "deprecated" not in caplog.text, caplog.text


def test_an_unprepared_tfds_corpus_offline_fails_at_once_naming_the_hosts(tfds, tmp_path,
                                                                         monkeypatch, caplog):
    """Offline, TFDS retries each download 10 times, backing off: `train --data
    tfds:wmt14_translate/de-en` waited 3 min 24 s before it said why. Where no
    host of the corpus (nor TFDS's prepared copies) accepts a connection, the
    same message comes before any download, naming the hosts; behind a proxy,
    which may reach hosts this machine cannot resolve, the download is tried."""
    calls = _download_fails(tfds, monkeypatch)
    network = _Network()
    monkeypatch.setattr(corpora.socket, "create_connection", network)
    with pytest.raises(ConnectionError) as error:
        data.load_parallel("tfds:wmt14_translate/de-en", "train", data_dir=str(tmp_path))
    assert not calls, "the download was tried offline"
    assert str(error.value).startswith(
        f"'tfds:wmt14_translate/de-en' is not prepared in {tmp_path}/wmt14_translate/de-en/"
        "1.0.0, and downloading it failed (no connection to data.statmt.org, "
        "storage.googleapis.com, www.statmt.org). TFDS downloads"), str(error.value)
    # TFDS's is_prepared logged "Variant folder DIR has no dataset_info.json" for
    # a corpus not prepared: nothing a user can act on.
    assert "Variant folder" not in caplog.text, caplog.text
    assert sorted(network.tried) == [(("data.statmt.org", 80), 5),
                                     (("storage.googleapis.com", 443), 5),
                                     (("www.statmt.org", 80), 5)]

    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    with pytest.raises(ConnectionError, match=r"failed \(HTTPConnectionPool"):
        data.load_parallel("tfds:wmt14_translate/de-en", "train", data_dir=str(tmp_path))
    assert calls, "behind a proxy, the download was not tried"


def test_an_unprepared_tfds_corpus_without_download_is_not_found_at_once(tfds, tmp_path,
                                                                        monkeypatch):
    """`download=False` (an export reading a stopped run's dev pairs, which must not
    fetch gigabytes to choose its decoding): a corpus not prepared raises
    FileNotFoundError naming it and where, before any download or connection."""
    calls = _download_fails(tfds, monkeypatch)
    network = _Network(reachable={"www.statmt.org"})
    monkeypatch.setattr(corpora.socket, "create_connection", network)
    with pytest.raises(FileNotFoundError) as error:
        data.load_parallel("tfds:wmt14_translate/de-en", "validation", data_dir=str(tmp_path),
                           download=False)
    assert not calls and not network.tried
    assert str(error.value) == (f"'tfds:wmt14_translate/de-en' is not prepared in "
                                f"{tmp_path}/wmt14_translate/de-en/1.0.0")


def test_unreachable_is_none_where_one_host_answers_or_no_url_is_known(monkeypatch):
    monkeypatch.setattr(corpora.socket, "create_connection",
                        _Network(reachable={"storage.googleapis.com"}))
    assert corpora._unreachable({"https://data.statmt.org/a.tgz": None}) is None
    monkeypatch.setattr(corpora.socket, "create_connection", _Network())
    assert corpora._unreachable(None) is None and corpora._unreachable({}) is None
    assert corpora._unreachable({"ftp://ftp.example.org:2121/x": None,
                                 "http://www.example.org/y": None}) == (
        "no connection to ftp.example.org, storage.googleapis.com, www.example.org")


def test_tfds_unknown_names_and_keys(tfds):
    with tfds.testing.mock_data(num_examples=2):
        with pytest.raises(ValueError, match="Unknown TFDS dataset 'no_such_corpus'"):
            data.load_parallel("tfds:no_such_corpus", "train")
        with pytest.raises(ValueError, match="'tfds:wmt14_translate/xx-en'"):
            data.load_parallel("tfds:wmt14_translate/xx-en", "train")
        with pytest.raises(ValueError, match="has no language key 'es'; available keys: de, en"):
            data.load_parallel("tfds:wmt14_translate/de-en", "train", target_language="es")
        with pytest.raises(ValueError, match="a TFDS source needs a split"):
            data.load_parallel("tfds:wmt14_translate/de-en")


def test_default_direction_rules():
    assert corpora._default_direction("de-en", ["de", "en"]) == ("en", "de")
    assert corpora._default_direction("en-fr", ["en", "fr"]) == ("en", "fr")
    assert corpora._default_direction("pt_to_en", ["en", "pt"]) == ("pt", "en")
    assert corpora._default_direction("cs-ru", ["cs", "ru"]) == ("cs", "ru")
    assert corpora._default_direction("", ["en", "ja"]) == ("en", "ja")
    assert corpora._default_direction("", ["ja", "zh"]) is None
