#!/usr/bin/env bash
# The GPU machine's one long call (../shared/gpu/README.md): once the TensorFlow chunks are
# staged there, the call that carries the last chunk (.gpu/) and the wheels the machine lacks
# (.whl/: tensorflow-datasets and keras-hub with the packages they need) runs
#
#   bash benchmarks/gpu_session.sh
#
# It installs, then runs the fast tests on 6 of the 16 cores in the background while
# benchmarks/gpu_training.py (the paper's recipe with `keras-transformer train`, cold and warm,
# and PyTorch on the same card) runs on the other 10, and leaves the logs and the JSON report
# under $OUT (7 files). The tests' load can slow the cold run's compilation a little; the
# sustained rate is read after they end. Seconds: TEST_SECONDS, COLD_SECONDS, WARM_SECONDS.
set -u
out=${OUT:?set OUT to the folder the files go to}
bash .gpu/stage.sh > "$out/install.log" && bash .gpu/install.sh >> "$out/install.log" 2>&1 \
  || { cat "$out/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site2 \
  .whl/*.whl >> "$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
. /tmp/tfenv.sh
export PYTHONPATH=$PYTHONPATH:/tmp/site2 TF_FORCE_GPU_ALLOW_GROWTH=true
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
tail -1 "$out/install.log"
on_cores() { if command -v taskset > /dev/null; then taskset -c "$@"; else shift; "$@"; fi; }

(on_cores 10-15 timeout "${TEST_SECONDS:-330}" python3 -m pytest -q -m "not slow" -n 6 \
   -p no:cacheprovider --ignore=tests/test_ctranslate2.py --durations=15 > "$out/tests.log" 2>&1
 echo "pytest exit status $?" >> "$out/tests.log") &
on_cores 0-9 python3 benchmarks/gpu_training.py --cold-seconds "${COLD_SECONDS:-200}" \
  --warm-seconds "${WARM_SECONDS:-100}" --log-dir "$out" --work-dir /tmp/gpu_training \
  > "$out/gpu_training.json" 2> "$out/gpu_training.err"
echo "gpu_training.py exit status $?"
wait
grep -E "passed|failed|error|exit status" "$out/tests.log" | tail -4
grep -E "^FAILED|^ERROR" "$out/tests.log" | head -40
python3 - "$out/gpu_training.json" <<'EOF'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit("no report")
for part in ("cold", "warm"):
    run = report[part]
    print(part, {k: run.get(k) for k in ("first_step_seconds", "seconds", "returncode")})
    print("  ", run.get("first_line", "")[:200])
    for item in run.get("progress", [])[:12]:
        print("  ", item["seconds"], item["line"])
    for line in run.get("summary", []):
        print("  ", line)
print({k: report.get(k) for k in ("sustained_target_tokens_per_second", "sustained_intervals",
                                  "mfu_bf16_datasheet", "ours_over_torch", "torch_shape")})
torch = report.get("torch", {})
print("torch:", torch.get("error", "")[:600] or [(r["mode"], r.get("target_tokens_per_second"),
      r.get("first_steps_seconds")) for r in torch.get("results", [])])
EOF
