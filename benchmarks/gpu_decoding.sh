#!/usr/bin/env bash
# GPU decoding against CTranslate2 on the same card (issue 35), a call on the GPU machine after
# benchmarks/gpu_session.sh installed TensorFlow there, carrying .ct2/: the ctranslate2 wheel
# (CUDA build, Python 3.12), fetched here into the git-ignored .ct2/ as
# ../.library/device/README.md's Notes say for wheels (39 MB: a call of its own, as the
# TensorFlow chunks are). CTranslate2 finds cuBLAS 12 where TensorFlow does (/tmp/tfenv.sh).
#
#   bash benchmarks/gpu_decoding.sh [serving_latency.py's arguments]
#
# benchmarks/serving_latency.py with the base model's dimensions and random weights (48
# forced steps a request, beam 4): our export (XLA on, auto on a GPU; by default bfloat16,
# the match for CTranslate2's float16) against CTranslate2 float32, float16 and
# int8_float16, at 1, 8, 32 and 128 sentences a request; sentences/s, p50/p95 latency, the
# first request after the warm-up replay. The arguments replace the defaults, which fit
# the 15 minutes a session has: sentences of at most 32 tokens (the export then compiles
# 2 source lengths x 5 batch sizes, not 5 x 5) and 32 sentences a batch size (at least 5
# requests). Files: serving_latency.json (the report), decoding.log. Seconds: DECODE_SECONDS.
set -u
out=${OUT:?set OUT to the folder the files go to}
[ -e /tmp/tfenv.sh ] || { echo "no TensorFlow here: run benchmarks/gpu_session.sh first"; exit 1; }
. /tmp/tfenv.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site3 \
  .ct2/*.whl > "$out/decoding.log" 2>&1 || { cat "$out/decoding.log"; exit 1; }
export PYTHONPATH=$PYTHONPATH:/tmp/site2:/tmp/site3 TF_FORCE_GPU_ALLOW_GROWTH=true PYTHONUNBUFFERED=1
python3 -c "import ctranslate2; print('CTranslate2', ctranslate2.__version__, 'sees',
ctranslate2.get_cuda_device_count(), 'GPU')" 2>&1 | tail -1
[ $# -gt 0 ] || set -- --precisions bfloat16 --max-input-length 32 --sentences 32
echo "serving_latency.py $*"
timeout "${DECODE_SECONDS:-420}" python3 benchmarks/serving_latency.py "$@" \
  --out-dir /tmp/serving_latency > "$out/serving_latency.json" 2>> "$out/decoding.log"
echo "serving_latency.py exit status $?"
grep -E "batch [0-9]+:" "$out/decoding.log" | tail -24
python3 - "$out/serving_latency.json" <<'PY'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit("no report")
print("warm-up replay seconds:", report.get("warmup_replay_seconds"))
for pair, ratios in report.get("over_ctranslate2", {}).items():
    print(pair, ratios)
print({k: v for k, v in report.items() if k.startswith("same_translations")})
PY
