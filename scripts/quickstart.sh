#!/usr/bin/env bash
# The main job, end to end on the bundled English-Spanish corpus: set up .venv,
# train a small model (keras-transformer train), export it as a SavedModel (export),
# reload the export to translate sample sentences (translate), and print its
# sacreBLEU on 500 test pairs (evaluate), with the command that pip installed.
# Training gets 8 of the job's 10 minutes, and chooses its vocabulary, batch size,
# dropout and learning rate from timed training steps (docs/cpu-recipes.md,
# with the figures). Extra arguments go to keras-transformer train, e.g. --time-budget 20
# for a better model. Run again, the run's budget is spent and it exports it again;
# a larger --time-budget trains it on, and removing runs/quickstart starts anew.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
run=${RUN_DIR:-runs/quickstart}
export_dir=${EXPORT_DIR:-exports/quickstart}
kt=.venv/bin/keras-transformer

echo "== 1/4 train: $run"
"$kt" train --out "$run" --time-budget 8 --test-sentences 0 "$@"
echo "== 2/4 export: $export_dir"
rm -rf "$export_dir"
"$kt" export --run "$run" --out "$export_dir"
echo "== 3/4 translate sample sentences with the export"
printf '%s\n' \
  "In the beginning, God created the heavens and the earth." \
  "Jesus wept." \
  "Love your neighbor as yourself." \
  | "$kt" translate --export "$export_dir"
echo "== 4/4 sacreBLEU of the export on the bundled test set"
"$kt" evaluate --export "$export_dir" --test bundled --split test --limit 500
echo "Translate your own sentences, one a line (Ctrl-D ends): $kt translate --export $export_dir"
