"""Translating many sentences and scoring them with BLEU.

Two BLEU scores, because the paper's are not comparable with today's:
- sacreBLEU (Post, 2018) on detokenized text with its default 13a tokenization,
  reported with its signature string; the score to compare across papers.
- "tokenized BLEU", the paper-style number: Sec. 6.1's scores were computed on
  tokenized text (tensor2tensor's `t2t-bleu`, which tokenizes like mteval-v14's
  international tokenization, or multi-bleu.perl on Moses tokens with hyphenated
  compounds split). Here it is sacreBLEU with `tokenize="intl"`, which is that
  mteval-v14 tokenization: it splits punctuation, hyphens included, from the
  words around it, so a matching hyphenated compound counts as several matching
  tokens (the effect of the paper-era compound splitting). It differs from the
  13a score, usually upward. Its signature is returned too.
"""

import os
import re
import sys
import time
import warnings

import sacrebleu
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the ops of a loaded export's tokenizer)
import tqdm

from keras_transformer import loading
from keras_transformer.decoding_config import DEFAULT_BATCH_SIZE
from keras_transformer.decoding_config import PAPER_ALPHA
from keras_transformer.decoding_config import PROGRESS_MIN_SENTENCES
from keras_transformer.decoding_config import REQUEST_SETTING_DTYPES
from keras_transformer.decoding_config import TruncatedInputWarning


def translate_sentences(
    translator_or_export,
    sentences,
    batch_size=DEFAULT_BATCH_SIZE,
    progress=False,
    *,
    beam_size=None,
    alpha=None,
    extra_length=None,
    no_repeat_ngram_size=None,
    first_number=1,
    named="sentence",
):
    """Translates a list of sentences, in batches, keeping their order.

    Args:
        translator_or_export: a `keras_transformer.serving.Translator`, a
            SavedModel loaded with `tf.saved_model.load`, or the path of an
            export (a version directory, or a base directory whose largest
            version is used).
        sentences: strings (or bytes) to translate.
        batch_size: sentences per call, at most the translator's
            `max_batch_size` (a limit set at export).
        progress: True for a progress bar on stderr; "auto" for one only when
            there are at least 200 sentences and stderr is a terminal.
        beam_size, alpha, extra_length, no_repeat_ngram_size: optional
            decoding settings (`decoding_config.REQUEST_SETTINGS`); the
            translator's own when None.
        first_number: the number that errors give the first sentence (that of
            a chunk of a longer input).
        named: what errors and warnings call a sentence, before its number:
            "sentence 3", or "dev sentence 3" for a corpus's dev split.

    Returns:
        A list of translations (str), one per sentence.

    Raises:
        ValueError: a sentence is longer than the translator's
            `max_input_chars` (checked before any is translated), or the
            translator refused a request.

    Warns:
        TruncatedInputWarning: sentences had more subword pieces than the
            translator's `max_input_length`, and only their first ones were
            translated (one warning for the call, naming the first).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1. Received: batch_size={batch_size}")
    translator_or_export = _translator(translator_or_export)
    limits = _request_limits(translator_or_export)
    batch_size = min(batch_size, limits.get("max_batch_size") or batch_size)
    settings = dict(beam_size=beam_size, alpha=alpha, extra_length=extra_length,
                    no_repeat_ngram_size=no_repeat_ngram_size)
    knobs = {name: tf.constant(settings[name], dtype)
             for name, dtype in REQUEST_SETTING_DTYPES.items() if settings[name] is not None}
    sentences = [s.decode("utf-8", "replace") if isinstance(s, bytes) else s
                 for s in sentences]
    _check_lengths(sentences, limits.get("max_input_chars"), first_number, named)
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]), reverse=True)
    translations = [None] * len(sentences)
    truncated = []  # the indices of sentences translated from their first pieces only
    if progress == "auto":
        progress = len(sentences) >= PROGRESS_MIN_SENTENCES and sys.stderr.isatty()
    bar = tqdm.tqdm(
        total=len(sentences), unit="sent", disable=not progress, file=sys.stderr,
        dynamic_ncols=True,
    )
    with bar:
        for start in range(0, len(order), batch_size):
            indices = order[start:start + batch_size]
            batch = tf.constant([sentences[i] for i in indices], tf.string)
            try:
                # Through the module: a loaded export's functions keep no
                # reference to it, and its variables go with it.
                outputs = translator_or_export.translate(batch, **knobs)
            except tf.errors.InvalidArgumentError as error:
                raise ValueError(
                    f"the translator rejected the request: {_assertion_message(error)}"
                ) from error
            for i, text in zip(indices, outputs["translation"].numpy()):
                translations[i] = text.decode("utf-8")
            if "truncated" in outputs:  # not in exports from before 2026-12-07
                truncated += [i for i, cut in zip(indices, outputs["truncated"].numpy()) if cut]
            bar.update(len(indices))
    if truncated:
        warnings.warn(TruncatedInputWarning(_truncation_message(
            sorted(truncated), limits.get("max_input_length"), first_number, named)),
            stacklevel=2)
    return translations


def bleu_scores(hypotheses, references):
    """sacreBLEU and paper-style tokenized BLEU of detokenized translations.

    Args:
        hypotheses: list of translations (str).
        references: list of reference translations (str), one per hypothesis.

    Returns:
        A dict: `"bleu"` (sacreBLEU, 13a tokenization, 0-100), `"signature"`
        (its signature string), `"tokenized_bleu"` (BLEU with mteval-v14
        international tokenization, see the module docstring),
        `"tokenized_signature"`, `"sentences"`, and `"text"`: sacreBLEU's
        one-line report.
    """
    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(
            f"bleu_scores: {len(hypotheses)} hypotheses but {len(references)} "
            "references; they must align one to one"
        )
    if not hypotheses:
        raise ValueError("bleu_scores: no sentences to score")
    bleu = sacrebleu.metrics.BLEU()
    score = bleu.corpus_score(hypotheses, [references])
    tokenized = sacrebleu.metrics.BLEU(tokenize="intl")
    tokenized_score = tokenized.corpus_score(hypotheses, [references])
    return {
        "bleu": score.score,
        "signature": str(bleu.get_signature()),
        "tokenized_bleu": tokenized_score.score,
        "tokenized_signature": str(tokenized.get_signature()),
        "sentences": len(hypotheses),
        "text": str(score),
    }


def evaluate(
    translator_or_export,
    pairs,
    batch_size=DEFAULT_BATCH_SIZE,
    progress=False,
    *,
    limit=None,
    named="sentence",
    **decoding,
):
    """Translates the sources of a parallel corpus and scores them with BLEU.

    Args:
        translator_or_export: as for `translate_sentences`.
        pairs: a `tf.data.Dataset` of `{"source", "target"}` strings (as
            `keras_transformer.data.load_parallel` returns), or a list of
            `(source, target)` pairs.
        batch_size, progress, named: as for `translate_sentences`.
        limit: optional int, score only the first `limit` pairs.
        **decoding: `beam_size`, `alpha`, `extra_length`,
            `no_repeat_ngram_size`, as for `translate_sentences`.

    Returns:
        The dict of `bleu_scores`, plus `"hypotheses"` (the translations),
        `"seconds"` and `"sentences_per_second"`.
    """
    sources, references = _read_pairs(pairs, limit)
    start = time.perf_counter()
    hypotheses = translate_sentences(
        translator_or_export, sources, batch_size, progress, named=named, **decoding
    )
    seconds = time.perf_counter() - start
    scores = bleu_scores(hypotheses, references)
    scores.update(
        hypotheses=hypotheses,
        seconds=seconds,
        sentences_per_second=len(sources) / seconds if seconds > 0 else float("inf"),
    )
    return scores


# What `choose_decoding` tries: length penalties from the paper's up, with
# repeated 4-grams blocked; then, at the alpha chosen, the paper's search without
# blocking, which blocking must beat.
BLOCKED_NGRAM_SIZE = 4
ALPHAS = (PAPER_ALPHA, 0.8, 1.0, 1.2)


def choose_decoding(translator_or_export, pairs, block=BLOCKED_NGRAM_SIZE, alphas=ALPHAS,
                    batch_size=DEFAULT_BATCH_SIZE, *, limit=None, blocking=None):
    """The request settings that translate `pairs` (dev pairs, as its messages
    call them) best, as the paper chose its length penalty (Sec. 6.1: "These
    hyperparameters were chosen after experimentation on the development set").

    First `alpha`, with repeated n-grams of `block` pieces blocked: each of
    `alphas`; the best kept, the earliest on a tie. Every one is tried: on 200
    dev pairs BLEU against alpha is not smooth (a Zen 4 quickstart of
    2026-12-06 scored 20.65 at 0.6, 20.64 at 0.8 and 21.54 at 1.2; a search
    that stopped at the first fall kept 0.6, 26.03 on the test pairs where 1.2
    gives 26.42). Then, at that alpha, the paper's search, which blocks
    nothing: blocking is kept only where it scores higher.

    A briefly trained model loops ("de los hijos de los hijos de los hijos"):
    blocking repeated 4-grams mends most of that and, on six quickstart models,
    never cost test BLEU at the same alpha (docs/training.md). Its translations
    are shorter, so alpha is chosen for it; a model that never loops translates
    alike either way and keeps the paper's search (a tie keeps it: text that
    repeats itself may tie on a few dev pairs and lose to blocking on others).

    Args:
        translator_or_export, batch_size: as for `translate_sentences`.
        pairs, limit: as for `evaluate`.
        block: the `no_repeat_ngram_size` tried; 0 chooses alpha only.
        alphas: increasing length penalties, the first the default.
        blocking: None, or a translator of the same model that also blocks
            runs of words repeated right after themselves
            (`DecodingConfig.block_adjacent_repeats`): the searches that block
            (n > 0) run on it, the paper's on `translator_or_export`.

    Returns:
        `(settings, scores)`: `{"no_repeat_ngram_size": n, "alpha": a}` chosen
        (with `"block_adjacent_repeats": True` where `blocking`'s searches
        won), and `{(n, a): sacreBLEU}` for each pair tried, in the order tried.
    """
    if not alphas or list(alphas) != sorted(alphas):
        raise ValueError(f"choose_decoding needs increasing alphas. Received: alphas={alphas!r}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 0:
        raise ValueError(f"choose_decoding needs an int block >= 0. Received: block={block!r}")
    sources, references = _read_pairs(pairs, limit)
    scores = {}

    def score(size, alpha):
        translator = blocking if size and blocking is not None else translator_or_export
        hypotheses = translate_sentences(translator, sources, batch_size, alpha=alpha,
                                         no_repeat_ngram_size=size, named="dev sentence")
        scores[size, alpha] = bleu_scores(hypotheses, references)["bleu"]
        return scores[size, alpha]

    by_alpha = {alpha: score(block, alpha) for alpha in alphas}
    alpha = _first_best(by_alpha)
    blocks = block > 0 and by_alpha[alpha] > score(0, alpha)
    settings = {"no_repeat_ngram_size": block if blocks else 0, "alpha": alpha}
    if blocks and blocking is not None:
        settings["block_adjacent_repeats"] = True
    return settings, scores


def _first_best(scores):
    """The first key of `scores` with the highest value."""
    best = max(scores.values())
    return next(key for key, value in scores.items() if value == best)


def _translator(translator_or_export):
    if isinstance(translator_or_export, (str, os.PathLike)):
        translator_or_export = loading.load_export(translator_or_export)
    if getattr(translator_or_export, "translate", None) is None:
        raise TypeError(
            "translate_sentences needs a Translator, a loaded export or an export "
            f"path. Received: {type(translator_or_export).__name__}"
        )
    return translator_or_export


def _request_limits(translator):
    """A translator's request limits, `{"max_batch_size": n, "max_input_chars":
    n, "max_input_length": n}`: a `Translator`'s config, or the settings an
    export recorded (`loading.load_export`); {} where unknown."""
    config = getattr(translator, "config", None)
    names = ("max_batch_size", "max_input_chars", "max_input_length")
    if hasattr(config, "max_batch_size"):
        return {name: getattr(config, name) for name in names}
    settings = getattr(translator, "recorded_settings", {})
    return {name: settings[name] for name in names if name in settings}


def _named(indices, first_number, named):
    """The sentences of `indices` (sorted, at least one) as messages name them,
    numbered from `first_number`, `named` so: "sentence 3 (and 1 more)"."""
    others = f" (and {len(indices) - 1} more)" if len(indices) > 1 else ""
    return f"{named} {indices[0] + first_number}{others}"


def _truncation_message(truncated, max_input_length, first_number, named):
    """What `TruncatedInputWarning` says of the sentences of indices
    `truncated` (sorted), numbered from `first_number`, `named` so."""
    return (f"{_named(truncated, first_number, named)} has more subword pieces than "
            f"the translator's max_input_length={max_input_length}: only its first "
            f"{max_input_length} were translated, and its translation misses the rest; "
            "split long lines into sentences")


def _check_lengths(sentences, max_input_chars, first_number, named):
    if not max_input_chars:
        return
    too_long = [i for i, sentence in enumerate(sentences) if len(sentence) > max_input_chars]
    if too_long:
        raise ValueError(
            f"{_named(too_long, first_number, named)} is longer than the translator's "
            f"max_input_chars={max_input_chars} characters (a limit set at export): "
            f"{len(sentences[too_long[0]])} characters; split it, or export with a larger "
            "--max-input-chars")


# The lines of a graph's error that say where, not what.
_GRAPH_ERROR_LINES = re.compile(r"Graph execution error|Detected at node|<stack traces|\[\[|File ")
# The groups `tf.debugging.assert_non_negative` adds after the message.
_ASSERT_DETAILS = re.compile(r"Condition .* did not hold|\S+ \(\S+:\d+\) = $")


def _assertion_message(error):
    """The readable part of a failed in-graph check, without the node dump:
    "extra_length must be >= 0; received -1" for TensorFlow's "assertion
    failed: [extra_length must be >= 0; received.  ] [Condition x >= 0 did not
    hold element-wise:] [x (extra_length:0) = ] [-1]"."""
    match = re.search(r"assertion failed: (.*)", error.message)
    if match:
        groups = _bracket_groups(match.group(1))
        if not groups:
            return match.group(1).strip()
        message, *values = groups
        values = [value for value in values if not _ASSERT_DETAILS.search(value)]
        return " ".join([message.strip().rstrip(". "), *values])
    lines = [line.strip() for line in error.message.splitlines()
             if line.strip() and not _GRAPH_ERROR_LINES.match(line.strip())]
    return lines[0] if lines else str(error)


def _bracket_groups(text):
    """The contents of the top-level `[...]` groups of `text`, nested brackets
    kept: ["a [1, 2] b", "3"] for "[a [1, 2] b] [3]"."""
    groups, depth, start = [], 0, 0
    for i, character in enumerate(text):
        if character == "[":
            depth += 1
            if depth == 1:
                start = i + 1
        elif character == "]" and depth:
            depth -= 1
            if depth == 0:
                groups.append(text[start:i])
    return groups


def _read_pairs(pairs, limit):
    if isinstance(pairs, tf.data.Dataset):
        if limit is not None:
            pairs = pairs.take(limit)
        sources, references = [], []
        for block in pairs.batch(4096).as_numpy_iterator():
            sources += [s.decode("utf-8") for s in block["source"]]
            references += [t.decode("utf-8") for t in block["target"]]
        return sources, references
    pairs = list(pairs)[:limit]
    return [source for source, _ in pairs], [target for _, target in pairs]
