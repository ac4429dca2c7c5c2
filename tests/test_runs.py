"""Tests for keras_transformer.runs: the run directory's layout, loading and config."""

import json
import os

import pytest

from keras_transformer import TrainingConfig
from keras_transformer import runs
from tests.translation_fixtures import make_run_dir

pytestmark = pytest.mark.keeps_graphs


def test_load_run_reports_missing_pieces(tmp_path, model, tokenizer):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        runs.load_run(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        runs.load_run(str(tmp_path))
    run = make_run_dir(tmp_path / "run", tokenizer, model)
    os.remove(os.path.join(run, runs.AVERAGED_WEIGHTS))
    with pytest.raises(FileNotFoundError, match="try weights='final'"):
        runs.load_run(run)
    loaded, _, config = runs.load_run(run, "final")
    assert loaded.config == model.config and config["model"] == model.config.to_dict()


def test_config_is_written_whole_and_read_back(tmp_path, model):
    run = str(tmp_path / "run")
    training = TrainingConfig(steps=7)
    runs.write_config(run, model.config, training)
    assert os.listdir(run) == [runs.CONFIG]  # no temporary file left behind
    with open(os.path.join(run, runs.CONFIG)) as f:
        assert json.load(f) == runs.read_config(run)
    assert runs.read_config(run) == {"model": model.config.to_dict(),
                                     "training": training.to_dict()}
    assert runs.read_config(str(tmp_path / "none")) is None


def test_a_resumed_run_may_change_only_how_long_it_trains(tmp_path, model):
    run = str(tmp_path / "run")
    fields = TrainingConfig(model="tiny", steps=7).to_dict()
    config, model_config, saved = runs.resolve_configs(run, fields, {"model", "steps"})
    assert saved is None and config.steps == 7 and model_config.d_model == 64
    runs.write_config(run, model_config, config)

    longer = dict(fields, steps=20, time_budget=3.0)
    config, resumed_model, saved = runs.resolve_configs(run, longer, {"steps", "time_budget"})
    assert (config.steps, config.time_budget) == (20, 3.0)
    assert resumed_model == model_config and saved["training"]["steps"] == 7
    with pytest.raises(ValueError, match=r"other settings \({'tokens_per_batch': 99}"):
        runs.resolve_configs(run, dict(fields, tokens_per_batch=99), {"tokens_per_batch"})
    runs.check_same_model(run, saved, model_config)
    wider = runs.resolve_configs(run, fields, set(), {"d_model": 128})[1]
    with pytest.raises(ValueError, match=r"another shape \({'d_model': 128}"):
        runs.check_same_model(run, saved, wider)


def test_a_swapped_vocabulary_is_refused_on_resume(tmp_path, model, tokenizer):
    run = make_run_dir(tmp_path / "run", tokenizer, model)
    saved = runs.read_config(run)
    assert saved["vocab_sha256"] == runs.vocabulary_digest(os.path.join(run, runs.VOCAB))
    runs.check_same_vocabulary(run, saved)
    with open(os.path.join(run, runs.VOCAB, "subword.vocab"), "a") as f:
        f.write("extra\t0\n")
    with pytest.raises(ValueError, match="is not the vocabulary this run was trained with"):
        runs.check_same_vocabulary(run, saved)
