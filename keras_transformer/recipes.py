"""The CPU recipe for a time budget, chosen from this machine's measured steps.

A short budget on a slow CPU buys few updates, and a recipe tuned on a fast CPU
then learns nothing useful in them (docs/cpu-recipes.md has such runs). Before
the vocabulary is built, `keras-transformer train --time-budget N` times a
training step of the recipes of `RECIPES` on random ids
(`training.time_training_step`), best first, estimates the updates each would
get in the budget (`estimated_updates`), and takes the first recipe that gets
the updates it needs (`choose`): the bigger vocabulary and batches where the machine affords
them, smaller ones (cheaper output layer, more and smaller updates) where it does
not. `benchmarks/recipe_curves.py` measures BLEU against updates and CPU-seconds
for each recipe; the table and the figures behind `RECIPES` are in the CPU
recipes guide (docs/).

Imports no TensorFlow.
"""

import dataclasses

from keras_transformer.config import TrainingConfig
from keras_transformer.config import TransformerConfig

# The share of a budget that goes into training steps; the rest is start-up,
# the vocabulary, timing the recipes' steps, the first step of each batch shape,
# dev passes, checkpoints and averaging (`keras-transformer train` prints the
# breakdown at its end; docs/cpu-recipes.md quotes one).
STEP_SHARE = 0.9


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
# few hundred updates sees the corpus once or twice, where dropout only slows it,
# and the small recipe's smaller, more numerous updates learn best at half the
# large one's peak learning rate. The runs behind these settings and the
# threshold, and what is not measured yet (where the two recipes cross), are in
# docs/cpu-recipes.md.
# The large recipe is the one a run without a budget trains: the defaults of
# `TrainingConfig` (vocabulary 8000, batches 4096, scale 1) and of the model's
# P_drop (0.1).
RECIPES = (
    Recipe(vocab_size=TrainingConfig.vocab_size, tokens_per_batch=TrainingConfig.tokens_per_batch,
           dropout_rate=TransformerConfig.dropout_rate,
           learning_rate_scale=TrainingConfig.learning_rate_scale, min_updates=2500),
    Recipe(vocab_size=4000, tokens_per_batch=2048, dropout_rate=0.0, learning_rate_scale=0.5,
           min_updates=0),
)


def estimated_updates(budget_seconds, step_seconds):
    """The updates a budget of `budget_seconds` gets at `step_seconds` a step."""
    return int(budget_seconds * STEP_SHARE / step_seconds)


def choose(budget_seconds, step_seconds, recipes=RECIPES):
    """`(recipe, estimates)`: the first of `recipes` whose estimated updates reach
    its `min_updates` (the last one otherwise), and `[(recipe, updates, seconds)]`
    for the recipes tried, the chosen one last. `step_seconds(recipe)`: the
    seconds of a step of `recipe`, asked only of the recipes tried."""
    estimates = []
    for recipe in recipes:
        seconds = step_seconds(recipe)
        estimates.append((recipe, estimated_updates(budget_seconds, seconds), seconds))
        if estimates[-1][1] >= recipe.min_updates:
            break
    return estimates[-1][0], estimates
