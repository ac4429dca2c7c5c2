"""Model hyper-parameters: one dataclass, with the paper's presets.

Sec. 3 and Table 3 of "Attention Is All You Need" name every value here; the
presets `base`, `big` and the Table 3 rows are reachable by name through
`TransformerConfig.preset(name, vocab_size=...)`.
"""

import dataclasses
import json

from keras_transformer.corpus_names import BUNDLED
from keras_transformer.token_ids import BYTE_TOKENS
from keras_transformer.token_ids import smallest_vocab_size

POSITIONAL_ENCODINGS = ("sinusoidal", "learned")
STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
# TrainingConfig.precision and jit_compile "auto": chosen for the device at the
# start of a run (`keras_transformer.hardware.resolve`).
AUTO = "auto"
JIT_COMPILE = (AUTO, "on", "off")
TIME_BUDGET_CLOCKS = ("wall", "cpu")
# TrainingConfig.model "auto": the CPU preset for the time budget, by the budget's
# CPU-minutes (wall-clock minutes count once per core the process may use).
AUTO_MODEL = "auto"
_CPU_RECIPES = ((30.0, "cpu-small"), (90.0, "cpu-medium"), (float("inf"), "cpu-large"))
# What a new run of a model of the paper's width (d_model PAPER_MIN_D_MODEL or more)
# without a time budget takes unless told otherwise (`TrainingConfig.for_model`);
# TrainingConfig's defaults are the CPU recipes' (d_model 256).
# Sec. 5.3's warm-up. With the default, 300, the base model's learning rate peaks at
# 2.6e-3, four times the paper's 7e-4, and on an H200 it did not learn
# (docs/gpu-sessions.md).
PAPER_WARMUP_STEPS = 4000
# TrainingConfig.paper()'s checkpoint interval (the paper wrote its checkpoints every 10
# minutes). With the default, 250, the base model's dev pass and checkpoint would take
# 22% of an H200's wall clock, with 1000 7% (docs/gpu-and-distribution.md).
PAPER_CHECKPOINT_EVERY = 1000
PAPER_MIN_D_MODEL = 512
# Sec. 5.1's data: a shared BPE vocabulary of about 37000 tokens (learned here from
# the first 2 million sentences), batches of about 25000 source and 25000 target
# tokens; sentences up to 256 tokens. The library's batching and vocabulary
# default to them; `TrainingConfig.paper()` takes them.
PAPER_VOCAB_SIZE = 37000
PAPER_VOCAB_SENTENCES = 2_000_000
PAPER_TOKENS_PER_BATCH = 25000
PAPER_MAX_SENTENCE_TOKENS = 256
# TrainingConfig field: the value such a run takes.
PAPER_WIDTH_SETTINGS = {"warmup_steps": PAPER_WARMUP_STEPS,
                        "checkpoint_every": PAPER_CHECKPOINT_EVERY}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of the encoder-decoder Transformer.

    Args:
        vocab_size: size of the shared source/target subword vocabulary
            (paper: about 37000 BPE tokens for EN-DE). Id 0 is padding.
        num_layers: N, the number of encoder layers and of decoder layers.
        d_model: width of the embeddings and of every sub-layer output.
        d_ff: inner size of the position-wise feed-forward network.
        num_heads: h, the number of attention heads.
        key_dim: d_k, the per-head query/key size. Defaults to d_model / h.
        value_dim: d_v, the per-head value size. Defaults to d_model / h.
        dropout_rate: P_drop, applied to every sub-layer output before the
            residual add and to the sum of embeddings and positions.
        label_smoothing: eps_ls, used by the training loss.
        positional_encoding: "sinusoidal" (Sec. 3.5) or "learned" (Table 3
            row E).
        max_positions: the positions the learned positional embeddings cover,
            so the longest source or output; sinusoidal encodings have no
            limit, but a `Translator` takes it as its default bound.
        norm_first: False for the paper's post-norm residuals,
            `LayerNorm(x + Dropout(Sublayer(x)))`; True for the pre-norm
            variant, `x + Dropout(Sublayer(LayerNorm(x)))`, with a final
            layer norm after each stack.
        layer_norm_epsilon: epsilon of every layer normalization.
    """

    vocab_size: int
    num_layers: int = 6
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8
    key_dim: int | None = None
    value_dim: int | None = None
    dropout_rate: float = 0.1
    label_smoothing: float = 0.1
    positional_encoding: str = "sinusoidal"
    max_positions: int = 256
    norm_first: bool = False
    layer_norm_epsilon: float = 1e-6

    def __post_init__(self):
        for name in ("num_layers", "d_model", "d_ff", "num_heads", "max_positions"):
            _require(name, getattr(self, name), getattr(self, name) >= 1, "must be >= 1")
        _require(
            "vocab_size",
            self.vocab_size,
            self.vocab_size >= 4,
            "must be >= 4 (padding, unknown, begin and end of sequence are reserved)",
        )
        for name in ("key_dim", "value_dim"):
            value = getattr(self, name)
            if value is None:
                if self.d_model % self.num_heads:
                    raise ValueError(
                        f"TransformerConfig: d_model must be divisible by num_heads "
                        f"when {name} is not given. Received: d_model={self.d_model}, "
                        f"num_heads={self.num_heads}"
                    )
            else:
                _require(name, value, value >= 1, "must be >= 1")
        for name in ("dropout_rate", "label_smoothing"):
            value = getattr(self, name)
            _require(name, value, 0.0 <= value < 1.0, "must be in [0, 1)")
        _require(
            "positional_encoding",
            self.positional_encoding,
            self.positional_encoding in POSITIONAL_ENCODINGS,
            f"must be one of {POSITIONAL_ENCODINGS}",
        )
        _require(
            "layer_norm_epsilon",
            self.layer_norm_epsilon,
            self.layer_norm_epsilon > 0,
            "must be > 0",
        )

    @property
    def d_k(self):
        """Per-head query/key size: `key_dim`, or d_model / h when not given."""
        return self.key_dim or self.d_model // self.num_heads

    @property
    def d_v(self):
        """Per-head value size: `value_dim`, or d_model / h when not given."""
        return self.value_dim or self.d_model // self.num_heads

    # Presets ---------------------------------------------------------------

    @classmethod
    def base(cls, vocab_size, **overrides):
        """The paper's base model (65M parameters with 37000 tokens)."""
        return cls.preset("base", vocab_size, **overrides)

    @classmethod
    def big(cls, vocab_size, **overrides):
        """The paper's big model (213M parameters with 37000 tokens)."""
        return cls.preset("big", vocab_size, **overrides)

    @classmethod
    def tiny(cls, vocab_size, **overrides):
        """A small model for tests and the bundled corpus (not in the paper)."""
        return cls.preset("tiny", vocab_size, **overrides)

    @classmethod
    def preset(cls, name, vocab_size, **overrides):
        """Returns the preset called `name`; see `TransformerConfig.presets()`."""
        if name not in _PRESETS:
            raise ValueError(
                f"Unknown TransformerConfig preset {name!r}. "
                f"Choose one of: {', '.join(cls.presets())}"
            )
        values = dict(_PRESETS[name])
        values.update(overrides)
        return cls(vocab_size=vocab_size, **values)

    @staticmethod
    def presets():
        """Names accepted by `TransformerConfig.preset`."""
        return tuple(_PRESETS)

    # Serialization ---------------------------------------------------------

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        return _from_dict(cls, values)

    def to_json(self):
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text):
        return cls.from_dict(json.loads(text))


def _require(name, value, condition, requirement, owner="TransformerConfig"):
    if not condition:
        raise ValueError(f"{owner}: {name} {requirement}. Received: {name}={value!r}")


def _one_of(choices):
    return ", ".join(choices[:-1]) + " or " + choices[-1]


# Names that older runs' and exports' config.json files use.
_RENAMED = {"TransformerConfig": {"max_length": "max_positions"},
            "TrainingConfig": {"max_length": "max_sentence_tokens"}}
# Fields that older runs' config.json files lack, with the value those runs
# trained with (a resumed run reads the batches it would have read).
_ADDED = {"TrainingConfig": {"unpunctuated_share": 0.0, "clause_share": 0.0}}


def _from_dict(cls, values):
    renamed = _RENAMED.get(cls.__name__, {})
    values = {renamed.get(name, name): value for name, value in values.items()}
    values = {**_ADDED.get(cls.__name__, {}), **values}
    known = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(
            f"{cls.__name__} got unknown fields {unknown}; known fields are {sorted(known)}"
        )
    return cls(**values)


# Table 3 rows are variations of base; only the changed fields are listed.
_PRESETS = {
    "tiny": dict(num_layers=2, d_model=64, d_ff=256, num_heads=4, max_positions=128),
    "base": {},
    "big": dict(d_model=1024, d_ff=4096, num_heads=16, dropout_rate=0.3),
    # (A) number of heads, keeping the amount of computation constant.
    "a_h1": dict(num_heads=1, key_dim=512, value_dim=512),
    "a_h4": dict(num_heads=4, key_dim=128, value_dim=128),
    "a_h16": dict(num_heads=16, key_dim=32, value_dim=32),
    "a_h32": dict(num_heads=32, key_dim=16, value_dim=16),
    # (B) smaller attention key size d_k (d_v stays 64).
    "b_dk16": dict(key_dim=16),
    "b_dk32": dict(key_dim=32),
    # (C) model size.
    "c_n2": dict(num_layers=2),
    "c_n4": dict(num_layers=4),
    "c_n8": dict(num_layers=8),
    "c_dmodel256": dict(d_model=256, key_dim=32, value_dim=32),
    "c_dmodel1024": dict(d_model=1024, key_dim=128, value_dim=128),
    "c_dff1024": dict(d_ff=1024),
    "c_dff4096": dict(d_ff=4096),
    # (D) regularization.
    "d_dropout0": dict(dropout_rate=0.0),
    "d_dropout0.2": dict(dropout_rate=0.2),
    "d_ls0": dict(label_smoothing=0.0),
    "d_ls0.2": dict(label_smoothing=0.2),
    # (E) learned positional embeddings instead of sinusoids.
    "e_learned": dict(positional_encoding="learned"),
    # For the best BLEU per CPU-minute on 2 CPU cores (docs/cpu-recipes.md): cpu-small
    # up to 30 CPU-minutes, cpu-medium up to 90, cpu-large beyond.
    "cpu-small": dict(num_layers=1, d_model=256, d_ff=1024, num_heads=4),
    # Deeper stacks pre-norm: at these budgets' learning rates a post-norm stack of 3
    # layers learned little in 300 steps (docs/cpu-recipes.md, "Why a deeper model failed").
    "cpu-medium": dict(num_layers=2, d_model=256, d_ff=1024, num_heads=4, norm_first=True),
    "cpu-large": dict(num_layers=3, d_model=256, d_ff=1024, num_heads=4, norm_first=True),
}


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """Training settings; `train.py`'s flags are these fields.

    The defaults suit a CPU: the bundled corpus, a model picked for the time
    budget. `TrainingConfig.paper()` gives the paper's recipe (Sec. 5).

    Args:
        data: "bundled", "tfds:NAME[/CONFIG]", a tab-separated file, or
            "SOURCE_FILE,TARGET_FILE"; file paths may hold "{split}" (train,
            dev, test).
        source_language, target_language: language keys for "bundled" and TFDS.
        model: a `TransformerConfig` preset name (cpu-small, cpu-medium,
            cpu-large, base, big, Table 3 rows, tiny), or "auto": the CPU preset
            for `time_budget` (see `model_preset`), cpu-small without one.
        init_from: a run directory, or a `.weights.h5` file of one (averaged
            weights or a checkpoint), whose weights, vocabulary and model a new
            run starts from, with a fresh optimizer and schedule (fine-tuning,
            e.g. on new data); "" for random weights.
        vocab_size: size of the shared subword vocabulary (paper: 37000).
        vocab_sentences: at most this many sentences train the vocabulary.
        steps: optimizer steps in all (paper: 100K base, 300K big); any
            positive number: the last checkpoint is written at the last step.
            With a time budget, the most steps to train.
        time_budget: minutes to train (0: no limit), counted over the whole
            run: a resumed run trains for what is left. Training stops at the
            checkpoint nearest the budget's end; the checkpoint interval and
            warm-up are planned for the steps the budget allows, measured from
            the first steps.
        time_budget_clock: "wall" (elapsed time) or "cpu" (the process's CPU
            time, as the quality benchmark counts it).
        tokens_per_batch: source and target token budget of a batch, per
            replica (paper: about 25000 per step in all).
        accumulate_steps: batches per optimizer update (gradient accumulation):
            a step trains on accumulate_steps x tokens_per_batch tokens per
            replica, its loss normalized over all of them; steps, warm-up and
            checkpoints count updates.
        max_sentence_tokens: the longest source or target sentence trained on,
            in tokens; longer pairs are dropped and counted.
        unpunctuated_share: the share of the training pairs ending in
            punctuation that lose it, drawn afresh each epoch, so that the model
            learns to end a sentence that has none: trained on a corpus whose
            every line ends in punctuation (the bundled Bible), it otherwise
            runs an input such as "Jesus wept" on in loops. 0: the pairs as they
            are (the paper's recipe).
        clause_share: the share of the training pairs that split into aligned
            clauses (at , ; : on both sides) whose clauses join the corpus as
            pairs of their own, drawn once from the seed, so that the model
            learns short inputs too: trained on long sentences alone (the
            bundled Bible's verses), it otherwise runs an input such as "The
            Lord is my shepherd" on in loops. 0: none (the paper's recipe).
        warmup_steps: of the learning-rate schedule (paper: 4000). With
            `learning_rate_scale` it sets the peak learning rate,
            `scale * (d_model * warmup_steps)^-0.5` (3.6e-3 for d_model 256).
            The default, 300, is the CPU recipes'; a new run of a model with
            d_model 512 or more without a time budget takes the paper's 4000
            (`for_model`), and a time budget plans its own.
        learning_rate_scale: constant factor on the schedule (paper: 1). A
            time budget's plan keeps the peak it gives over the planned warm-up.
            Unless given, a time budget on a CPU takes its recipe's
            (`recipes.RECIPES`).
        checkpoint_every: steps between checkpoints, dev-loss evaluations and
            log lines (planned from the budget when there is one). The default,
            250, is the CPU recipes'; a new run of a model with d_model 512 or
            more without a time budget takes the paper recipe's 1000
            (`for_model`).
        keep_checkpoints: checkpoints kept on disk.
        average_last: checkpoints averaged into the final weights (paper: 5
            base, 20 big).
        bleu_every: steps between dev BLEU evaluations (a multiple of
            checkpoint_every; 0: never).
        bleu_sentences: size of the dev subset that BLEU is computed on.
        alpha_sentences: dev sentences on which, when training ends, the run's
            decoding is chosen (Sec. 6.1 chose alpha on the development set):
            the length penalty alpha with repeated 4-grams blocked, the
            paper's 0.6, 0.8, 1.0 and 1.2, the best of the four; then
            blocking kept only if it beats the paper's search at that alpha
            (`evaluation.choose_decoding`). Exports, translate and evaluate of
            the run take them unless given --alpha or --no-repeat-ngram-size;
            the export of a run that stopped before its end chooses them on
            these dev sentences. 0: the paper's decoding (alpha 0.6, nothing
            blocked).
        test_sentences: test sentences translated for the final BLEU (0: no
            final evaluation).
        strategy: "auto", "one_device", "mirrored", "multi_worker" or "tpu".
        precision: "float32", "mixed_float16", "mixed_bfloat16", or "auto":
            mixed_bfloat16 on GPUs and TPUs with bfloat16 and on CPUs with
            bfloat16 instructions (AMX, AVX512-BF16), mixed_float16 on older
            GPUs, else float32.
        jit_compile: compile the training step with XLA: "on", "off", or
            "auto": on for GPUs and TPUs, off on a CPU (where it costs a
            compilation per batch shape for no faster step).
        length_buckets: the number of padded lengths that batches come in, each
            one XLA compilation (the rows of a bucket's batches are fixed by
            tokens_per_batch); chosen to pad least for the corpus. 0: fine
            buckets, every multiple of 8 that grows by about 10% (20 up to 256
            tokens) on a CPU, 8 on GPUs and TPUs.
        compilation_cache: a directory where XLA keeps the programs it compiled
            (and on a GPU its GEMM autotuning), so that a resumed run or another
            run of the same shapes loads them instead of compiling again; ""
            for none.
        seed: seeds weights, dropout and shuffling.
    """

    data: str = BUNDLED
    source_language: str | None = None
    target_language: str | None = None
    model: str = AUTO_MODEL
    init_from: str = ""
    vocab_size: int = 8000
    vocab_sentences: int = 200_000
    steps: int = 1000
    time_budget: float = 0.0
    time_budget_clock: str = "wall"
    tokens_per_batch: int = 4096
    accumulate_steps: int = 1
    max_sentence_tokens: int = 128
    unpunctuated_share: float = 0.5
    clause_share: float = 0.25
    warmup_steps: int = 300
    learning_rate_scale: float = 1.0
    checkpoint_every: int = 250
    keep_checkpoints: int = 5
    average_last: int = 5
    bleu_every: int = 0
    bleu_sentences: int = 100
    alpha_sentences: int = 200
    test_sentences: int = 500
    strategy: str = "auto"
    precision: str = AUTO
    jit_compile: str = dataclasses.field(default=AUTO, metadata={"bare_flag": "on"})
    length_buckets: int = 0
    compilation_cache: str = "~/.cache/keras_transformer/xla"
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.jit_compile, bool):  # runs written before "auto" existed
            object.__setattr__(self, "jit_compile", "on" if self.jit_compile else "off")
        positive = ("vocab_size", "vocab_sentences", "steps", "tokens_per_batch",
                    "accumulate_steps", "max_sentence_tokens",
                    "warmup_steps", "checkpoint_every", "keep_checkpoints", "average_last",
                    "bleu_sentences")
        for name in positive:
            value = getattr(self, name)
            _require(name, value, value >= 1, "must be >= 1", "TrainingConfig")
        for name in ("bleu_every", "alpha_sentences", "test_sentences", "seed", "time_budget",
                     "length_buckets"):
            value = getattr(self, name)
            _require(name, value, value >= 0, "must be >= 0", "TrainingConfig")
        for name in ("unpunctuated_share", "clause_share"):
            value = getattr(self, name)
            _require(name, value, 0 <= value <= 1, "must be between 0 and 1", "TrainingConfig")
        _require("vocab_size", self.vocab_size, self.vocab_size >= smallest_vocab_size(),
                 f"must be >= {smallest_vocab_size()} (4 reserved ids and "
                 f"{BYTE_TOKENS} byte tokens plus pieces)", "TrainingConfig")
        _require("tokens_per_batch", self.tokens_per_batch,
                 self.tokens_per_batch >= self.max_sentence_tokens,
                 f"must be >= max_sentence_tokens ({self.max_sentence_tokens}), or a pair of "
                 "the longest length would not fit a batch", "TrainingConfig")
        _require("learning_rate_scale", self.learning_rate_scale,
                 self.learning_rate_scale > 0, "must be > 0", "TrainingConfig")
        models = (AUTO_MODEL, *_PRESETS)
        _require("model", self.model, self.model in models,
                 f"must be one of {', '.join(models)}", "TrainingConfig")
        _require("bleu_every", self.bleu_every, self.bleu_every % self.checkpoint_every == 0,
                 f"must be a multiple of checkpoint_every ({self.checkpoint_every})",
                 "TrainingConfig")
        _require("average_last", self.average_last, self.average_last <= self.keep_checkpoints,
                 f"must be <= keep_checkpoints ({self.keep_checkpoints})", "TrainingConfig")
        _require("strategy", self.strategy, self.strategy in STRATEGIES,
                 f"must be {_one_of(STRATEGIES)}", "TrainingConfig")
        _require("precision", self.precision, self.precision in (AUTO, *PRECISIONS),
                 f"must be {_one_of((AUTO, *PRECISIONS))}", "TrainingConfig")
        _require("jit_compile", self.jit_compile, self.jit_compile in JIT_COMPILE,
                 f"must be {_one_of(JIT_COMPILE)}", "TrainingConfig")
        _require("time_budget_clock", self.time_budget_clock,
                 self.time_budget_clock in TIME_BUDGET_CLOCKS,
                 f"must be {_one_of(TIME_BUDGET_CLOCKS)}", "TrainingConfig")
        self.check_workers(self.strategy == "multi_worker")
        _require("time_budget", self.time_budget,
                 not self.time_budget or self.accumulate_steps == 1,
                 "must be 0 with accumulate_steps > 1 (the budget plans single-batch "
                 "steps): give --steps instead", "TrainingConfig")

    def check_workers(self, several):
        """Refuses a time budget where the run has `several` workers (strategy
        "multi_worker", or "auto" where TF_CONFIG names several tasks:
        `distributed.spans_workers`), whose workers would each choose a recipe
        and plan from their own timings."""
        _require("time_budget", self.time_budget, not self.time_budget or not several,
                 "must be 0 on a multi-worker run (strategy multi_worker, or auto where "
                 "TF_CONFIG names several tasks), whose workers cannot plan from one "
                 "process's timings: give --steps instead", "TrainingConfig")

    def model_preset(self, cores=1):
        """The `TransformerConfig` preset to train: `model`, or for "auto" the CPU
        recipe for the time budget (cpu-small without one). A wall-clock budget
        counts `cores` CPU-minutes a minute."""
        if self.model != AUTO_MODEL:
            return self.model
        cpu_minutes = self.time_budget * (cores if self.time_budget_clock == "wall" else 1)
        return next(name for limit, name in _CPU_RECIPES if cpu_minutes <= limit)

    @classmethod
    def paper(cls, model="base", **overrides):
        """The paper's recipe (Sec. 5): WMT 2014 EN-DE, 37000 shared BPE tokens,
        about 25000 source and target tokens per step (over 8 GPUs), warmup 4000,
        100K steps (base) or 300K (big), averaging the last 5 or 20 checkpoints."""
        big = model == "big"
        values = dict(
            data="tfds:wmt14_translate/de-en", model=model, vocab_size=PAPER_VOCAB_SIZE,
            vocab_sentences=PAPER_VOCAB_SENTENCES, steps=300_000 if big else 100_000,
            tokens_per_batch=PAPER_TOKENS_PER_BATCH,
            max_sentence_tokens=PAPER_MAX_SENTENCE_TOKENS, unpunctuated_share=0.0,
            clause_share=0.0,
            warmup_steps=PAPER_WARMUP_STEPS, learning_rate_scale=1.0,
            checkpoint_every=PAPER_CHECKPOINT_EVERY,
            keep_checkpoints=20 if big else 5, average_last=20 if big else 5,
            bleu_every=10_000, bleu_sentences=500, test_sentences=1_000_000,
        )
        values.update(overrides)
        return cls(**values)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        return _from_dict(cls, values)

    def for_model(self, model_config, explicit=()):
        """This config for a new run of `model_config`: a model of the paper's width
        (d_model 512 or more) without a time budget takes the paper's warm-up (4000)
        and checkpoint interval (1000) where `explicit`, the fields given, does not
        name them, the interval only where `bleu_every` stays a multiple of it. The
        defaults, 300 and 250, are the CPU recipes'; a time budget plans both."""
        if model_config.d_model < PAPER_MIN_D_MODEL or self.time_budget:
            return self
        changes = {name: value for name, value in PAPER_WIDTH_SETTINGS.items()
                   if name not in explicit}
        if self.bleu_every % changes.get("checkpoint_every", 1):
            del changes["checkpoint_every"]
        return dataclasses.replace(self, **changes)
