#!/usr/bin/env bash
# The GPU machine's one long call (../shared/gpu/README.md): once the TensorFlow chunks are
# staged there, the call that carries the last chunk (.gpu/) and, for the tests, the wheels
# the machine lacks (.whl/, if there: tensorflow-datasets and keras-hub with the packages they
# need) runs
#
#   bash benchmarks/gpu_session.sh
#
# 1. One training step of the base model at a real batch shape (520 x 48, vocabulary 8000,
#    mixed_bfloat16, XLA; benchmarks/train_throughput.py) in two fresh processes, each with
#    an empty compile cache: cuBLAS for every GEMM (--xla_gpu_enable_triton_gemm=false, as
#    train.py sets it) and XLA's own default (Triton GEMMs autotuned beside cuBLAS): the
#    first step's seconds (the compilation) and the step's. Files step_cublas.json and
#    step_triton.json.
# 2. benchmarks/gpu_training.py: the paper's recipe with `keras-transformer train`, cold and
#    warm, and PyTorch compiled on the same card (gpu_training.json, train_cold.log,
#    train_warm.log).
# 3. With TEST_SECONDS > 0 (default 0), the fast tests on 6 of the 16 cores beside step 2
#    (on all 16 with COLD_SECONDS=0).
# 4. With FIT_SECONDS > 0 (default 0), where train's step time goes: train_throughput.py on
#    the fixed 520 x 48 batch, on train.py's real batches (the step fit calls) and through
#    model.fit without and with train.py's callbacks (--fit-steps), and with FIT_TORCH=1
#    PyTorch compiled at 520 x 48 (fit_overhead.json). It took 129 s on an H200
#    (2026-11-27, no PyTorch) before its fit twin made as train makes its model (another
#    compile_ahead, about 55 s): give it 250 s, more with PyTorch.
# 5. With ALLREDUCE_SECONDS > 0 (default 0), benchmarks/allreduce.py over 2 logical GPUs
#    with XLA on each replica (allreduce.json; without XLA it was measured on 2026-11-27):
#    the all-reduce and the optimizer's update alone (compiled, and as Keras runs it), then
#    4 setups of 39 to 63 s each to their first steps on an H200, one after another: 235 s
#    and 280 s were too few on 2026-11-27 (the fourth setup still compiling). They now
#    compile side by side: all 4 in 116 to 124 s, the whole benchmark 216 s on an H200
#    (2026-11-28): give it 240 s, in a call of its own.
# 6. With PROFILE_SECONDS > 0 (default 0), before step 2: where the step's GPU time goes,
#    train_throughput.py at 520 x 48 against PyTorch compiled at the same batch, each
#    profiling 5 steps after its 20 timed ones (profile.json, ours.xplane.pb; the kernels
#    summed by kind by benchmarks/kernel_profile.py; CUPTI 12 carried in .gpu/cupti/, see
#    below). 126 s on an H200 (2026-11-28): give it 170. With PROFILE_GRAPHS=1 (apart
#    from PROFILE_SECONDS), ours alone profiled with XLA's CUDA graphs kept on (the
#    profiler turns them off: each kernel launched apart), for the host's real cost a
#    step (profile_graphs.json, its `profile.host`); about 70 s.
# 7. With DISPATCH_SECONDS > 0 (default 0), before step 2: whether the host runs ahead of
#    the GPU, benchmarks/step_dispatch.py at 260 and 520 rows of 48, without a strategy
#    and under OneDeviceStrategy (dispatch.json). One batch size, one strategy took 100 s
#    on an H200 (2026-11-28, with fit and steps_per_execution): give it 240. DISPATCH_VLOG=1
#    adds a short run with XLA's executable logging which buffers moved since its last run
#    (dispatch_vlog.log; about 60 s more).
# install.log holds nvidia-smi's reading; stderr.log the benchmarks' stderr.
# A call carries at most 64 MiB with the tree (about 10 MB tracked): make_payload.sh's
# 55 MB chunks no longer fit; re-split them at 50 MB first
#   (cd .gpu && cat part_* > /tmp/p && rm part_* && split -b 50M -d -a 2 /tmp/p part_ \
#    && sha256sum part_* > SHA256SUMS), then stage part_00..05 and carry part_06 here.
# A machine where an earlier call installed TensorFlow (/tmp/tfenv.sh) skips the install.
# WARM_VMODULE (TF_CPP_VMODULE, e.g. gpu_training.py's WARM_VMODULE): the warm run --verbose,
# with those modules' log lines in train_warm.log, for where its start goes.
# Seconds: STEP_SECONDS (0: no step 1), COLD_SECONDS (0: no step 2), WARM_SECONDS,
# TORCH_SECONDS (0: no PyTorch run in step 2), TEST_SECONDS, FIT_SECONDS, ALLREDUCE_SECONDS,
# PROFILE_SECONDS, DISPATCH_SECONDS.
set -u
out=${OUT:?set OUT to the folder the files go to}
if [ ! -e /tmp/tfenv.sh ]; then  # not installed on this machine yet
  bash .gpu/stage.sh > "$out/install.log" && bash .gpu/install.sh >> "$out/install.log" 2>&1 \
    || { cat "$out/install.log"; exit 1; }
fi
if ls .whl/*.whl > /dev/null 2>&1; then  # only the tests and keras-hub's comparison need them
  # Only the distributions the machine lacks: /tmp/site2 is on PYTHONPATH, ahead of its own.
  missing=$(python3 - .whl/*.whl <<'PY'
import importlib.metadata, re, sys
for wheel in sys.argv[1:]:
    name = re.sub(r"[-_.]+", "-", wheel.split("/")[-1].split("-")[0]).lower()
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        print(wheel)
PY
)
  echo "wheels installed: $(echo $missing | wc -w) of $(ls .whl/*.whl | wc -l)" >> "$out/install.log"
  [ -z "$missing" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site2 $missing >> "$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
fi
# CUPTI 12 for TensorFlow's profiler (PROFILE_SECONDS), where the call carries it: the
# payload has none, and TensorFlow (built for CUDA 12) asks for libcupti.so.12. Fetched here
# with `pip download nvidia-cuda-cupti-cu12==12.5.82` (its lib/libcupti.so.12, gzipped).
if [ -e .gpu/cupti/libcupti.so.12.gz ] && [ ! -e /tmp/cu12compat/libcupti.so.12 ]; then
  gzip -dc .gpu/cupti/libcupti.so.12.gz > /tmp/cu12compat/libcupti.so.12
fi
. /tmp/tfenv.sh
export PYTHONPATH=$PYTHONPATH:/tmp/site2 TF_FORCE_GPU_ALLOW_GROWTH=true PYTHONUNBUFFERED=1
[ -e "$out/install.log" ] && tail -1 "$out/install.log"  # none where an earlier call installed
nvidia-smi >> "$out/install.log" 2>&1
on_cores() { if command -v taskset > /dev/null; then taskset -c "$@"; else shift; "$@"; fi; }
started=$SECONDS

cache_flags() { echo "--tf_xla_persistent_cache_directory=$1 --tf_xla_persistent_cache_device_types=CPU,GPU,TPU"; }
step() {  # name, then XLA_FLAGS beyond the autotune cache's
  local name=$1 dir=/tmp/step_$1; shift
  mkdir -p "$dir/autotune"
  TF_XLA_FLAGS="$(cache_flags "$dir")" \
  XLA_FLAGS="--xla_gpu_per_fusion_autotune_cache_dir=$dir/autotune $*" \
    timeout "${STEP_SECONDS:-130}" python3 benchmarks/train_throughput.py --model base \
    --vocab-size 8000 --batch-size 520 --length 48 --precisions mixed_bfloat16 --xla on \
    --warmup-steps 1 --steps 30 > "$out/step_$name.json" 2>> "$out/stderr.log"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results'][0]; print(sys.argv[2], r['first_steps_seconds'], r['seconds_per_step'], r.get('mfu_datasheet', r.get('mfu')))" \
    "$out/step_$name.json" "$name" 2> /dev/null || echo "$name: no result"
}
if [ "${STEP_SECONDS:-130}" -gt 0 ]; then  # STEP_SECONDS=0: straight to the train runs
  step cublas  # what train.py and train_throughput.py set (cli/common.XLA_GPU_FLAGS)
  step triton --xla_gpu_enable_triton_gemm=true  # XLA's own default
  echo "steps done at $((SECONDS - started)) s"
fi

# Our step at 520 x 48 with 5 steps profiled after its timed ones, and what its report says.
profile_step() {  # seconds, report's name, then train_throughput.py's further flags
  local seconds=$1 name=$2; shift 2
  timeout "$seconds" python3 benchmarks/train_throughput.py --model base --vocab-size 8000 \
    --batch-size 520 --length 48 --precisions mixed_bfloat16 --xla on --warmup-steps 1 \
    --steps 20 --profile-steps 5 "$@" > "$out/$name.json" 2>> "$out/stderr.log"
  echo "$name: exit status $? at $((SECONDS - started)) s"
  python3 - "$out/$name.json" <<'PY'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit("no report")
ours = report["results"][0]
torch = [r for r in report.get("torch", {}).get("results", ()) if r.get("status") == "ok"]
for name, run in [("ours", ours)] + [("torch", r) for r in torch]:
    profile = run.get("profile", {})
    print(name, run["seconds_per_step"], run["target_tokens_per_second"], run.get("mfu"),
          {k: profile.get(k) for k in ("kernels_per_step", "kernel_seconds", "busy_seconds",
                                       "wall_seconds", "busy_share_of_wall")})
    print("  ", {k: v["seconds"] for k, v in profile.get("kinds", {}).items()})
    for item in profile.get("top", [])[:8]:
        print("   ", item["seconds"], item["launches"], item["kind"], item["name"][:90])
    for item in profile.get("host", [])[:8]:
        print("    host", item["seconds"], item["calls"], item["name"][:90])
print("lines:", ours.get("profile", {}).get("lines"))
if "torch" in report:
    print("speedup_over_torch:", ours.get("speedup_over_torch"), report["torch"].get("error", "")[:300])
PY
}
if [ "${PROFILE_SECONDS:-0}" -gt 0 ]; then  # where the step's GPU time goes, ours and torch's
  profile_step "$PROFILE_SECONDS" profile --compare-torch --torch-compile on --profile-dir /tmp/profile
  xplane=$(find /tmp/profile -name "*.xplane.pb" -size -15M 2>/dev/null | head -1)
  [ -z "$xplane" ] || cp "$xplane" "$out/ours.xplane.pb"
fi
if [ "${PROFILE_GRAPHS:-0}" = 1 ]; then  # ours again, XLA's CUDA graphs kept on while profiled
  # (train_throughput.py adds train's own XLA flags to these)
  XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true \
    profile_step 120 profile_graphs --profile-dir /tmp/profile_graphs
fi
if [ "${DISPATCH_SECONDS:-0}" -gt 0 ]; then  # does the host run ahead of the GPU?
  timeout "$DISPATCH_SECONDS" python3 benchmarks/step_dispatch.py --batch-sizes 520,260 \
    --strategy default,one_device --steps 30 --repeats 2 \
    > "$out/dispatch.json" 2>> "$out/stderr.log"
  echo "step_dispatch.py exit status $? at $((SECONDS - started)) s"
  python3 -c "
import json, sys
for run in json.load(open(sys.argv[1]))['runs']:
    print(run['strategy'], run['batch_size'], run['sync'], run['async'], run.get('fit'),
          run.get('fit_steps_per_execution'))" "$out/dispatch.json" 2>&1 | tail -4
  if [ "${DISPATCH_VLOG:-0}" = 1 ]; then  # do the XLA program's buffers move from step to step?
    # XLA's GPU executable logs each buffer whose address changed since the last run at
    # VLOG 5: a CUDA graph over buffers that move is updated every step, on the host.
    TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=gpu_executable=5,command_buffer_thunk=3 \
      timeout 120 python3 benchmarks/step_dispatch.py --batch-sizes 520 --steps 5 \
      --repeats 1 --steps-per-execution 1 > /dev/null 2> "$out/dispatch_vlog.log"
    echo "address changes logged: $(grep -c "address changed" "$out/dispatch_vlog.log")," \
      "of them temp: $(grep "address changed" "$out/dispatch_vlog.log" | grep -c "(temp)")"
  fi
fi
if [ "${TEST_SECONDS:-0}" -gt 0 ]; then
  # -v: each result is logged as it comes, so a run cut short by the timeout still says
  # which tests passed and failed. Alone (COLD_SECONDS=0), the tests get every core.
  cores=10-15 workers=6
  [ "${COLD_SECONDS:-170}" -gt 0 ] || cores=0-15 workers=12
  (on_cores "$cores" timeout "$TEST_SECONDS" python3 -m pytest -v -m "not slow" -n "$workers" \
     -p no:cacheprovider --ignore=tests/test_ctranslate2.py > "$out/tests.log" 2>&1
   echo "pytest exit status $?" >> "$out/tests.log") &
fi
if [ "${COLD_SECONDS:-170}" -gt 0 ]; then  # COLD_SECONDS=0: no train runs
  on_cores 0-9 python3 benchmarks/gpu_training.py \
    --cold-seconds "${COLD_SECONDS:-170}" --warm-seconds "${WARM_SECONDS:-60}" \
    --torch-seconds "${TORCH_SECONDS:-100}" $([ "${TORCH_SECONDS:-100}" -gt 0 ] || echo --torch-steps 0) \
    ${WARM_VMODULE:+--warm-vmodule "$WARM_VMODULE"} \
    --log-dir "$out" --work-dir /tmp/gpu_training \
    > "$out/gpu_training.json" 2>> "$out/stderr.log"
  echo "gpu_training.py exit status $? at $((SECONDS - started)) s"
fi
wait
if [ "${FIT_SECONDS:-0}" -gt 0 ]; then
  timeout "$FIT_SECONDS" python3 benchmarks/train_throughput.py --model base --vocab-size 8000 \
    --tokens-per-batch 25000 --length 48 --precisions mixed_bfloat16 --xla on --warmup-steps 1 \
    --steps 20 --real-batches bundled --real-steps 100 --fit-steps 60 \
    $([ "${FIT_TORCH:-0}" = 1 ] && echo --compare-torch --torch-compile on) \
    > "$out/fit_overhead.json" 2>> "$out/stderr.log"
  echo "train_throughput.py exit status $? at $((SECONDS - started)) s"
  python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))['results'][0]
real = r.get('real_batches', {})
print('fixed', r['seconds_per_step'], r['target_tokens_per_second'], r.get('speedup_over_torch'))
print('real', real.get('compile_ahead_seconds'), real.get('target_tokens_per_second'),
      real.get('real_over_fixed'), real.get('fit'))" "$out/fit_overhead.json" 2>&1 | tail -4
fi
if [ "${ALLREDUCE_SECONDS:-0}" -gt 0 ]; then
  timeout "$ALLREDUCE_SECONDS" python3 benchmarks/allreduce.py --xla on --steps 20 \
    > "$out/allreduce.json" 2>> "$out/stderr.log"
  echo "allreduce.py exit status $? at $((SECONDS - started)) s"
  python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
print({k: v['seconds_per_step'] for k, v in r['steps'].items()})
print(r['allreduce'], r['update'], r['on_one_card'], r['projection'])
" "$out/allreduce.json" 2>&1 | tail -3
fi
if [ -e "$out/tests.log" ]; then
  grep -E "passed|failed|exit status| FAILED | ERROR |^FAILED|^ERROR" "$out/tests.log" | sort -u | tail -40
fi
[ ! -e "$out/gpu_training.json" ] || python3 - "$out/gpu_training.json" <<'PY'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit("no report")
for part in ("cold", "warm"):
    run = report[part]
    print(part, {k: run.get(k) for k in ("first_step_seconds", "seconds", "returncode")})
    for item in run.get("compilations", [])[:4]:
        print("  ", item["seconds"], item["line"][:150])
    for item in run.get("progress", [])[:8]:
        print("  ", item["seconds"], item["line"][:150])
    for line in run.get("summary", []):
        print("  ", line[:300])
print({k: report.get(k) for k in ("xla_flags", "sustained_target_tokens_per_second",
                                  "sustained_intervals", "mfu_bf16_datasheet",
                                  "ours_over_torch", "torch_shape", "interval_split_seconds")})
torch = report.get("torch", {})
print("torch:", torch.get("error", "")[:600] or [(r["mode"], r.get("target_tokens_per_second"),
      r.get("first_steps_seconds"), r.get("seconds_per_step")) for r in torch.get("results", [])])
PY
