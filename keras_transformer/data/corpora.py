"""Parallel corpora as `tf.data.Dataset`s of `{"source": tf.string, "target": tf.string}`.

Three kinds of source:
- a TFDS translation dataset, e.g. "tfds:wmt14_translate/de-en" (the paper's WMT 2014
  English-German, Sec. 5.1);
- the user's own files: two aligned plain-text files, or one tab-separated file;
- "bundled": a small English-Spanish corpus shipped inside the package (the Bible,
  verse-aligned; see `bundled/manifest.json` and scripts/build_bundled_corpus.py).

Files are checked eagerly, in Python, before any dataset is built: they are read
once to count lines, to check that they are UTF-8 and, for a tab-separated file,
that every line has exactly one tab. A problem raises a `ValueError` naming the
file and the line. Then `tf.data.TextLineDataset` reads them again as the dataset.
"""

import gzip
import json
import os
import socket
import urllib.parse
import urllib.request

import numpy as np
import tensorflow as tf

from keras_transformer.corpus_names import BUNDLED
from keras_transformer.corpus_names import SPLIT_PLACEHOLDER
from keras_transformer.corpus_names import TFDS_PREFIX

BUNDLED_DIR = os.path.join(os.path.dirname(__file__), "bundled")
BUNDLED_LANGUAGES = ("en", "es")
BUNDLED_SPLITS = ("train", "dev", "test")
_SPLIT_ALIASES = {"validation": "dev"}
# Lines per call of a dataset function: tf.data's cost is per call, not per line.
_BLOCK = 4096
# The pairs `hold_out` gives dev and test each, and the share of a corpus at most.
HELD_OUT_PAIRS = 500
HELD_OUT_SHARE = 20
# Where TFDS looks for a corpus prepared (DownloadConfig.try_download_gcs), and how
# long a host may take to accept a connection before a corpus's download starts.
_TFDS_PREPARED_COPIES_HOST = "storage.googleapis.com"
_CONNECT_SECONDS = 5


def load_parallel(
    source,
    split=None,
    *,
    source_language=None,
    target_language=None,
    data_dir=None,
    download=True,
):
    """Loads a parallel corpus as a dataset of `{"source", "target"}` string pairs.

    Args:
        source: where the sentence pairs come from; one of
            - `"bundled"`: the English-Spanish Bible shipped with the package,
              English -> Spanish unless the languages say otherwise.
            - `"tfds:NAME[/CONFIG]"`: a TFDS dataset whose examples have (at least)
              two text features, e.g. `"tfds:wmt14_translate/de-en"`,
              `"tfds:wmt14_translate/fr-en"`, `"tfds:ted_hrlr_translate/pt_to_en"`.
            - `(source_path, target_path)`: two aligned plain-text files, one
              sentence a line.
            - `path`: one tab-separated file, `source<TAB>target` a line.
            File names ending in ".gz" are read as gzip. A path may contain
            `{split}`, replaced by `split`: `("data/{split}.en", "data/{split}.de")`.
        split: for "bundled", "train", "dev" (alias "validation") or "test"; for
            TFDS, any TFDS split string ("train", "validation", "test[:10%]"); for
            files, only with a `{split}` placeholder in the path.
        source_language, target_language: the language keys of a TFDS dataset or of
            "bundled" ("en", "es"). Defaults: for "bundled", en -> es; for a
            config named "x_to_y", x -> y; for a config "x-y" that includes "en",
            English -> the other language (the paper's EN->DE and EN->FR); for a
            dataset with exactly two text features, both must be given unless
            one of the rules above applies. Giving one picks the other.
            Not used for files: their order is source, target.
        data_dir: TFDS data directory (TFDS's default when None).
        download: whether TFDS may download and prepare a dataset not yet
            prepared (else such a dataset raises FileNotFoundError).

    Returns:
        A `tf.data.Dataset` of `{"source": tf.string, "target": tf.string}`
        scalars, in corpus order. For files and "bundled" its cardinality is known.

    Raises:
        ValueError: files whose line counts differ, an empty corpus, bytes that are
            not UTF-8, a tab-separated line without exactly one tab, an unknown
            TFDS dataset or language key, a split that does not exist. The message
            names the file and the line.
        FileNotFoundError: a file that does not exist.
    """
    if isinstance(source, str) and source == BUNDLED:
        return _load_bundled(split, source_language, target_language)
    if isinstance(source, str) and source.startswith(TFDS_PREFIX):
        return _load_tfds(
            source[len(TFDS_PREFIX):], split, source_language, target_language,
            data_dir, download,
        )
    if source_language is not None or target_language is not None:
        raise ValueError(
            "source_language and target_language choose columns of 'bundled' or a "
            "TFDS dataset; files are read in the order given (source, target). "
            f"Received: source_language={source_language!r}, "
            f"target_language={target_language!r} for source={source!r}"
        )
    if isinstance(source, (tuple, list)):
        if len(source) != 2:
            raise ValueError(
                "A file source is (source_path, target_path) or one "
                f"tab-separated path. Received: {source!r}"
            )
        paths = [_format_split(os.fspath(path), split) for path in source]
        return read_aligned_files(*paths)
    if isinstance(source, (str, os.PathLike)):
        return read_tsv_file(_format_split(os.fspath(source), split))
    raise TypeError(
        "The source must be 'bundled', 'tfds:NAME', a path or a pair of "
        f"paths. Received: {source!r}"
    )


def hold_out(pairs, seed, count=HELD_OUT_PAIRS):
    """Dev and test pairs held out of a corpus that has no splits of its own.

    Dev and test get `count` pairs each (a 20th of the corpus each, where that is
    fewer), drawn with `seed` and kept in corpus order. Train gets the other
    pairs, less those whose source is the source of a dev or test pair: a
    corpus's repeated sentences would otherwise be scored where they were learned.

    Args:
        pairs: a dataset of `{"source", "target"}` strings of known cardinality,
            as `load_parallel` reads files.
        seed: int; the same corpus and seed give the same splits (a resumed
            run's, `keras-transformer evaluate`'s).
        count: the pairs of dev and of test.

    Returns:
        `(splits, left_out)`: `{"train", "dev", "test"}` datasets of known
        cardinality, and how many training pairs were left out for their source.

    Raises:
        ValueError: a corpus of fewer than 20 pairs.
    """
    total = int(pairs.cardinality())
    count = min(count, total // HELD_OUT_SHARE)
    if total < 0 or count < 1:
        raise ValueError(
            f"A corpus without dev and test splits of its own needs {HELD_OUT_SHARE} pairs or "
            f"more to hold them out of; it has {total}. Give more pairs, or dev and test "
            "files of their own")
    order = np.random.default_rng(seed).permutation(total)
    roles = np.zeros(total, np.int32)  # 0 train, 1 dev, 2 test, -1 left out
    roles[order[:count]], roles[order[count:2 * count]] = 1, 2
    sources = [source for block in pairs.map(lambda pair: pair["source"]).batch(_BLOCK)
               .as_numpy_iterator() for source in block]
    held = {sources[i] for i in order[:2 * count]}
    left_out = [i for i, source in enumerate(sources) if roles[i] == 0 and source in held]
    roles[left_out] = -1
    roles_tensor = tf.constant(roles)

    def split(role):
        chosen = pairs.enumerate().filter(
            lambda index, pair: tf.equal(tf.gather(roles_tensor, index), role))
        return chosen.map(lambda index, pair: pair).apply(
            tf.data.experimental.assert_cardinality(int(np.sum(roles == role))))

    return {"train": split(0), "dev": split(1), "test": split(2)}, len(left_out)


def read_aligned_files(source_path, target_path):
    """Pairs the lines of two aligned plain-text files (gzip if named *.gz).

    Both files are read once up front to check them (see the module docstring);
    this is fine for corpora of millions of lines. Empty lines are kept: they hold
    the alignment.
    """
    num_source = _check_lines(source_path, columns=None)
    num_target = _check_lines(target_path, columns=None)
    if num_source != num_target:
        raise ValueError(
            f"{source_path} has {num_source} lines but {target_path} has "
            f"{num_target}; parallel files must align line by line"
        )
    _check_not_empty(num_source, source_path)
    # Batched, so that the dict is built once per block of lines, not per line.
    dataset = tf.data.Dataset.zip(
        (_text_lines(source_path).batch(_BLOCK), _text_lines(target_path).batch(_BLOCK))
    ).map(lambda source, target: {"source": _without_bom(source),
                                  "target": _without_bom(target)}).unbatch()
    return dataset.apply(tf.data.experimental.assert_cardinality(num_source))


def read_tsv_file(path):
    """Pairs of a tab-separated file, `source<TAB>target` a line (gzip if *.gz)."""
    num_lines = _check_lines(path, columns=2)
    _check_not_empty(num_lines, path)

    def split_columns(lines):
        columns = tf.strings.split(_without_bom(lines), "\t").to_tensor()  # (n, 2)
        return {"source": columns[:, 0], "target": columns[:, 1]}

    dataset = _text_lines(path).batch(_BLOCK).map(split_columns).unbatch()
    return dataset.apply(tf.data.experimental.assert_cardinality(num_lines))


def bundled_manifest():
    """The bundled corpus's provenance and counts (bundled/manifest.json) as a dict."""
    with open(os.path.join(BUNDLED_DIR, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)


def _load_bundled(split, source_language, target_language):
    split = _SPLIT_ALIASES.get(split, split)
    if split not in BUNDLED_SPLITS:
        raise ValueError(
            f"load_parallel('bundled', split): split must be one of "
            f"{', '.join(BUNDLED_SPLITS)}. Received: split={split!r}"
        )
    source_language, target_language = _choose_languages(
        BUNDLED_LANGUAGES, source_language, target_language,
        default=BUNDLED_LANGUAGES, what="the bundled corpus",
    )
    dataset = read_tsv_file(os.path.join(BUNDLED_DIR, f"{split}.tsv.gz"))
    if source_language == BUNDLED_LANGUAGES[0]:
        return dataset
    return _map_blocks(
        dataset, lambda pairs: {"source": pairs["target"], "target": pairs["source"]}
    )


def _load_tfds(name, split, source_language, target_language, data_dir, download):
    import tensorflow_datasets as tfds  # slow to import; only TFDS sources need it

    if split is None:
        raise ValueError(
            f"load_parallel('tfds:{name}', split): a TFDS source needs a split, "
            "e.g. 'train', 'validation' or 'test'"
        )
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as error:
        raise ValueError(
            f"Unknown TFDS dataset {name!r} (from 'tfds:{name}'); "
            "tfds.list_builders() lists the names, e.g. 'tfds:wmt14_translate/de-en'"
        ) from error
    except ValueError as error:  # an unknown config; TFDS lists close ones
        raise ValueError(f"'tfds:{name}': {error}") from error

    features = builder.info.features
    text_keys = sorted(
        key for key, feature in features.items()
        if getattr(feature, "tf_dtype", None) == tf.string and not getattr(feature, "shape", (1,))
    )
    if len(text_keys) < 2:
        raise ValueError(
            f"TFDS dataset {name!r} has text features {text_keys}; "
            "a parallel corpus needs two"
        )
    config = builder.builder_config.name if builder.builder_config else ""
    source_language, target_language = _choose_languages(
        text_keys, source_language, target_language,
        default=_default_direction(config, text_keys), what=f"TFDS dataset {name!r}",
    )
    # tfds.testing.mock_data replaces download_and_prepare with a no-op: its
    # corpora need no network, and no files.
    mocked = type(builder).download_and_prepare.__module__.startswith(
        "tensorflow_datasets.testing")
    # What download_and_prepare checks (is_prepared logs a warning where not).
    if not download and not mocked and not builder.data_path.exists():
        raise FileNotFoundError(f"'tfds:{name}' is not prepared in {builder.data_dir}")
    if download and not builder.data_path.exists():
        import requests  # TFDS downloads with it

        def failed(reason):
            return ConnectionError(
                f"'tfds:{name}' is not prepared in {builder.data_dir}, and downloading it "
                f"failed ({reason}). TFDS downloads and prepares a corpus on its first use, "
                "which needs the network and room on disk (WMT14 en-de: several GB); "
                "prepare it where there is a network (the same command, or "
                "tfds.builder(name).download_and_prepare()) and copy ~/tensorflow_datasets "
                "(or $TFDS_DATA_DIR) here"
            )

        unreachable = None if mocked else _unreachable(builder.url_infos)
        if unreachable:
            raise failed(unreachable)
        try:
            builder.download_and_prepare()
        except requests.exceptions.RequestException as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
            raise failed(reason) from error
    split = _tfds_split(split, builder.info.splits)  # known once prepared
    dataset = builder.as_dataset(split=split, shuffle_files=False)
    return dataset.map(
        lambda example: {
            "source": example[source_language],
            "target": example[target_language],
        }
    )


def _unreachable(url_infos):
    """Why a download of `url_infos` (a TFDS builder's URLs) would fail, found in
    seconds: "no connection to HOSTS" where none of their hosts, nor the host of
    TFDS's prepared copies, accepts a connection. Offline, TFDS retries each
    download 10 times, backing off for 3.5 minutes before it fails. None where a
    host answers, where the URLs are unknown, and behind a proxy (it may reach
    hosts this machine cannot)."""
    if urllib.request.getproxies():
        return None
    ports = {"http": 80, "https": 443, "ftp": 21}
    hosts = {}
    for url in url_infos or ():
        parsed = urllib.parse.urlsplit(url)
        if parsed.hostname and parsed.scheme in ports:
            hosts.setdefault(parsed.hostname, parsed.port or ports[parsed.scheme])
    if not hosts:
        return None
    hosts.setdefault(_TFDS_PREPARED_COPIES_HOST, 443)
    for host, port in hosts.items():
        try:
            socket.create_connection((host, port), timeout=_CONNECT_SECONDS).close()
            return None
        except OSError:
            continue
    return f"no connection to {', '.join(sorted(hosts))}"


def _tfds_split(split, splits):
    """`split` with "dev" read as "validation" ("dev[:10%]" as "validation[:10%]")
    where the dataset's `splits` (names) have a validation split and no dev
    split: the bundled corpus and train.py call it dev."""
    name = split.split("[", 1)[0]
    if name == "dev" and "dev" not in splits and "validation" in splits:
        return "validation" + split[len(name):]
    return split


def _default_direction(config, keys):
    """(source, target) implied by a config name, or None."""
    if "_to_" in config:
        pair = tuple(config.split("_to_", 1))
    elif "-" in config:
        first, second = config.split("-", 1)
        # The paper translates out of English: "de-en" means EN->DE by default.
        pair = (first, second) if first == "en" else (second, first)
        if "en" not in pair:
            pair = (first, second)
    elif len(keys) == 2 and "en" in keys:
        pair = ("en", [key for key in keys if key != "en"][0])
    else:
        return None
    return pair if set(pair) <= set(keys) else None


def _choose_languages(keys, source_language, target_language, default, what):
    for role, language in (("source_language", source_language),
                           ("target_language", target_language)):
        if language is not None and language not in keys:
            raise ValueError(
                f"{what[0].upper()}{what[1:]} has no language key {language!r}; available "
                f"keys: {', '.join(keys)}. Received: {role}={language!r}"
            )
    if source_language is None and target_language is None:
        if default is None:
            raise ValueError(
                f"{what[0].upper()}{what[1:]} has language keys {', '.join(keys)}; pass "
                "source_language= and target_language= (train's and evaluate's "
                "--source-language and --target-language) to choose the direction"
            )
        return tuple(default)
    if source_language is None or target_language is None:
        given = source_language if source_language is not None else target_language
        others = [key for key in keys if key != given]
        if len(others) != 1:
            raise ValueError(
                f"{what[0].upper()}{what[1:]} has language keys {', '.join(keys)}; pass "
                "both source_language= and target_language= (--source-language and "
                "--target-language)"
            )
        if source_language is None:
            return others[0], target_language
        return source_language, others[0]
    if source_language == target_language:
        raise ValueError(
            "source_language and target_language must differ. "
            f"Received: both {source_language!r}"
        )
    return source_language, target_language


def _format_split(path, split):
    if SPLIT_PLACEHOLDER in path:
        if split is None:
            raise ValueError(f"{path} has a {{split}} placeholder; pass split= (--split)")
        return path.replace(SPLIT_PLACEHOLDER, split)
    if split is not None:
        raise ValueError(
            f"A file source has no splits; pass the file of the split "
            f"you want, or put {{split}} in its name. Received: split={split!r} "
            f"for {path}"
        )
    return path


def _open(path):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist or is not a file")
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _check_lines(path, columns):
    """Counts the lines of `path`, checking that each is UTF-8 and has `columns`."""
    num_lines = 0
    with _open(path) as f:
        try:
            for num_lines, line in enumerate(f, start=1):
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise ValueError(
                        f"{path} line {num_lines}: bytes {line[error.start:error.end]!r} "
                        f"at byte {error.start} are not UTF-8; re-encode the file as "
                        "UTF-8 (e.g. iconv -f LATIN1 -t UTF-8)"
                    ) from None
                if columns is not None:
                    found = text.rstrip("\r\n").count("\t") + 1
                    if found != columns:
                        raise ValueError(
                            f"{path} line {num_lines}: {found} tab-separated columns; a "
                            f"parallel tab-separated file has exactly {columns} "
                            "(source<TAB>target) on every line"
                        )
        except (OSError, EOFError) as error:  # e.g. a truncated or non-gzip *.gz
            raise ValueError(f"{path}: cannot be read: {error}") from error
    return num_lines


def _check_not_empty(num_lines, path):
    if num_lines == 0:
        raise ValueError(f"{path} is empty; a parallel corpus needs at least one pair")


def _map_blocks(dataset, function):
    """`dataset.map(function)` for a function that works on blocks of elements."""
    cardinality = int(dataset.cardinality())
    dataset = dataset.batch(_BLOCK).map(function).unbatch()
    if cardinality >= 0:
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(cardinality))
    return dataset


def _without_bom(lines):
    """`lines` without the byte order mark that editors on Windows put at a
    file's start (and that would otherwise be part of its first sentence)."""
    return tf.strings.regex_replace(lines, "^\ufeff", "", replace_global=False)


def _text_lines(path):
    compression = "GZIP" if path.endswith(".gz") else ""
    # TextLineDataset drops the line end, "\n" or "\r\n".
    return tf.data.TextLineDataset(path, compression_type=compression)
