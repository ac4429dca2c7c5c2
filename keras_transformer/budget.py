"""Training for a time budget: a clock that stops the run once the budget is
spent, a plan (steps, warm-up, checkpoint interval) made from the times of the
first steps, so that a short run is not stuck in warm-up (docs/cpu-recipes.md),
and the progress line that shows the time against the budget.
"""

import dataclasses
import math
import sys
import time

import keras
import numpy as np

CLOCKS = {"wall": time.monotonic, "cpu": time.process_time}
# A budgeted run averages its checkpoints over this last fraction of its steps, and
# warms up over this first fraction (docs/cpu-recipes.md: measured on two corpora).
PLANNED_AVERAGE_SPAN = 0.25
PLANNED_WARMUP_FRACTION = 0.4
PLANNED_OVERHEAD = 0.1
# Steps timed before a budgeted run is planned (the first ones compile); a run of
# at most twice as many steps is not planned.
CALIBRATION_STEPS = 20


class TrainingClock(keras.callbacks.Callback):
    """Times a run on one clock and, with a budget, stops it at the epoch end
    nearest the budget (`over_budget`); adds `step`, `cpu_seconds` and
    `elapsed_seconds` (the run's, as `record()` gives them: a resumed run's go on
    from `spent`) and, where the model counts `target_tokens`,
    `target_tokens_per_second` (over the wall-clock time of the epoch's steps, its
    dev pass left out), `median_step_seconds`, `mean_step_seconds` and
    `slowest_step_seconds` (wall clock) and, after a dev pass, `dev_pass_seconds` to the
    epoch logs, and times each step for `plan`.

    A resumed run's budget counts the whole run: the clock starts from what
    the run had spent by the checkpoint it resumes from (`spent`, that
    checkpoint's `record()`), so a run stopped and resumed ends where it would
    have ended unstopped, and a run that ended by its budget trains no further.

    Args:
        budget_seconds: stop once the clock has run this long since `start`,
            counting `spent` (None: never).
        clock: "wall" (elapsed time) or "cpu" (the process's CPU time, all its
            threads).
        start: the clock's reading that the budget counts from (`time.monotonic()`
            or `time.process_time()` at the program's start: graph building, XLA
            compilation and the vocabulary count too).
        wall_start: `time.monotonic()` at the program's start.
        spent: None, or the `record()` written with the checkpoint the run
            resumes from: the seconds the run had spent on each clock, and its
            last checkpoint interval's.
    """

    def __init__(self, budget_seconds=None, clock="wall", start=None, wall_start=None,
                 spent=None):
        super().__init__()
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {sorted(CLOCKS)}. Received: clock={clock!r}")
        self.clock = clock
        self.read = CLOCKS[clock]
        self.budget_seconds = budget_seconds
        self.start = self.read() if start is None else start
        self.wall_start = time.monotonic() if wall_start is None else wall_start
        spent = spent or {}
        self.spent_before = {name: float(spent.get(f"{name}_seconds", 0.0)) for name in CLOCKS}
        self.step_seconds = []
        self._step_start = None
        self._epoch_start = None
        # The last epoch's, dev pass included (a resumed run's: its last interval's).
        self._epoch_seconds = float(spent.get("interval_seconds", 0.0)) if spent.get(
            "clock") == clock else 0.0
        self._steps_wall = None  # the wall-clock span of this epoch's steps: [start, end]
        self._epoch_steps_wall = []  # this epoch's steps' wall-clock seconds
        self._step_start_wall = None
        self._dev_start = None
        self._dev_seconds = None  # this epoch's dev pass (None: none)

    def elapsed(self):
        """Seconds on the clock since `start`, with those spent before a resume."""
        return self.read() - self.start + self.spent_before[self.clock]

    def record(self):
        """What a checkpoint written now keeps for a resume (`spent`), and what
        log.csv's rows say: the seconds the run has spent on each clock, those
        before a resume included (this process's: wall clock since `wall_start`;
        CPU time since `start` on the CPU clock, else since the process's start),
        and on this one the epoch so far."""
        cpu = self.elapsed() if self.clock == "cpu" else time.process_time() + self.spent_before[
            "cpu"]
        wall = time.monotonic() - self.wall_start + self.spent_before["wall"]
        interval = 0.0 if self._epoch_start is None else self.read() - self._epoch_start
        return {"clock": self.clock, "wall_seconds": round(wall, 3),
                "cpu_seconds": round(cpu, 3), "interval_seconds": round(interval, 3)}

    def over_budget(self):
        """Whether the run stops at this epoch end: the budget is spent, or the
        next epoch, as long as the last, would end further past it than this
        one ends before it. A run thus ends at most half an epoch (a checkpoint
        interval) before or after its budget, not up to a whole one after."""
        if self.budget_seconds is None:
            return False
        return self.elapsed() + self._epoch_seconds / 2 >= self.budget_seconds

    def epochs_left(self, epoch_seconds):
        """The epochs still to come before `over_budget` stops the run, each
        `epoch_seconds` long; 0 once it stops the run (None: no budget)."""
        if self.budget_seconds is None or not epoch_seconds:
            return None
        if self.over_budget():
            return 0
        left = (self.budget_seconds - self.elapsed()) / epoch_seconds - 0.5
        return max(1, math.ceil(left))

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self.read()
        self._steps_wall = [time.monotonic(), None]
        self._epoch_steps_wall = []
        self._dev_seconds = None

    def on_test_begin(self, logs=None):
        now = time.monotonic()
        if self._steps_wall is not None and self._steps_wall[1] is None:
            self._steps_wall[1] = now  # the epoch's steps end, its dev pass begins
        self._dev_start = now

    def on_test_end(self, logs=None):
        if self._dev_start is not None:
            self._dev_seconds = (self._dev_seconds or 0.0) + time.monotonic() - self._dev_start

    def on_train_batch_begin(self, batch, logs=None):
        self._step_start = self.read()
        self._step_start_wall = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        self.step_seconds.append(self.read() - self._step_start)
        self._epoch_steps_wall.append(time.monotonic() - self._step_start_wall)

    def on_epoch_end(self, epoch, logs=None):
        if self._epoch_start is not None:
            self._epoch_seconds = self.read() - self._epoch_start
        if logs is not None:
            logs["step"] = int(self.model.optimizer.iterations.numpy())
            if "target_tokens" in logs and self._steps_wall is not None:
                start, end = self._steps_wall
                seconds = (end or time.monotonic()) - start
                logs["target_tokens_per_second"] = round(float(logs["target_tokens"]) / seconds, 1)
            # Where an interval's wall clock goes: its steps (each from its call to its
            # logs: the whole step where a callback reads every step's logs, as
            # train's do), its dev pass (and StepCheckpoint's checkpoint_seconds).
            if self._epoch_steps_wall:
                walls = self._epoch_steps_wall
                logs["median_step_seconds"] = round(float(np.median(walls)), 5)
                logs["mean_step_seconds"] = round(float(np.mean(walls)), 5)
                logs["slowest_step_seconds"] = round(float(np.max(walls)), 5)
            if self._dev_seconds is not None:
                logs["dev_pass_seconds"] = round(self._dev_seconds, 3)
            # The run's time, as its checkpoints record it: a resumed run's rows go on
            # from the time its checkpoint recorded instead of starting again at 0.
            spent = self.record()
            logs["cpu_seconds"] = round(spent["cpu_seconds"], 2)
            logs["elapsed_seconds"] = round(spent["wall_seconds"], 2)
        if self.over_budget():
            self.model.stop_training = True


@dataclasses.dataclass(frozen=True)
class BudgetPlan:
    """What a time budget allows: `steps` expected in all, the checkpoint interval
    (`average_last` checkpoints span the last `PLANNED_AVERAGE_SPAN` of the
    steps), and a schedule that warms up over the first `PLANNED_WARMUP_FRACTION`
    to the same peak learning rate as the configured one (`TransformerSchedule`
    peaks at `scale * (d_model * warmup_steps)^-0.5`, so the scale moves with the
    square root of the warm-up)."""

    steps: int
    checkpoint_every: int
    warmup_steps: int
    learning_rate_scale: float


def plan_for_budget(step, step_seconds, seconds_left, average_last, warmup_steps,
                    learning_rate_scale, max_steps=None):
    """Plans a budgeted run from the times of its first steps.

    Args:
        step: the steps done so far.
        step_seconds: the measured times of those steps. Their median is the
            steady step: the first ones build the graph and compile each new
            batch shape; the plan leaves `PLANNED_OVERHEAD` of the time left for
            the compilations, checkpoints and dev passes still to come.
        seconds_left: the budget left.
        average_last: the checkpoints averaged at the end.
        warmup_steps, learning_rate_scale: the configured schedule, whose peak
            learning rate the plan keeps.
        max_steps: optional cap on the steps in all.

    Returns:
        A `BudgetPlan`.
    """
    if not step_seconds:
        raise ValueError("plan_for_budget needs the times of at least one step")
    per_step = max(float(np.median(step_seconds)), 1e-6)
    steps = step + max(1, int(seconds_left * (1 - PLANNED_OVERHEAD) / per_step))
    if max_steps is not None:
        steps = min(steps, max_steps)
    checkpoint_every = max(1, math.ceil(steps * PLANNED_AVERAGE_SPAN / average_last))
    planned_warmup = max(1, round(steps * PLANNED_WARMUP_FRACTION))
    scale = learning_rate_scale * math.sqrt(planned_warmup / warmup_steps)
    return BudgetPlan(steps, checkpoint_every, planned_warmup, scale)


def worth_planning(max_steps):
    """Whether a budgeted run of at most `max_steps` steps (None: the budget
    decides) is long enough to time its first steps and plan the rest."""
    return max_steps is None or max_steps > 2 * CALIBRATION_STEPS


def planned_settings(plan, explicit):
    """The `TrainingConfig` settings that `plan` (a `BudgetPlan`) replaces: the
    steps; the checkpoint interval unless `explicit` (the names of the settings
    given on the command line) names it; the warm-up and scale, which keep the
    configured peak (a given `learning_rate_scale`'s too), unless it names the
    warm-up, which keeps the schedule as configured."""
    planned = dict(steps=plan.steps)
    if "checkpoint_every" not in explicit:
        planned.update(checkpoint_every=plan.checkpoint_every)
    if "warmup_steps" not in explicit:
        planned.update(warmup_steps=plan.warmup_steps, learning_rate_scale=plan.learning_rate_scale)
    return planned


def plan_run(model, schedule, batches, clock, config, explicit, max_steps=None,
             calibration_steps=CALIBRATION_STEPS):
    """Times the first `calibration_steps` steps of a budgeted run, then plans the
    rest (`plan_for_budget`) and sets the schedule's warm-up and scale.

    Args:
        model: the compiled model, at step 0.
        schedule: its optimizer's `TransformerSchedule`, whose warm-up and scale
            are `keras.Variable`s (`training.compile_for_training`).
        batches: the training batches.
        clock: the run's `TrainingClock`.
        config: the `TrainingConfig`, whose settings the plan replaces as
            `planned_settings` says.
        explicit: the names of the settings given on the command line.
        max_steps: optional cap on the steps in all.
        calibration_steps: the steps timed (the first ones compile).

    Returns:
        `(config, step)`: the planned `TrainingConfig` (its `steps` the plan's)
        and the step reached.
    """
    model.fit(batches, epochs=1, steps_per_epoch=calibration_steps,
              callbacks=[keras.callbacks.TerminateOnNaN(), clock], shuffle=False,
              verbose=0)
    step = int(model.optimizer.iterations.numpy())
    plan = plan_for_budget(
        step, clock.step_seconds, clock.budget_seconds - clock.elapsed(), config.average_last,
        config.warmup_steps, config.learning_rate_scale, max_steps)
    config = dataclasses.replace(config, **planned_settings(plan, explicit))
    schedule.warmup_steps.assign(config.warmup_steps)
    schedule.scale.assign(config.learning_rate_scale)
    return config, step


class TimeAccount(keras.callbacks.Callback):
    """Where a run's wall-clock time went: the phases the command marks in order
    (`mark`), with parts timed inside a phase set apart from it (`set_apart`):
    the dev passes, which this callback times inside `fit_phase`, and the
    checkpoints.

    Args:
        start: `time.monotonic()` at the program's start.
        fit_phase: the phase that `fit`, and so the dev passes, run in.
    """

    def __init__(self, start, fit_phase="steps"):
        super().__init__()
        self.seconds = {}
        # Listed even where none ran (a budget spent before the first dev pass):
        # the line names the same parts every run.
        self.apart = {"dev passes": (fit_phase, 0.0)}
        self.fit_phase = fit_phase
        self._last = start
        self._dev_start = None

    def mark(self, phase):
        """Counts the time since the last mark as `phase`'s."""
        now = time.monotonic()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now

    def set_apart(self, part, seconds, phase):
        """Counts `seconds` of `phase` as `part`'s."""
        self.apart[part] = (phase, self.apart.get(part, (phase, 0.0))[1] + seconds)

    def on_test_begin(self, logs=None):
        self._dev_start = time.monotonic()

    def on_test_end(self, logs=None):
        self.set_apart("dev passes", time.monotonic() - self._dev_start, self.fit_phase)

    def summary(self):
        """`{phase or part: seconds}`: the phases less their parts, then the parts."""
        seconds = dict(self.seconds)
        for phase, value in self.apart.values():
            seconds[phase] = seconds.get(phase, 0.0) - value
        return {**seconds, **{part: value for part, (_, value) in self.apart.items()}}

    def line(self):
        """One line for people: "Where the M minutes went: start-up S s, ..."."""
        seconds = self.summary()
        parts = ", ".join(f"{phase} {value:.0f} s" for phase, value in seconds.items())
        return f"Where the {sum(seconds.values()) / 60:.1f} minutes went: {parts}."


class ProgressLine(keras.callbacks.Callback):
    """One line per epoch (checkpoint interval) for a person: the step, the
    training and dev loss, the learning rate, the target tokens a second and the
    time so far; and, where XLA compiles the step, a line for each pause of a
    compilation, so that a GPU's first minutes are not silent.

    A budgeted run's line shows the step that the budget will stop it at, as its
    pace says ("step 250/~1000"): the epochs the clock still lets it run
    (`TrainingClock.epochs_left`), each of as many steps as the last, at the mean
    pace since the first `fit` began (dev passes and checkpoints included). The
    plan (`plan_run`) counts from the first steps' median, less a reserve.

    Args:
        steps: the steps planned in all (shown as "step 250/1000"; a budgeted run's
            line before it has a pace).
        clock: the run's `TrainingClock`, for the time and the budget.
        stream: where to print (stdout).
        compiled_shapes: how many batch shapes XLA compiles the training step for,
            once each as it first comes (0: no XLA).
        max_steps: a budgeted run's cap on the steps in all (`--steps` with
            `--time-budget`), which the count at its pace does not pass.
    """

    # A step this much slower than the fastest one, and at least these seconds,
    # compiled (on a GPU a step takes tens of milliseconds, a compilation tens of seconds).
    COMPILATION_FACTOR = 10
    COMPILATION_SECONDS = 5.0

    def __init__(self, steps, clock, stream=None, compiled_shapes=0, max_steps=None):
        super().__init__()
        self.steps = steps
        self.max_steps = max_steps
        self.clock = clock
        self.stream = stream or sys.stdout
        self.compiled_shapes = compiled_shapes
        self._first_step_told = False
        self._step_start = None
        self._fastest_step = math.inf
        self._compilations = 1  # the first step's
        self._dev_start = None
        self._dev_passes = 0
        self._fit_start = None  # (step, clock reading) when the first fit began
        self._last_step = None  # at the last epoch end (or the first fit's start)

    def _say(self, text):
        print(text, file=self.stream, flush=True)

    def on_train_begin(self, logs=None):
        if self._fit_start is None:
            self._fit_start = (int(self.model.optimizer.iterations.numpy()),
                               self.clock.elapsed())
            self._last_step = self._fit_start[0]

    def on_train_batch_begin(self, batch, logs=None):
        self._step_start = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        """Says once how long the command took to its first step (building the
        graph and, with XLA, compiling it): minutes on a GPU, where a user would
        otherwise wait with nothing on the screen. A budgeted run timed its first
        steps before `fit`, and says nothing here. Later, a step that paused to
        compile another batch shape says so."""
        now = time.monotonic()
        seconds, self._step_start = (None if self._step_start is None
                                     else now - self._step_start), None
        if not self._first_step_told:
            self._first_step_told = True
            if self.clock.budget_seconds is None:
                self._say(f"First step done {now - self.clock.wall_start:.0f} s after the "
                          "command started (building the model's graph and compiling it "
                          "included)." + self._shapes_to_come())
            return
        if seconds is None:
            return
        if (self.compiled_shapes and seconds >= self.COMPILATION_SECONDS
                and seconds >= self.COMPILATION_FACTOR * self._fastest_step):
            self._compilations += 1
            step = int(self.model.optimizer.iterations.numpy()) if self.model else batch + 1
            self._say(f"Step {step} took {seconds:.0f} s: XLA compiled the step for another "
                      f"batch shape ({min(self._compilations, self.compiled_shapes)} of "
                      f"{self.compiled_shapes}).")
        self._fastest_step = min(self._fastest_step, seconds)

    def _shapes_to_come(self):
        if self.compiled_shapes <= 1:
            return ""
        return (f" XLA compiles the step once more for each of the other "
                f"{self.compiled_shapes - 1} batch shapes when it first comes, and the dev "
                "step at the first dev pass: each a pause, once a run.")

    def on_test_begin(self, logs=None):
        self._dev_start = time.monotonic()

    def on_test_end(self, logs=None):
        self._dev_passes += 1
        if self._dev_passes == 1 and self.compiled_shapes and self._dev_start is not None:
            seconds = time.monotonic() - self._dev_start
            if seconds >= self.COMPILATION_SECONDS:
                self._say(f"The first dev pass took {seconds:.0f} s, its XLA compilations "
                          "included (once a run).")

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        step = int(self.model.optimizer.iterations.numpy())
        parts = [self._steps_text(step)]
        self._last_step = step
        for key, label in (("loss", "loss"), ("val_loss", "dev loss"), ("bleu", "dev BLEU"),
                           ("token_accuracy", "accuracy")):
            if key in logs:
                parts.append(f"{label} {logs[key]:.3f}" if key != "bleu"
                             else f"{label} {logs[key]:.1f}")
        if "learning_rate" in logs:
            parts.append(f"lr {logs['learning_rate']:.2e}")
        if "target_tokens_per_second" in logs:
            parts.append(f"{_count(logs['target_tokens_per_second'])} tokens/s")
        elapsed = minutes(self.clock.elapsed())
        budget = self.clock.budget_seconds
        parts.append(f"{elapsed} of {minutes(budget)}" if budget else elapsed)
        print("  ".join(parts), file=self.stream, flush=True)

    def _steps_text(self, step):
        if self._fit_start is not None and step > self._last_step:
            first_step, started = self._fit_start
            epoch_steps = step - self._last_step
            # An epoch of the last one's steps at the mean pace since fit began.
            seconds = (self.clock.elapsed() - started) / (step - first_step) * epoch_steps
            epochs_left = self.clock.epochs_left(seconds)
            if epochs_left is not None:
                expected = step + epochs_left * epoch_steps
                if self.max_steps is not None:
                    expected = max(step, min(expected, self.max_steps))
                return f"step {step}/~{expected}"
        return f"step {step}/{self.steps}" if step <= self.steps else f"step {step}"


def _count(value):
    """12345 -> "12.3k", 1234567 -> "1.23M", 123 -> "123"."""
    for limit, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.0f}"


def minutes(seconds):
    """`seconds` as m:ss."""
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"
