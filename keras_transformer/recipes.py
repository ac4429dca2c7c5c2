"""The CPU recipe for a time budget, chosen from this machine's measured speed.

A short budget on a slow CPU buys few updates, and a recipe tuned on a fast CPU
then learns nothing useful in them (docs/cpu-recipes.md has such runs). Before
the vocabulary is built, `keras-transformer train --time-budget N` takes the speed
of a matrix multiply in the run's precision, measured as the device was
detected (`hardware.matmul_flops_per_second`), estimates the
updates each recipe of `RECIPES` would get (`training_flops`, at the share of
that speed a step reaches on this CPU, `step_efficiency`), and takes the
first recipe that gets the updates it needs (`choose`): the bigger vocabulary
and batches where the machine affords them, smaller ones (cheaper output layer,
more and smaller updates) where it does not. `benchmarks/recipe_curves.py`
measures BLEU against updates and CPU-seconds for each recipe; the table and
the figures behind `RECIPES` are in the CPU recipes guide (docs/).

Imports no TensorFlow.
"""

import dataclasses

# The share of a budget that goes into training steps; the rest is start-up,
# the vocabulary, the first step of each batch shape, dev passes, checkpoints
# and averaging (`keras-transformer train` prints the breakdown at its end).
STEP_SHARE = 0.75
# Training steps run at about this share of the matrix-multiply speed measured by
# `hardware.matmul_flops_per_second` (cpu-small's float32 `mfu` in
# benchmarks/train_throughput.py, against the matrix-multiply peak it measures):
# the model's multiplies are smaller than the probe's, and a step also runs
# softmaxes, layer norms and Adam.
STEP_EFFICIENCY = 0.7
# Where AMX multiplies bfloat16 matrices, the probe's product runs several times
# faster than a step's smaller products, softmaxes, layer norms and Adam, so a
# step reaches a far smaller share of it (the quickstart's planned and run
# updates on an Intel Xeon with AMX, in docs/cpu-recipes.md).
AMX_BFLOAT16_STEP_EFFICIENCY = 0.2
# Mean padded sentence length of a batch, in tokens, for `training_flops`.
MEAN_LENGTH = 32


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The settings a budget picks: the shared vocabulary's size, the source (and
    target) tokens of a batch, P_drop, the schedule's `learning_rate_scale` (its
    peak is `scale * (d_model * warmup_steps)^-0.5` at the configured warm-up,
    300 unless given, and the budget's plan keeps it over its own warm-up), and
    the fewest updates for which it is the better choice (`choose`)."""

    vocab_size: int
    tokens_per_batch: int
    dropout_rate: float
    learning_rate_scale: float
    min_updates: int

    def describe(self):
        return (f"a vocabulary of {self.vocab_size} tokens, batches of "
                f"{self.tokens_per_batch} tokens, dropout {self.dropout_rate:g}, "
                f"learning-rate scale {self.learning_rate_scale:g}")


# Best first: each is taken when the budget affords it `min_updates`. A run of a
# few hundred updates sees the corpus once or twice: dropout only slows it. The
# small recipe's peak learning rate is half the large one's (1.8e-3 against 3.6e-3
# at d_model 256): at 532, 1260 and 2400 updates on the same batches it scored
# 14.07, 23.32 and 28.23 against 11.03, 20.08 and 25.01 (the large recipe at 0.7 of
# its peak: 24.57 against 25.15 at 1000 updates). So scaled, the small recipe stays
# ahead of the large one in the same time: 28.23 at 2400 updates against 25.15 at
# 1000, and 30.10 at 5000 against 27.79 at 1750, the most an 8-minute quickstart
# gave the large recipe (fixed-step runs on a Zen 5 core, docs/cpu-recipes.md).
# Where they cross was not measured; 2500 estimated updates keep the large recipe
# for the budgets beyond those (the estimate runs high on some kinds: 2199 on that
# Zen 5, whose quickstart ran 1738).
RECIPES = (
    Recipe(vocab_size=8000, tokens_per_batch=4096, dropout_rate=0.1, learning_rate_scale=1.0,
           min_updates=2500),
    Recipe(vocab_size=4000, tokens_per_batch=2048, dropout_rate=0.0, learning_rate_scale=0.5,
           min_updates=0),
)


def training_flops(model_config, vocab_size, tokens_per_batch, mean_length=MEAN_LENGTH):
    """Matrix-multiply FLOPs of one training step (forward and backward, 3x the
    forward's) on a batch of `tokens_per_batch` source and as many target tokens
    whose sentences are `mean_length` tokens long."""
    c = model_config
    d, h, dk, dv = c.d_model, c.num_heads, c.d_k, c.d_v
    tokens = tokens_per_batch

    def attention(key_length):
        projections = 2 * d * h * tokens * (2 * dk + 2 * dv)
        scores = 2 * tokens * key_length * h * (dk + dv)  # Q K^T and weights V
        return projections + scores

    feed_forward = 2 * 2 * d * c.d_ff * tokens
    encoder = attention(mean_length) + feed_forward
    decoder = 2 * attention(mean_length) + feed_forward
    logits = 2 * tokens * d * vocab_size
    return 3 * (c.num_layers * (encoder + decoder) + logits)


def step_efficiency(compute_dtype, cpu_flags):
    """The share of `hardware.matmul_flops_per_second` that a training step reaches in
    `compute_dtype` on a CPU of `cpu_flags` (`hardware.cpu_flags()`)."""
    if compute_dtype == "bfloat16" and cpu_flags.get("amx_bf16"):
        return AMX_BFLOAT16_STEP_EFFICIENCY
    return STEP_EFFICIENCY


def estimated_updates(model_config, recipe, budget_seconds, flops_per_second,
                      efficiency=STEP_EFFICIENCY):
    """The updates `recipe` would get in `budget_seconds` on a CPU that multiplies
    matrices at `flops_per_second`, its steps at `efficiency` of that speed."""
    step_seconds = (training_flops(model_config, recipe.vocab_size, recipe.tokens_per_batch)
                    / (flops_per_second * efficiency))
    return int(budget_seconds * STEP_SHARE / step_seconds)


def choose(model_config, budget_seconds, flops_per_second, recipes=RECIPES,
           efficiency=STEP_EFFICIENCY):
    """`(recipe, estimates)`: the first of `recipes` whose estimated updates reach
    its `min_updates` (the last one otherwise), and `[(recipe, updates)]` for the
    recipes tried, the chosen one last. `efficiency`: see `estimated_updates`."""
    estimates = []
    for recipe in recipes:
        estimates.append((recipe, estimated_updates(model_config, recipe, budget_seconds,
                                                    flops_per_second, efficiency)))
        if estimates[-1][1] >= recipe.min_updates:
            break
    return estimates[-1][0], estimates
