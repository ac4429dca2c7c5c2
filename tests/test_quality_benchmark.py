"""quality_per_compute.py keeps a finished run's figures: its report is written
before the optional plot, and sacreBLEU's repeated warning is shown once."""

import importlib.util
import json
import logging
import os
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import quality_per_compute  # noqa: E402

REPORT = {"benchmark": "quality_per_compute", "corpus": "bundled (en->es)",
          "cpu_seconds_budget": 60, "test_pairs": 2,
          "systems": {"ours": {"bleu": 12.5, "cpu_seconds": 59.0,
                               "curve": [{"cpu_seconds": 30.0, "bleu": 5.0},
                                         {"cpu_seconds": 59.0, "bleu": 12.0}]}}}


def test_the_report_is_written_without_matplotlib(tmp_path, monkeypatch, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else find_spec(name, *a))
    quality_per_compute.write_report(dict(REPORT), str(tmp_path), str(tmp_path / "plot.png"))
    output = capsys.readouterr()
    written = json.loads((tmp_path / "report.json").read_text())
    assert json.loads(output.out) == written
    assert written["systems"] == REPORT["systems"] and written["plot"] is None
    assert not os.path.exists(tmp_path / "plot.png")
    notices = output.err.strip().splitlines()
    assert len(notices) == 1 and "matplotlib is not installed" in notices[0]


def test_the_report_comes_before_a_failing_plot(tmp_path, monkeypatch, capsys):
    def broken_plot(report, path):
        assert json.loads((tmp_path / "report.json").read_text())["plot"] == path
        raise RuntimeError("no display")

    monkeypatch.setattr(quality_per_compute, "plot", broken_plot)
    quality_per_compute.write_report(dict(REPORT), str(tmp_path), str(tmp_path / "plot.png"))
    output = capsys.readouterr()
    assert json.loads(output.out)["systems"] == REPORT["systems"]
    assert output.err.strip().splitlines() == [
        "quality_per_compute: no plot: RuntimeError: no display; the figures are in report.json"]


def test_the_plot_is_drawn_with_matplotlib(tmp_path, capsys):
    quality_per_compute.write_report(dict(REPORT), str(tmp_path), str(tmp_path / "plot.png"))
    assert os.path.getsize(tmp_path / "plot.png") > 0
    assert capsys.readouterr().err == ""


def test_sacrebleu_warns_once_per_message(caplog):
    import sacrebleu

    logger = logging.getLogger("sacrebleu")
    once = quality_per_compute.OnceEach()
    logger.addFilter(once)
    try:
        tokenized = ["el principio ." for _ in range(120)]
        with caplog.at_level(logging.WARNING, logger="sacrebleu"):
            for _ in range(3):
                sacrebleu.metrics.BLEU().corpus_score(tokenized, [tokenized])
    finally:
        logger.removeFilter(once)
    messages = [record.getMessage() for record in caplog.records]
    assert any("forgot to detokenize" in message for message in messages)
    assert len(messages) == len(set(messages)) == 3
