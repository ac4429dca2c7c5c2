"""Decoding and serving settings: one dataclass, the home of every setting's
default, check and help text.

`Translator` takes a `DecodingConfig` whole; the commands export, translate and
evaluate build their decoding flags from its fields
(`keras_transformer.cli.common.add_decoding_flags`); an export records the
resolved settings in `assets.extra/config.json` ("translator"), which
`DecodingConfig.from_dict` reads back, exports written before this class
included. A new setting is a field here, with its line in the docstring.

Imports no TensorFlow: the command lines check their flags before it starts.
"""

import dataclasses
import math
import numbers
import operator

from keras_transformer.config import AUTO
from keras_transformer.config import JIT_COMPILE
from keras_transformer.config import PRECISIONS as TRAINING_PRECISIONS

# The weights' and matrix multiplies' type; "auto" is chosen for this machine.
PRECISIONS = ("float32", "bfloat16", "float16", AUTO)
# What a run's translations decode in, whatever precision it trained in: its
# export's by default (export --precision), translate and evaluate --run, and
# train's own translations (dev BLEU, the decoding it chooses, test BLEU), so
# that each BLEU train prints is the one its export and --run give.
RUN_PRECISION = "float32"
# Also what a model trained with mixed precision runs under as it is.
MIXED_PRECISIONS = tuple(name for name in TRAINING_PRECISIONS if name.startswith("mixed_"))
DEFAULT_BEAM_SIZES = (1, 2, 4, 8)
# The paper's search (Sec. 6.1): beam 4, length penalty alpha 0.6, outputs of at
# most the input's length + 50.
PAPER_BEAM_SIZE = 4
PAPER_ALPHA = 0.6
PAPER_EXTRA_LENGTH = 50
# The paper's decoding as messages name it, where a run has chosen none.
PAPER_DECODING = f"alpha {PAPER_ALPHA}, nothing blocked"
# The settings a request may give (a signature's optional inputs, the flags of
# translate and evaluate); the others are fixed when the translator is built.
# Their dtypes are the signatures' (`serving.KNOB_SPECS`) and a caller's tensors'.
REQUEST_SETTING_DTYPES = {"beam_size": "int32", "alpha": "float32", "extra_length": "int32",
                          "no_repeat_ngram_size": "int32"}
REQUEST_SETTINGS = tuple(REQUEST_SETTING_DTYPES)
# Request limits: one request holds a model server for about as long as the
# batch takes, and its memory grows with the text's length.
DEFAULT_MAX_BATCH_SIZE = 256
DEFAULT_MAX_INPUT_CHARS = 10_000
# Translating many sentences (translate, evaluate): sentences per request, sorted
# by length so that a batch wastes little padding and short ones stop early.
DEFAULT_BATCH_SIZE = 32
# With progress="auto", a progress bar shows for inputs of at least this many
# sentences, where stderr is a terminal (not in a log file, where its carriage
# returns pile up on one line).
PROGRESS_MIN_SENTENCES = 200
# Keys of an export's "translator" settings that are derived from the others.
_DERIVED = ("padded_batch_sizes", "padded_source_lengths", "ids_only")


class TruncatedInputWarning(UserWarning):
    """Sentences longer than a translator's `max_input_length` subword pieces
    were translated from their first `max_input_length` pieces only (the text
    signatures' and `translate_ids`'s `truncated` output says which): a line
    that holds a paragraph, say, whose end is missing from its translation.
    `keras_transformer.translate_sentences` warns with it; the commands say it
    as a line of their own."""


def positive_int(name, value, owner=None):
    """`value` as a Python int >= 1 (not a bool), or a ValueError naming `name`
    (and `owner`, the function or class that takes it)."""
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < 1:
        prefix = f"{owner}: " if owner else ""
        raise ValueError(f"{prefix}{name} must be a positive int. Received: {name}={value!r}")
    return number


def comma_separated_ints(text):
    """A flag's "1,2,4,8" as a tuple of ints (the export's --beam-sizes)."""
    return tuple(int(k) for k in text.split(","))


@dataclasses.dataclass(frozen=True)
class DecodingConfig:
    """How a `Translator` decodes and what requests it takes.

    Sec. 6.1: "we used beam search with a beam size of 4 and length penalty
    alpha = 0.6 [...] We set the maximum output length during inference to input
    length + 50, but terminate early when possible." Those are the defaults.

    Args:
        beam_size: the beam size K (an export's default for requests that
            name none); one of beam_sizes.
        alpha: the length penalty strength.
        extra_length: the output tokens allowed beyond the input length.
        no_repeat_ngram_size: n > 0: no translation repeats n subword pieces
            in a row that it already holds, a briefly trained model's loops
            (as CTranslate2's and fairseq's option of that name); 0, the
            paper's search, blocks nothing.
        block_adjacent_repeats: no translation repeats a run of 1 to 8 subword
            pieces that starts a word right after itself ("panes panes",
            "fuera de fuera de": a briefly trained model's stammer, in none of
            the bundled corpus's references), nor a piece of letters inside a
            word a third time in a row ("Jerusalenenen"; a name may repeat one
            twice). Needs the tokenizer (not --ids-only). False,
            the paper's search, blocks nothing.
        recase_capitals: a sentence in small letters only ("and god said"),
            in capitals only ("AND GOD SAID", its translation given back in
            capitals) or in Title Case ("And God Said Unto Moses": four words
            or more that start with a capital, none with a small letter) is
            translated with the capitals the training text gives its words
            ("And God said unto Moses", the vocabulary's `Casing`), instead
            of the noise a model that has seen few such sentences makes of
            them; and a sentence that starts with a capital gets a translation
            that does. Text signatures only (an ids-only translator has no
            text: False there).
        beam_sizes: beam sizes callers may ask for (one program each).
        max_input_length: longer inputs are truncated to their first
            max_input_length pieces, and the signatures' `truncated` output is
            true for them (default: the model's max_positions).
        max_output_length: the most tokens generated for any input (default:
            the model's max_positions with learned positions, else
            max_input_length + extra_length).
        max_batch_size: requests of more sentences are refused
            (InvalidArgument), and the model server's batches are no larger.
        max_input_chars: requests with a longer sentence are refused
            (InvalidArgument). An export has this limit; a translator that
            serves no requests (a run's own) may have none (None).
        precision: the weights' and matrix multiplies' type (softmax, layer
            norm, logits and scores stay float32): bfloat16 for CPUs with AMX
            or AVX512-BF16 and for GPUs, float16 for older GPUs; auto: bfloat16
            where this CPU has AMX or AVX512-BF16 and the search runs without
            XLA, else float32 (export on the CPU kind that serves). None: the
            model's own (resolved, the model's dtype policy, e.g.
            mixed_bfloat16).
        jit_compile: compile the beam search with XLA (the model server must
            enable XLA JIT), over the padded request shapes of
            `serving_shapes`; auto: on when a GPU is visible, or when
            xla_max_batch_size is given.
        xla_max_batch_size: XLA (also with --jit-compile auto on a CPU) for
            requests of at most this many sentences, larger ones without: on a
            CPU, XLA's latency for a few sentences and the graph's throughput
            for many (benchmarks/serving_latency.py); default: all.
        use_cache: False re-runs the decoder on the whole prefix every step
            (for tests and benchmarks); not with XLA.
        ignore_eos: the end-of-sequence token does not end a hypothesis, so
            every search runs to its length limit (benchmarks with random
            weights).
        transposed_kernels: whether searches multiply by transposed copies of
            the decoder's kernels (`Transformer.step_function`); None: where
            that pays on the CPU that traces them
            (`hardware.decoding_transposed_kernels`).
        parallel_searches: without XLA, a request's sentences are split into
            up to this many beam searches (consecutive shares) that run side by
            side; None: one per core of the CPU that exports, 1 with XLA or
            where a GPU is visible. Each gets a core where TensorFlow runs one
            intra-op thread, which translate and evaluate set for such an
            export (TF Serving: --tensorflow_intra_op_parallelism=1).
    """

    beam_size: int = PAPER_BEAM_SIZE
    alpha: float = PAPER_ALPHA
    extra_length: int = PAPER_EXTRA_LENGTH
    no_repeat_ngram_size: int = 0
    block_adjacent_repeats: bool = False
    recase_capitals: bool = True
    beam_sizes: tuple = dataclasses.field(
        default=DEFAULT_BEAM_SIZES, metadata={"parse": comma_separated_ints})
    max_input_length: int | None = None
    max_output_length: int | None = None
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_input_chars: int | None = DEFAULT_MAX_INPUT_CHARS
    precision: str | None = dataclasses.field(default=None, metadata={"choices": PRECISIONS})
    jit_compile: str = dataclasses.field(
        default="off", metadata={"bare_flag": "on", "choices": JIT_COMPILE})
    xla_max_batch_size: int | None = None
    use_cache: bool = True
    ignore_eos: bool = False
    transposed_kernels: bool | None = None
    parallel_searches: int | None = None

    def __post_init__(self):
        if isinstance(self.jit_compile, bool):  # Translator(jit_compile=True), old exports
            self._set("jit_compile", "on" if self.jit_compile else "off")
        _require("jit_compile", self.jit_compile, self.jit_compile in JIT_COMPILE,
                 f"must be {', '.join(JIT_COMPILE[:-1])} or {JIT_COMPILE[-1]}")
        _require("beam_sizes", self.beam_sizes, not isinstance(self.beam_sizes, (str, int)),
                 "must be a sequence of positive ints, e.g. (1, 2, 4, 8)")
        self._set("beam_sizes", tuple(sorted(
            {positive_int("beam_sizes", k, "DecodingConfig") for k in self.beam_sizes})))
        _require("beam_size", self.beam_size, self.beam_size in self.beam_sizes,
                 f"must be one of beam_sizes={self.beam_sizes}")
        _require("alpha", self.alpha, _is_real(self.alpha) and math.isfinite(self.alpha),
                 "must be a finite number")
        self._set("alpha", float(self.alpha))
        _require("extra_length", self.extra_length,
                 isinstance(self.extra_length, int) and not isinstance(self.extra_length, bool)
                 and self.extra_length >= 0, "must be an int >= 0")
        _require("no_repeat_ngram_size", self.no_repeat_ngram_size,
                 isinstance(self.no_repeat_ngram_size, int)
                 and not isinstance(self.no_repeat_ngram_size, bool)
                 and self.no_repeat_ngram_size >= 0, "must be an int >= 0 (0 blocks nothing)")
        for name in ("block_adjacent_repeats", "recase_capitals"):
            _require(name, getattr(self, name), isinstance(getattr(self, name), bool),
                     "must be True or False")
        for name in ("max_input_length", "max_output_length", "max_input_chars",
                     "xla_max_batch_size", "parallel_searches"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name), "DecodingConfig")
        positive_int("max_batch_size", self.max_batch_size, "DecodingConfig")
        _require("precision", self.precision,
                 self.precision in (None, *PRECISIONS, *MIXED_PRECISIONS),
                 f"must be None or one of {', '.join(PRECISIONS)}")
        _require("xla_max_batch_size", self.xla_max_batch_size,
                 self.xla_max_batch_size is None or (
                     self.jit_compile != "off" and self.xla_max_batch_size <= self.max_batch_size),
                 "needs jit_compile on (or auto) and at most max_batch_size="
                 f"{self.max_batch_size} sentences; pass no xla_max_batch_size without XLA")
        _require("use_cache", self.use_cache, self.use_cache or self.jit_compile != "on",
                 "False re-runs the decoder on a prefix that grows every step, which XLA "
                 "cannot compile; use jit_compile off with it")

    def _set(self, name, value):
        object.__setattr__(self, name, value)

    @property
    def xla(self):
        """Whether the search is compiled with XLA (once "auto" is resolved)."""
        return self.jit_compile == "on"

    def resolved(self):
        """`(config, notes)`: this config with its "auto" and None settings that
        depend on the machine chosen for it (jit_compile, precision,
        transposed_kernels, parallel_searches; see `keras_transformer.hardware`), and a line for
        people on each "auto" choice. Imports TensorFlow to look for a GPU."""
        from keras_transformer import hardware

        notes = []
        jit_compile = self.jit_compile
        if jit_compile == AUTO:
            xla = hardware.decoding_jit_compile(AUTO, self.xla_max_batch_size)
            jit_compile = "on" if xla else "off"
        precision = self.precision
        if precision == AUTO:
            precision, reason = hardware.decoding_precision(AUTO, jit_compile == "on")
            notes.append(f"--precision {precision} (auto: {reason})")
        transposed_kernels = self.transposed_kernels
        if transposed_kernels is None:
            transposed_kernels = hardware.decoding_transposed_kernels()
        parallel_searches = self.parallel_searches
        if parallel_searches is None:
            parallel_searches = hardware.decoding_parallel_searches(jit_compile == "on")
        config = dataclasses.replace(self, jit_compile=jit_compile, precision=precision,
                                     transposed_kernels=bool(transposed_kernels),
                                     parallel_searches=parallel_searches)
        return config, notes

    def to_dict(self):
        values = dataclasses.asdict(self)
        values["beam_sizes"] = list(self.beam_sizes)
        return values

    @classmethod
    def from_dict(cls, values):
        """A config from `to_dict`'s keys, or from an export's recorded
        "translator" settings (`Translator.settings()`, exports written before
        this class included: their derived keys are skipped, `jit_compile` may
        be a bool and `xla_max_batch_size` 0 for none)."""
        values = {name: value for name, value in values.items() if name not in _DERIVED}
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"DecodingConfig got unknown fields {unknown}; known fields "
                             f"are {sorted(known)}")
        if not values.get("xla_max_batch_size"):
            values["xla_max_batch_size"] = None
        return cls(**values)


def exported_limits(config, owner):
    """`config`, once it is known to limit the characters of a request's
    sentences: an export is served to whoever sends requests, and a model
    server without that limit tokenizes a sentence of any length (`owner`: the
    exporting function, for the error)."""
    if config.max_input_chars is None:
        raise ValueError(
            f"{owner}: the translator has max_input_chars=None (no limit), which an export "
            "may not have: its model server would tokenize a request's sentences of any "
            f"length; build it with a limit (the default: {DEFAULT_MAX_INPUT_CHARS} characters)")
    return config


def in_process_settings(beam_size=None):
    """The `DecodingConfig` settings of a translator that its own process calls,
    never a model server: a command's with a run, a training run's own for its
    dev and test BLEU. It traces one search, that of `beam_size` (None: the
    default, the paper's 4), which all its calls ask for: each beam size of
    `beam_sizes` is a search to trace, seconds each on a CPU. And it limits no
    sentence's characters: its sentences are the user's own text, a paragraph
    of which is translated from its first `max_input_length` pieces, and said
    to be (`TruncatedInputWarning`), not refused."""
    beam_size = DecodingConfig.beam_size if beam_size is None else beam_size
    return {"beam_size": beam_size, "beam_sizes": (beam_size,), "max_input_chars": None}


def _is_real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _require(name, value, condition, requirement):
    if not condition:
        raise ValueError(f"DecodingConfig: {name} {requirement}. Received: {name}={value!r}")
