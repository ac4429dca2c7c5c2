"""Tests for keras_transformer.runs: the run directory's layout, loading and config."""

import dataclasses
import json
import os

import pytest

from keras_transformer import TrainingConfig
from keras_transformer import run_configs
from keras_transformer import runs
from keras_transformer.model import build_transformer
from tests.translation_fixtures import make_run_dir


def test_load_run_reports_missing_pieces(tmp_path, model, tokenizer):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        runs.Run(str(tmp_path / "nowhere")).load()
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        runs.Run(str(tmp_path)).load()
    run = make_run_dir(tmp_path / "run", tokenizer, model)
    os.remove(os.path.join(run, runs.AVERAGED_WEIGHTS))
    with pytest.raises(FileNotFoundError, match=r"try its final model: --weights final "
                                                r"\(weights='final'\)"):
        runs.Run(run).load()
    loaded, _, config = runs.Run(run).load("final")
    assert loaded.config == model.config and config["model"] == model.config.to_dict()


def test_weights_of_another_model_are_refused_not_loaded_where_they_fit(
        tmp_path, model, tokenizer):
    """A run whose config.json describes fewer layers than its weights hold (edited
    by hand, say): Keras would load the layers that fit and translate with the
    rest untrained; the run refuses, saying what differs."""
    run = make_run_dir(tmp_path / "run", tokenizer, model)
    fewer = dataclasses.replace(model.config, num_layers=1)
    runs.Run(run).write_config(fewer, TrainingConfig())
    with pytest.raises(ValueError, match=(
            r"averaged\.weights\.h5 holds another model than .*config\.json \("
            rf"{len(model.weights)} weight tensors where this model has "
            rf"{len(build_transformer(fewer).weights)} \(another num_layers\?\)\)")):
        runs.Run(run).load()


def _stopped_run(path, tokenizer, average_last=2):
    """A run stopped before its end: config.json, vocab/ and checkpoints of steps
    1, 2 and 3 (each a compiled model's, optimizer state included) whose weights
    are random; no averaged weights, no final model. Returns (run, the weights of
    each checkpoint, the compiled model)."""
    import numpy as np

    import keras_transformer as kt
    from keras_transformer import training

    model = kt.build_transformer(kt.TransformerConfig.tiny(tokenizer.vocab_size, d_model=16,
                                                           d_ff=32))
    training.compile_for_training(model, warmup_steps=10)
    model.optimizer.build(model.trainable_variables)
    run = runs.Run(str(path))
    tokenizer.save(run.vocab_dir)
    run.write_config(model.config, TrainingConfig(keep_checkpoints=3, average_last=average_last))
    os.makedirs(run.checkpoints.directory)
    saved = {}
    generator = np.random.default_rng(0)
    for step in (1, 2, 3):
        saved[step] = [generator.standard_normal(w.shape).astype("float32")
                       for w in model.get_weights()]
        model.set_weights(saved[step])
        model.optimizer.iterations.assign(step)
        model.save_weights(run.checkpoints.path(step))
    return run, saved, model


def test_a_stopped_run_says_what_to_do_and_translates_with_its_checkpoints(tmp_path, tokenizer):
    """A run stopped before its end (Ctrl-C, a kill, a budget not reached) has
    checkpoints but neither averaged weights nor a final model: its message says
    so and names --weights checkpoints, which averages its newest `average_last`
    checkpoints, and the average equals what the run writes as it ends."""
    import numpy as np

    from keras_transformer import training

    run, saved, model = _stopped_run(tmp_path / "run", tokenizer)
    for weights in ("averaged", "final"):
        with pytest.raises(FileNotFoundError) as error:
            run.load(weights)
        message = str(error.value)
        assert "has checkpoints up to step 3" in message and "stopped before its end" in message
        assert "--weights checkpoints" in message and "try weights=" not in message

    loaded, _, config = run.load("checkpoints")
    assert config["checkpoint_steps"] == [2, 3]
    for got, second, third in zip(loaded.get_weights(), saved[2], saved[3]):
        np.testing.assert_allclose(got, (second.astype("float64") + third) / 2, rtol=1e-6,
                                   atol=1e-7)
    # As the run ends: the same checkpoints averaged by training into its file.
    training.save_average(model, run.checkpoints.last(2), run.averaged_weights)
    averaged, _, _ = run.load("averaged")
    for got, expected in zip(loaded.get_weights(), averaged.get_weights()):
        np.testing.assert_array_equal(got, expected)


def _cut(path, keep):
    """Writes the first `keep` bytes of the file at `path` over it (a copy or a
    disk that stopped midway); returns the whole file's bytes."""
    with open(path, "rb") as f:
        whole = f.read()
    with open(path, "wb") as f:
        f.write(whole[:keep])
    return whole


def test_weights_cut_short_name_the_file_what_is_wrong_and_what_to_do(tmp_path, tokenizer):
    """A checkpoint cut short stops --weights checkpoints with a sentence that
    names it, says how much of it is there and how to average the ones before
    it (h5py's OSError and its stack before), and doing as it says works; an
    empty file and one of other bytes are named as such; --init-from from a
    run whose averaged weights are cut short names them and the checkpoints."""
    import numpy as np

    import keras_transformer as kt

    run, saved, _ = _stopped_run(tmp_path / "run", tokenizer)
    newest = run.checkpoints.path(3)
    size = len(_cut(newest, 1000))
    with pytest.raises(runs.UnreadableWeights) as error:
        run.load("checkpoints")
    message = str(error.value)
    assert message.startswith(f"{newest} cannot be read: it is cut short (1000 of its {size} "
                              "bytes). Was it copied whole?")
    assert "rename it to ckpt-00000003.weights.h5.unreadable" in message
    os.replace(newest, newest + ".unreadable")  # as it says
    loaded, _, config = run.load("checkpoints")
    assert config["checkpoint_steps"] == [1, 2]
    for got, first, second in zip(loaded.get_weights(), saved[1], saved[2]):
        np.testing.assert_allclose(got, (first.astype("float64") + second) / 2, rtol=1e-6,
                                   atol=1e-7)

    for content, problem in ((b"", "it is empty"),
                             (b"not weights", "it is cut short, or no HDF5 weights file")):
        with open(run.checkpoints.path(2), "wb") as f:
            f.write(content)
        with pytest.raises(runs.UnreadableWeights, match=f"ckpt-00000002.weights.h5 cannot be "
                                                         f"read: {problem}"):
            run.load("checkpoints")

    model = kt.build_transformer(kt.TransformerConfig.tiny(tokenizer.vocab_size, d_model=16,
                                                           d_ff=32))
    model.save_weights(run.averaged_weights)
    _cut(run.averaged_weights, 5000)
    with pytest.raises(ValueError) as error:
        runs.load_initial_weights(model, run.directory)
    message = str(error.value)
    assert message.startswith(f"--init-from {run.directory}: {run.averaged_weights} cannot be "
                              "read: it is cut short (5000 of its")
    assert f"one of the checkpoints in {run.checkpoints.directory}" in message


def test_checkpoints_removed_while_read_are_replaced_by_the_newer_ones(
        tmp_path, tokenizer, monkeypatch):
    """A run still training removes its oldest checkpoint as it writes a new one;
    one gone between the listing and the reading is not an error."""
    import numpy as np

    run, saved, _ = _stopped_run(tmp_path / "run", tokenizer, average_last=1)
    listings = [[(9, run.checkpoints.path(9))]]  # listed, then removed by the trainer
    real_list = runs.Checkpoints.list
    monkeypatch.setattr(runs.Checkpoints, "list",
                        lambda self: listings.pop() if listings else real_list(self))
    loaded, _, config = run.load("checkpoints")
    assert config["checkpoint_steps"] == [3]
    np.testing.assert_array_equal(loaded.get_weights()[0], saved[3][0])


def test_a_run_without_checkpoints_has_nothing_to_translate_with(tmp_path, tokenizer):
    run, _, _ = _stopped_run(tmp_path / "run", tokenizer)
    for _, path in run.checkpoints.list():
        run.checkpoints.remove(path)
    with pytest.raises(FileNotFoundError, match="has no checkpoint yet; train it until"):
        run.load()
    with pytest.raises(FileNotFoundError, match="has no checkpoint yet; train the run"):
        run.load("checkpoints")
    with pytest.raises(ValueError, match="weights must be one of averaged, final, checkpoints"):
        run.load("last")


def test_config_is_written_whole_and_read_back(tmp_path, model):
    run = str(tmp_path / "run")
    training = TrainingConfig(steps=7)
    runs.Run(run).write_config(model.config, training)
    assert os.listdir(run) == [runs.CONFIG]  # no temporary file left behind
    with open(os.path.join(run, runs.CONFIG)) as f:
        assert json.load(f) == runs.Run(run).read_config()
    assert runs.Run(run).read_config() == {"model": model.config.to_dict(),
                                     "training": training.to_dict()}
    assert runs.Run(str(tmp_path / "none")).read_config() is None


def test_a_resumed_run_may_change_only_how_long_it_trains(tmp_path, model):
    run = str(tmp_path / "run")
    fields = TrainingConfig(model="tiny", steps=7).to_dict()
    config, model_config, saved = run_configs.resolve_configs(run, fields, {"model", "steps"})
    assert saved is None and config.steps == 7 and model_config.d_model == 64
    runs.Run(run).write_config(model_config, config)

    longer = dict(fields, steps=20, time_budget=3.0)
    config, resumed_model, saved = run_configs.resolve_configs(run, longer, {"steps", "time_budget"})
    assert (config.steps, config.time_budget) == (20, 3.0)
    assert resumed_model == model_config and saved["training"]["steps"] == 7
    with pytest.raises(ValueError, match=r"other settings \({'tokens_per_batch': 99}"):
        run_configs.resolve_configs(run, dict(fields, tokens_per_batch=99), {"tokens_per_batch"})
    run_configs.check_same_model(run, saved, model_config)
    wider = run_configs.resolve_configs(run, fields, set(), {"d_model": 128})[1]
    with pytest.raises(ValueError, match=r"another shape \({'d_model': 128}"):
        run_configs.check_same_model(run, saved, wider)


def test_a_new_run_of_the_papers_width_takes_its_warm_up(tmp_path):
    """train's default warm-up (300) is the CPU recipes'; a model of d_model 512 or
    more takes the paper's 4000 unless told, or unless a time budget plans it."""
    def warmup(model, explicit=(), **fields):
        fields = TrainingConfig(model=model, **fields).to_dict()
        return run_configs.resolve_configs(str(tmp_path / "new"), fields,
                                           {"model", *explicit})[0].warmup_steps

    assert warmup("base") == warmup("big") == warmup("a_h4") == 4000
    assert warmup("base", {"warmup_steps"}, warmup_steps=300) == 300
    assert warmup("cpu-small") == warmup("tiny") == warmup("c_dmodel256") == 300
    assert warmup("base", {"time_budget"}, time_budget=5.0) == 300  # the budget plans it
    run = str(tmp_path / "run")  # a resumed run keeps what it was started with
    fields = TrainingConfig(model="base", warmup_steps=300).to_dict()
    config, model_config, _ = run_configs.resolve_configs(run, fields, {"model", "warmup_steps"})
    runs.Run(run).write_config(model_config, config)
    assert run_configs.resolve_configs(run, fields, {"model"})[0].warmup_steps == 300


def test_a_new_run_of_the_papers_width_checkpoints_as_its_recipe(tmp_path):
    """train's default interval (250) is the CPU recipes'; a model of d_model 512 or
    more checkpoints every 1000 steps, as `TrainingConfig.paper()`, unless told, or
    unless a time budget plans it, or `bleu_every` would no longer be a multiple."""
    def every(model, explicit=(), **fields):
        fields = TrainingConfig(model=model, **fields).to_dict()
        return run_configs.resolve_configs(str(tmp_path / "new"), fields,
                                           {"model", *explicit})[0].checkpoint_every

    assert every("base") == every("big") == TrainingConfig.paper().checkpoint_every == 1000
    assert every("base", {"checkpoint_every"}, checkpoint_every=250) == 250
    assert every("cpu-small") == every("tiny") == 250
    assert every("base", {"time_budget"}, time_budget=5.0) == 250  # the budget plans it
    assert every("base", {"bleu_every"}, bleu_every=500) == 250
    assert every("base", {"bleu_every"}, bleu_every=2000) == 1000
    run = str(tmp_path / "run")  # a resumed run keeps what it was started with
    fields = TrainingConfig(model="base").to_dict()
    config, model_config, _ = run_configs.resolve_configs(run, fields, {"model", "checkpoint_every"})
    runs.Run(run).write_config(model_config, config)
    assert run_configs.resolve_configs(run, fields, {"model"})[0].checkpoint_every == 250


def test_a_swapped_vocabulary_is_refused_on_resume(tmp_path, model, tokenizer):
    run = make_run_dir(tmp_path / "run", tokenizer, model)
    saved = runs.Run(run).read_config()
    assert saved["vocab_sha256"] == runs.vocabulary_digest(os.path.join(run, runs.VOCAB))
    runs.Run(run).check_same_vocabulary(saved)
    with open(os.path.join(run, runs.VOCAB, "subword.vocab"), "a") as f:
        f.write("extra\t0\n")
    with pytest.raises(ValueError, match="is not the vocabulary this run was trained with"):
        runs.Run(run).check_same_vocabulary(saved)


def test_the_layout_of_a_run_directory(tmp_path):
    """The file names that runs written before `Run` existed have: changing one
    would leave those runs unable to resume, average or load."""
    run = runs.Run(str(tmp_path))
    assert {name: os.path.relpath(path, str(tmp_path)) for name, path in [
        ("config", run.config_path), ("vocab", run.vocab_dir),
        ("checkpoints", run.checkpoints.directory), ("logs", run.tensorboard_dir),
        ("csv", run.csv_log), ("averaged", run.averaged_weights), ("final", run.final_model),
        ("lock", run.lock_path)]} == {
        "config": "config.json", "vocab": "vocab", "checkpoints": "checkpoints",
        "logs": "logs", "csv": "log.csv", "averaged": "averaged.weights.h5",
        "final": "model.keras", "lock": ".lock"}
    checkpoint = run.checkpoints.path(12)
    assert os.path.relpath(checkpoint, str(tmp_path)) == os.path.join(
        "checkpoints", "ckpt-00000012.weights.h5")
    assert run.checkpoints.rng_path(checkpoint).endswith(
        os.path.join("checkpoints", "ckpt-00000012.rng.npy"))
    assert run.checkpoints.clock_path(checkpoint).endswith(
        os.path.join("checkpoints", "ckpt-00000012.clock.json"))


def test_checkpoints_are_listed_by_step_and_removed_with_their_random_state(tmp_path):
    checkpoints = runs.Run(str(tmp_path)).checkpoints
    assert checkpoints.list() == [] and checkpoints.last(2) == []
    os.makedirs(checkpoints.directory)
    for step in (100, 9, 20):
        open(checkpoints.path(step), "w").close()
        open(checkpoints.rng_path(checkpoints.path(step)), "w").close()
        checkpoints.write_spent(checkpoints.path(step), {"wall_seconds": step / 10})
    assert checkpoints.spent(20) == {"wall_seconds": 2.0}
    for other in ("ckpt-00000030.tmp-7.weights.h5", "ckpt-00000040.weights.h5.unreadable"):
        open(os.path.join(checkpoints.directory, other), "w").close()
    assert checkpoints.list() == [(step, checkpoints.path(step)) for step in (9, 20, 100)]
    assert checkpoints.last(2) == [checkpoints.path(20), checkpoints.path(100)]
    checkpoints.remove(checkpoints.path(9))
    assert not os.path.exists(checkpoints.rng_path(checkpoints.path(9)))
    assert checkpoints.spent(9) is None  # as for a checkpoint written without a clock
    aside = checkpoints.set_aside(checkpoints.path(100))
    assert aside == checkpoints.path(100) + ".unreadable" and os.path.exists(aside)
    assert [step for step, _ in checkpoints.list()] == [20]


def test_train_says_which_of_the_papers_settings_a_new_run_took(tmp_path, capsys):
    from keras_transformer.cli import train

    def said(explicit=(), **given):
        fields = TrainingConfig(model="base", **given).to_dict()
        config, model_config, _ = run_configs.resolve_configs(
            str(tmp_path / "new"), fields, {"model", *explicit})
        train.print_paper_settings(config, fields, model_config.d_model)
        return capsys.readouterr().out.strip()

    assert said() == ("Warm-up 4000 steps and a checkpoint and dev pass every 1000 steps: the "
                      "paper's for a model of d_model 512 (--warmup-steps and "
                      "--checkpoint-every set others).")
    assert said({"warmup_steps"}, warmup_steps=300) == (
        "A checkpoint and dev pass every 1000 steps: the paper's for a model of d_model 512 "
        "(--checkpoint-every sets another).")
    assert said({"warmup_steps", "checkpoint_every"}, warmup_steps=300) == ""
