"""scripts/quickstart.sh itself, as README.md tells a new user to run it, with a
half-minute training budget: its four steps, their messages, and nothing else on
the terminal (no TensorFlow start-up logs, no warnings)."""

import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = 3  # the sentences quickstart.sh translates


@pytest.mark.slow
def test_the_quickstart_runs_end_to_end_and_prints_only_its_messages(tmp_path):
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith(("TF_", "KERAS_"))}  # as a new user's shell
    environment.update(RUN_DIR=str(tmp_path / "run"), EXPORT_DIR=str(tmp_path / "export"))
    result = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "quickstart.sh"), "--time-budget", "0.5"],
        capture_output=True, text=True, env=environment, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout.splitlines()

    headers = [i for i, line in enumerate(out) if line.startswith("== ")]
    assert [out[i][:6] for i in headers] == ["== 1/4", "== 2/4", "== 3/4", "== 4/4"], out
    training = out[headers[0] + 1:headers[1]]
    assert training[0].startswith("Training on CPU") and any(
        line.startswith("Recipe for 0.5 minutes on this CPU") for line in training), training
    assert any(re.match(r"Where the [\d.]+ minutes went: start-up ", line)
               for line in training), training
    translations = out[headers[2] + 1:headers[3]]
    # One line per sentence; half a minute of training on a slow CPU may translate
    # to nothing yet, so the words are the end-to-end tests' to check.
    assert len(translations) == SAMPLES, out
    bleu = re.fullmatch(r"sacreBLEU: BLEU = (\d+\.\d\d) .*", out[headers[3] + 1])
    assert bleu and 0.0 <= float(bleu.group(1)) <= 100.0, out[headers[3]:]
    assert re.fullmatch(r"500 sentences in [\d.]+ s \([\d.]+ sentences/s\)", out[-1]), out[-1]
    assert os.path.exists(tmp_path / "export" / "1" / "saved_model.pb")

    # stderr holds evaluate's progress bar (carriage returns) and nothing else.
    leftover = [part for part in re.split(r"[\r\n]", result.stderr)
                if part.strip() and "sent/s" not in part]
    assert leftover == [], leftover
