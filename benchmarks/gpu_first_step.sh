#!/usr/bin/env bash
# Where the GPU's first training step goes (the GPU machine, after the staging calls of
# ../shared/gpu/README.md, carrying .gpu/ as benchmarks/gpu_session.sh does): the base model's
# first step at one real-batch shape (520 x 48, vocabulary 8000, mixed_bfloat16), by
# benchmarks/train_throughput.py in four fresh processes:
#   xla_cold   XLA, an empty persistent compile cache (as `train --compilation-cache`)
#   xla_warm   XLA, the same cache again
#   graph      no XLA (tracing and TensorFlow's own kernels)
#   xla_noat   XLA without GEMM autotuning (--xla_gpu_autotune_level=0), another empty cache
# Each leaves its JSON under $OUT (their stderr in stderr.log); the cache's listing goes to cache.txt.
set -u
out=${OUT:?}
if [ -d /tmp/stage ] && [ ! -e /tmp/tfenv.sh ]; then  # the GPU machine, staged
  bash .gpu/stage.sh > /dev/null && bash .gpu/install.sh > "$out/install.log" 2>&1 || exit 1
fi
[ -e /tmp/tfenv.sh ] && . /tmp/tfenv.sh
export TF_FORCE_GPU_ALLOW_GROWTH=true
bench=${BENCH:-"python3 benchmarks/train_throughput.py --model base --vocab-size 8000
       --batch-size 520 --length 48 --precisions mixed_bfloat16 --warmup-steps 1 --steps 10"}
cache() { echo "--tf_xla_persistent_cache_directory=$1 --tf_xla_persistent_cache_device_types=CPU,GPU,TPU"; }
mkdir -p /tmp/c1/autotune /tmp/c2
run() {  # name, seconds, --xla on|off, then the environment's assignments
  local name=$1 seconds=$2 xla=$3; shift 3
  env "$@" timeout "$seconds" $bench --xla "$xla" > "$out/$name.json" 2>> "$out/stderr.log"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results'][0]; print(sys.argv[2], r['first_steps_seconds'], r['seconds_per_step'], r['target_tokens_per_second'], r.get('mfu'))" "$out/$name.json" "$name" 2>/dev/null || echo "$name: no result"
}
run xla_cold 110 on TF_XLA_FLAGS="$(cache /tmp/c1)" XLA_FLAGS=--xla_gpu_per_fusion_autotune_cache_dir=/tmp/c1/autotune
ls -laR /tmp/c1 > "$out/cache.txt" 2>&1
run xla_warm 70 on TF_XLA_FLAGS="$(cache /tmp/c1)" XLA_FLAGS=--xla_gpu_per_fusion_autotune_cache_dir=/tmp/c1/autotune
run graph 50 off
run xla_noat 80 on TF_XLA_FLAGS="$(cache /tmp/c2)" XLA_FLAGS=--xla_gpu_autotune_level=0
