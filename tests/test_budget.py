"""The budget's recipe choice from timed steps, its plan and where a run's time goes."""

import dataclasses
import json
import os
import re

import pytest

from keras_transformer import budget
from keras_transformer import recipes
from keras_transformer.config import TIME_BUDGET_CLOCKS
from keras_transformer.config import TransformerConfig



def test_the_budget_takes_the_first_recipe_that_gets_the_updates_it_needs():
    big, small = recipes.RECIPES
    # The step at which the big recipe gets exactly the updates it needs in 7 minutes.
    just_enough = 420 * recipes.STEP_SHARE / big.min_updates / 1.001
    # The small recipe's step is not timed where the big one gets its updates.
    chosen, estimates = recipes.choose(420, {big: just_enough}.__getitem__)
    assert chosen == big and estimates == [(big, int(big.min_updates * 1.001), just_enough)]
    step_seconds = {big: just_enough * 1.01, small: just_enough / 3}
    chosen, estimates = recipes.choose(420, step_seconds.__getitem__)
    assert chosen == small
    assert estimates == [(big, int(big.min_updates * 1.001 / 1.01), step_seconds[big]),  # down
                         (small, int(3 * big.min_updates * 1.001), step_seconds[small])]


def test_each_clock_a_config_takes_is_one_the_budget_reads():
    """`TrainingConfig` checks --time-budget-clock against its names, and the run's
    `TrainingClock` reads the clock of that name: the two lists are one."""
    assert sorted(budget.CLOCKS) == sorted(TIME_BUDGET_CLOCKS)
    assert budget.CLOCKS["wall"] is budget.time.monotonic
    assert budget.CLOCKS["cpu"] is budget.time.process_time


def test_a_timed_step_is_the_median_of_the_steps_after_the_first(monkeypatch):
    """`time_training_step` leaves out the first (tracing) step and takes the
    median of the rest, each on random non-padding ids in sentences of
    TIMED_SENTENCE_TOKENS, as many rows as the batch's tokens fill."""
    import keras

    from keras_transformer import training
    from keras_transformer.token_ids import EOS_ID

    durations = iter([9.0, 0.6, 0.1, 0.2])  # median of the last 3: 0.2, mean 0.3
    now = [0.0]
    calls = []

    def train_on_batch(model, inputs, targets):
        calls.append((model.config, {name: ids.shape for name, ids in inputs.items()}, targets))
        now[0] += next(durations)

    monkeypatch.setattr(keras.Model, "train_on_batch", train_on_batch)
    config = TransformerConfig.preset("tiny", vocab_size=300)
    assert training.time_training_step(config, 2048, clock=lambda: now[0]) == pytest.approx(0.2)
    assert len(calls) == 1 + training.TIMED_STEPS
    rows = 2048 // training.TIMED_SENTENCE_TOKENS
    for model_config, shapes, targets in calls:
        assert model_config == config
        assert shapes == {"encoder_inputs": (rows, 32), "decoder_inputs": (rows, 32)}
        assert targets.min() > EOS_ID and targets.max() < 300


def test_timing_a_step_leaves_the_names_and_the_precision_as_they_were():
    """After a timed step, a model is built as in a process that timed none:
    the same layer names (the session cleared), in the same dtype policy."""
    import keras

    import keras_transformer as kt
    from keras_transformer import training

    def names(model):  # those Keras numbers itself included (its dropouts')
        return ([layer.name for layer in model._flatten_layers()]
                + [variable.path for variable in model.variables])

    config = TransformerConfig.preset("tiny", vocab_size=300)
    keras.backend.clear_session()  # a process that timed no step
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        built = names(kt.build_transformer(config))
        keras.backend.clear_session()  # and one that times one
        keras.config.set_dtype_policy("mixed_bfloat16")
        seconds = training.time_training_step(config, 256)
        assert 0 < seconds < 60
        assert keras.config.dtype_policy().name == "mixed_bfloat16"
        assert names(kt.build_transformer(config)) == built
    finally:
        keras.config.set_dtype_policy("float32")
        keras.backend.clear_session()


def test_train_chooses_the_recipe_from_the_steps_it_times(monkeypatch, capsys):
    """`keras-transformer train` times a step of the recipes (their vocabulary,
    dropout and batch) best first, takes the first whose updates in the budget
    reach its `min_updates`, and says the updates and the step times it went by."""
    from keras_transformer import training
    from keras_transformer.cli import train
    from keras_transformer.config import TrainingConfig

    model_config = TransformerConfig.preset("cpu-small", vocab_size=8000)
    big, small = recipes.RECIPES
    budget_seconds = 480
    just_enough = budget_seconds * recipes.STEP_SHARE / big.min_updates
    timed = []

    def time_training_step(config, tokens_per_batch, jit_compile=False, clock=None):
        assert clock is budget.CLOCKS["wall"]  # the budget's clock
        timed.append((config.vocab_size, config.dropout_rate, tokens_per_batch))
        return seconds[config.vocab_size]

    monkeypatch.setattr(training, "time_training_step", time_training_step)
    for big_seconds, expected in ((just_enough * 0.99, big), (just_enough * 1.01, small)):
        seconds = {big.vocab_size: big_seconds, small.vocab_size: 0.07}
        timed.clear()
        config = TrainingConfig(time_budget=8, precision="mixed_bfloat16")
        config, chosen_model, line = train.choose_recipe(config, model_config)
        tried = recipes.RECIPES[:recipes.RECIPES.index(expected) + 1]  # big first
        assert timed == [(recipe.vocab_size, recipe.dropout_rate, recipe.tokens_per_batch)
                         for recipe in tried]
        assert (config.vocab_size, config.tokens_per_batch) == (expected.vocab_size,
                                                               expected.tokens_per_batch)
        assert config.learning_rate_scale == expected.learning_rate_scale
        assert chosen_model.dropout_rate == expected.dropout_rate
        updates = recipes.estimated_updates(budget_seconds, seconds[expected.vocab_size])
        assert (f"Recipe for 8 minutes on this CPU: {expected.describe()}, about {updates} "
                f"updates ({seconds[expected.vocab_size]:.3f} s a step)") in line, line
        if expected == small:
            assert (f"{big.describe()} would get about "
                    f"{recipes.estimated_updates(budget_seconds, big_seconds)} "
                    f"({big_seconds:.3f} s a step), fewer than the {big.min_updates} it needs."
                    ) in line, line
    # A budget on the CPU clock times CPU-seconds, and says so.
    monkeypatch.setattr(training, "time_training_step",
                        lambda config, tokens, jit_compile=False, clock=None: (
                            0.2 if clock is budget.CLOCKS["cpu"] else 0.1))
    config = TrainingConfig(time_budget=8, time_budget_clock="cpu")
    _, _, line = train.choose_recipe(config, model_config)
    updates = recipes.estimated_updates(budget_seconds, 0.2)
    assert line.startswith(
        f"Recipe for 8 minutes of CPU time on this CPU: {small.describe()}, about {updates} "
        f"updates (0.200 CPU-seconds a step); {big.describe()} would get about {updates} "
        "(0.200 CPU-seconds a step)"), line
    # A budget of one minute is said as one.
    _, _, line = train.choose_recipe(TrainingConfig(time_budget=1), model_config)
    assert line.startswith("Recipe for 1 minute on this CPU: "), line
    # A given --learning-rate-scale and dropout are kept, and the steps timed with that dropout.
    monkeypatch.setattr(training, "time_training_step", time_training_step)
    timed.clear()
    given = dataclasses.replace(TrainingConfig(time_budget=8, precision="mixed_bfloat16"),
                                learning_rate_scale=0.3)
    given_model = dataclasses.replace(model_config, dropout_rate=0.3)
    kept, kept_model, _ = train.choose_recipe(given, given_model,
                                              keep_dropout=True, keep_learning_rate=True)
    assert kept.learning_rate_scale == 0.3 and kept_model.dropout_rate == 0.3
    assert [dropout for _, dropout, _ in timed] == [0.3, 0.3]


def test_the_time_account_sets_the_dev_passes_apart(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(budget.time, "monotonic", lambda: now[0])
    account = budget.TimeAccount(start=90.0, fit_phase="steps")
    account.mark("start-up")                      # 10 s
    now[0] = 130.0
    account.on_test_begin()
    now[0] = 135.0
    account.on_test_end()                          # a 5-second dev pass
    now[0] = 160.0
    account.mark("steps")                          # 60 s, 5 of them the dev pass
    now[0] = 190.0
    account.mark("averaging")  # longer than the dev pass: the part stays with its phase
    account.set_apart("checkpoints", 4.0, "steps")
    assert account.summary() == {"start-up": 10.0, "steps": 51.0, "averaging": 30.0,
                                 "dev passes": 5.0, "checkpoints": 4.0}
    assert account.line() == ("Where the 1.7 minutes went: start-up 10 s, steps 51 s, "
                              "averaging 30 s, dev passes 5 s, checkpoints 4 s.")
    # A run whose budget ends before its first dev pass says so.
    assert "steps 0 s, dev passes 0 s." in budget.TimeAccount(start=now[0]).line()


def test_a_budgeted_runs_progress_line_counts_the_step_the_budget_stops_it_at():
    """A budgeted run's lines count the step that the clock will stop it at (the
    epochs `over_budget` still lets it run, each at the mean pace so far
    and of as many steps as the last), not
    the plan's count (the first steps' median, less a reserve): on a Zen 5 the
    quickstart planned 1512 steps, said "step 1444/1512", then "step 1520" and made
    1672. Without a budget the line shows the planned steps; `--steps` caps the
    count."""
    import io

    import keras

    class Model:
        optimizer = type("Optimizer", (), {"iterations": keras.Variable(20)})()
        stop_training = False

    def run(budget_seconds, epochs, max_steps=None):
        """`epochs`: (steps, seconds) of each; returns the lines' step counts and
        the step the clock stopped the run at."""
        now = [13.0]  # the first 20 steps timed and the plan made
        clock = budget.TrainingClock(budget_seconds, start=0.0, wall_start=0.0)
        clock.read = lambda: now[0]
        stream = io.StringIO()
        progress = budget.ProgressLine(1512, clock, stream, max_steps=max_steps)
        model = Model()
        model.optimizer.iterations.assign(20)
        for callback in (clock, progress):
            callback.set_model(model)
        progress.on_train_begin()
        for steps, seconds in epochs:
            clock.on_epoch_begin(0)
            model.optimizer.iterations.assign_add(steps)
            now[0] += seconds
            clock.on_epoch_end(0)
            progress.on_epoch_end(0, {})
            if model.stop_training:
                break
        counts = [line.split("  ")[0] for line in stream.getvalue().splitlines()]
        return counts, int(model.optimizer.iterations.numpy())

    # Epochs of 76 steps in 20 s from 0:13 of 8:00: the clock stops the run at the
    # epoch end nearest the budget, 0:13 + 23 x 20 s = 7:53, step 20 + 23 x 76.
    counts, stopped = run(480.0, [(76, 20.0)] * 40)
    assert stopped == 20 + 23 * 76 == 1768
    assert counts == [f"step {20 + 76 * n}/~1768" for n in range(1, 24)]
    # Every fourth epoch 20 s longer (a dev pass): the count follows the mean epoch
    # (25 s after the first longer one, at 1:53: 15 more to 8:08 -> 324 + 15 x 76;
    # 24 s after the next: 14 more to 8:08) and stays put through the longer ones;
    # the clock stops the run where its last line says.
    counts, stopped = run(480.0, [(76, 20.0), (76, 20.0), (76, 20.0), (76, 40.0)] * 10)
    assert counts[3:5] == ["step 324/~1464", "step 400/~1464"], counts
    assert counts[-1] == f"step {stopped}/~{stopped}", (counts, stopped)
    # --steps as well: the run stops at whichever comes first.
    counts, _ = run(480.0, [(76, 20.0)] * 3, max_steps=1000)
    assert counts == ["step 96/~1000", "step 172/~1000", "step 248/~1000"]
    counts, _ = run(None, [(76, 20.0)] * 3)
    assert counts == ["step 96/1512", "step 172/1512", "step 248/1512"]


def test_a_resumed_budget_counts_the_whole_run(monkeypatch):
    """A run killed after a checkpoint and resumed stops at the step where it
    would have stopped unkilled, its budget counting the time before the kill
    (the checkpoint's `record()`); resumed once more after that, it has
    nothing left to train. The CPU clock's time is kept as well, for a run
    resumed on the other clock. log.csv's rows count the whole run too."""
    import keras

    now, cpu = [0.0], [0.0]  # a new process starts its monotonic clock anywhere
    monkeypatch.setattr(budget.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(budget.time, "process_time", lambda: cpu[0])

    class Model:
        optimizer = type("Optimizer", (), {"iterations": keras.Variable(0)})()
        stop_training = False

    def process(budget_seconds, spent=None, kill_after=None, start_at=0.0, start_up=13.0):
        """A train process: `start_up` seconds, then epochs of 20 s (40 s of CPU
        on 2 cores) until the clock stops it or it is killed after the
        checkpoint of epoch `kill_after`. Returns the epochs run, the
        record of its last checkpoint and its log.csv rows."""
        now[0], cpu[0] = start_at, 0.0
        clock = budget.TrainingClock(budget_seconds, start=start_at, wall_start=start_at,
                                     spent=spent)
        clock.read = lambda: now[0]
        model = Model()
        model.stop_training = False
        clock.set_model(model)
        now[0] += start_up
        cpu[0] += 20.0
        if spent and clock.over_budget():  # cli.train.resumed_budget: nothing to train
            return 0, spent, []
        epochs, rows = 0, []
        while True:
            clock.on_epoch_begin(epochs)
            now[0] += 20.0
            cpu[0] += 40.0
            epochs += 1
            record = clock.record()  # StepCheckpoint, before the clock's epoch end
            rows.append({})
            clock.on_epoch_end(epochs, rows[-1])
            if model.stop_training or epochs == kill_after:
                break
        return epochs, record, rows

    unkilled, _, _ = process(480.0)
    assert unkilled == 23  # 0:13 + 23 x 20 s = 7:53, the epoch end nearest 8:00
    before, record, rows_before = process(480.0, kill_after=10)
    assert record == {"clock": "wall", "wall_seconds": 213.0, "cpu_seconds": 420.0,
                      "interval_seconds": 20.0}
    assert (rows_before[-1]["elapsed_seconds"], rows_before[-1]["cpu_seconds"]) == (213.0, 420.0)
    # Resumed processes start up in 3 s: less than half an interval, so a clock
    # that forgot the last interval's length would train one more past 7:53.
    after, record, rows_after = process(480.0, spent=record, start_at=5000.0, start_up=3.0)
    assert before + after == unkilled
    assert record["wall_seconds"] == 213.0 + 3.0 + 20.0 * after
    # log.csv goes on from the checkpoint's time, its start-up counted, as the budget does.
    assert [row["elapsed_seconds"] for row in rows_after] == [
        213.0 + 3.0 + 20.0 * epoch for epoch in range(1, after + 1)]
    assert [row["cpu_seconds"] for row in rows_after] == [
        420.0 + 20.0 + 40.0 * epoch for epoch in range(1, after + 1)]
    again, _, _ = process(480.0, spent=record, start_at=9000.0, start_up=3.0)
    assert again == 0  # nothing left
    longer, _, _ = process(600.0, spent=record, start_at=9000.0, start_up=3.0)
    assert longer == 6  # 7:56 + 0:03 + 6 x 20 s = 9:59, and half an interval passes 10:00
    on_cpu = budget.TrainingClock(1000.0, clock="cpu", start=0.0, spent=record)
    on_cpu.read = lambda: cpu[0]
    cpu[0] = 7.0
    assert on_cpu.elapsed() == 7.0 + record["cpu_seconds"]


@pytest.mark.parametrize("budget_seconds", [None, 600.0])
def test_the_first_step_is_told_once_counted_from_the_command(monkeypatch, budget_seconds):
    import io

    now = [1000.0]
    monkeypatch.setattr(budget.time, "monotonic", lambda: now[0])
    clock = budget.TrainingClock(budget_seconds, start=0.0, wall_start=905.0)
    stream = io.StringIO()
    progress = budget.ProgressLine(100, clock, stream)
    progress.on_train_batch_end(0)
    now[0] = 1001.0
    progress.on_train_batch_end(1)
    told = ("First step done 95 s after the command started "
            "(building the model's graph and compiling it included).\n")
    # A budgeted run timed its first steps before fit: its first step in fit is not the first.
    assert stream.getvalue() == ("" if budget_seconds else told)


def test_each_pause_of_an_xla_compilation_is_told(monkeypatch):
    """A GPU run compiles the step once per batch shape as each first comes:
    seconds-long pauses between steps of milliseconds, each told, and the first
    dev pass's; a steady step, or a run without XLA, says nothing."""
    import io

    now = [1000.0]
    monkeypatch.setattr(budget.time, "monotonic", lambda: now[0])
    clock = budget.TrainingClock(None, start=0.0, wall_start=934.0)

    def run(compiled_shapes, step_seconds, dev_seconds):
        now[0] = 1000.0
        stream = io.StringIO()
        progress = budget.ProgressLine(1000, clock, stream, compiled_shapes=compiled_shapes)
        for batch, seconds in enumerate(step_seconds):
            progress.on_train_batch_begin(batch)
            now[0] += seconds
            progress.on_train_batch_end(batch)
        for seconds in dev_seconds:
            progress.on_test_begin()
            now[0] += seconds
            progress.on_test_end()
        return stream.getvalue().splitlines()

    steps = [66.0, 0.04, 0.04, 31.0, 0.04, 0.3, 29.5, 0.04]
    lines = run(7, steps, [48.0, 0.5])
    assert lines == [
        "First step done 132 s after the command started (building the model's graph and "
        "compiling it included). XLA compiles the step once more for each of the other 6 "
        "batch shapes when it first comes, and the dev step at the first dev pass: each a "
        "pause, once a run.",
        "Step 4 took 31 s: XLA compiled the step for another batch shape (2 of 7).",
        "Step 7 took 30 s: XLA compiled the step for another batch shape (3 of 7).",
        "The first dev pass took 48 s, its XLA compilations included (once a run)."], lines
    assert run(0, steps, [48.0]) == [lines[0].split(" XLA")[0]]
    # CPU steps of seconds: a longer one is no compilation.
    assert run(7, [20.0, 3.0, 6.0, 4.0], [])[1:] == []


def test_training_batches_have_no_autotuning_thread(tokenizer):
    from keras_transformer import data

    pairs = data.load_parallel("bundled", "dev").take(200)
    batches = data.TrainingBatches(pairs, tokenizer, tokens_per_batch=256,
                                   max_sentence_tokens=256, seed=0)
    # Deleting an iterator waits for its autotuning thread: idle minutes a run.
    assert batches.dataset(0).options().autotune.enabled is False


def test_bad_data_is_named_before_any_step_is_timed(tmp_path, monkeypatch, capsys):
    """A --data file that is not parallel text is refused before the recipes'
    timed steps (seconds of model building), not after them; no run is made."""
    from keras_transformer import training
    from keras_transformer.cli import train

    def time_training_step(*args, **kwargs):
        raise AssertionError("a recipe's step was timed before the data was read")

    monkeypatch.setattr(training, "time_training_step", time_training_step)
    corpus = tmp_path / "train.en"
    corpus.write_text("In the beginning.\n" * 50)
    run = tmp_path / "run"
    assert train.main(["--data", str(corpus), "--time-budget", "1", "--out", str(run),
                       "--precision", "float32"]) == 2
    assert (f"{corpus} line 1: 1 tab-separated columns; a parallel tab-separated file has "
            "exactly 2") in capsys.readouterr().err
    assert not run.exists()


@pytest.mark.slow
def test_a_slow_cpu_gets_the_small_recipe_and_the_breakdown(tmp_path, monkeypatch, capsys):
    from keras_transformer.cli import train

    from keras_transformer import training

    # A slow CPU's steps: the big recipe gets a few hundred updates in 24 seconds.
    seconds = {8000: 0.05, 4000: 0.02}
    monkeypatch.setattr(training, "time_training_step",
                        lambda config, tokens, jit_compile=False, clock=None:
                        seconds[config.vocab_size])
    run = str(tmp_path / "run")
    assert train.main(["--out", run, "--model", "tiny", "--time-budget", "0.4",
                       "--vocab-sentences", "4000",
                       "--max-sentence-tokens", "24", "--average-last", "2",
                       "--keep-checkpoints", "2", "--test-sentences", "0", "--alpha-sentences", "0",
                       "--precision", "float32"]) == 0
    out = capsys.readouterr().out
    big, small = recipes.RECIPES
    model = TransformerConfig.preset("tiny", vocab_size=8000)
    updates = [recipes.estimated_updates(24, seconds[recipe.vocab_size]) for recipe in (big, small)]
    assert (f"Recipe for 0.4 minutes on this CPU: "
            f"a vocabulary of 4000 tokens, batches of 2048 tokens, dropout 0, learning-rate "
            f"scale 0.5, about {updates[1]} updates (0.020 s a step); a vocabulary of 8000 "
            f"tokens, batches of 4096 tokens, dropout 0.1, learning-rate scale 1 would get "
            f"about {updates[0]} (0.050 s a step), fewer than the {big.min_updates} it needs."
            ) in out
    with open(os.path.join(run, "config.json")) as f:
        config = json.load(f)
    assert config["training"]["tokens_per_batch"] == 2048
    assert config["training"]["vocab_size"] == 4000
    assert config["model"]["dropout_rate"] == 0.0
    # The small recipe's peak (its scale at the default warm-up of 300), over the
    # planned warm-up.
    peak = small.learning_rate_scale * (model.d_model * 300) ** -0.5
    planned = re.search(r"warm-up (\d+) to learning rate ([\d.e+-]+)\.", out)
    assert planned, out
    assert float(planned.group(2)) == pytest.approx(peak, rel=1e-2)
    warmup = int(planned.group(1))
    assert config["training"]["warmup_steps"] == warmup
    assert config["training"]["learning_rate_scale"] == pytest.approx(
        small.learning_rate_scale * (warmup / 300) ** 0.5, rel=1e-6)
    line = next(line for line in out.splitlines() if line.startswith("Where the "))
    for phase in ("start-up", "timing the recipes", "vocabulary and batches", "timing steps",
                  "steps", "checkpoints", "dev passes", "averaging and saving"):
        assert f"{phase} " in line, line
