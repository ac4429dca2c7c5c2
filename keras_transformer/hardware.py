"""The device a run trains on, and the settings that fit it (`--precision auto`,
`--jit-compile auto`, `--length-buckets 0`).

What `auto` picks, and why (the measurements: docs/gpu-and-distribution.md,
docs/cpu-recipes.md and docs/benchmarks.md, from benchmarks/train_throughput.py and
benchmarks/decode_throughput.py):
- GPUs and TPUs: XLA, without which the base model's step is several times slower;
  mixed_bfloat16 where the device has bfloat16 (TPUs, NVIDIA compute capability 8.0
  and later), mixed_float16 with loss scaling on older GPUs; batches in a few fixed
  shapes, so that XLA compiles a known number of times.
- CPUs: TensorFlow's own kernels (XLA:CPU's matrix multiplies are slower than
  oneDNN's, and every batch shape compiles); mixed_bfloat16 where the CPU
  multiplies bfloat16 in hardware (AMX, AVX512-BF16) and a measured product
  shows it paying (`bfloat16_pays`), else float32; the fine length buckets.

For decoding (`export --jit-compile auto`, `decoding_jit_compile`; `export
--precision auto`, `decoding_precision`, by the same measured rule): XLA where a GPU
is visible, not on a CPU: there it answers one sentence faster but batches slower,
and a stock model server runs it only with `--xla_cpu_compilation_enabled`
(`export --xla-max-batch-size 4`: XLA for requests of up to 4 sentences alone).
Without XLA, the search multiplies by transposed kernels on CPUs without AVX-512
only (`decoding_transposed_kernels`).

Such a search also splits a request's sentences into one search per core, run side
by side (`decoding_parallel_searches`).

Imports TensorFlow only in `detect`, `matmul_flops_per_second`,
`decoding_jit_compile`, `decoding_precision`, `decoding_transposed_kernels` and
`decoding_parallel_searches`.
"""

import dataclasses
import os
import platform
import time

from keras_transformer.config import AUTO
from keras_transformer.config import JIT_COMPILE

# Length buckets that XLA compiles once each on an accelerator (see
# `data.fit_bucket_lengths`).
ACCELERATOR_LENGTH_BUCKETS = 8
# On a CPU, bfloat16 is chosen where its measured matrix multiply runs at least
# this many times as fast as float32's: mixed precision also casts activations
# and weights, so a product only a little faster does not pay. The CPUs seen so
# far lie far on either side (bfloat16's speed over float32's on 2 cores): an
# Intel Xeon with AMX about 4, an AMD EPYC Zen 4 (AVX512-BF16) about 2 (the
# products in benchmarks/results/cpu/2026-11-25-decode_throughput*.json), an
# Intel Xeon whose hypervisor hides AMX (AVX512-BF16 only) 0.5, where
# mixed_bfloat16 made cpu-small's step 1.54x slower (docs/cpu-recipes.md).
BFLOAT16_MIN_SPEEDUP = 1.25


@dataclasses.dataclass(frozen=True)
class Device:
    """What trains: `kind` "cpu", "gpu" or "tpu", `count` of them, `name`, the
    GPU's `compute_capability` `(major, minor)`, the CPU's `cpu_flags`, and its
    measured `matmul_flops` (`measure_cpu_matmuls`: FLOP/s by compute dtype)."""

    kind: str
    count: int = 1
    name: str = ""
    compute_capability: tuple = ()
    cpu_flags: dict = dataclasses.field(default_factory=dict)
    matmul_flops: dict = dataclasses.field(default_factory=dict)

    @property
    def has_bfloat16(self):
        """Whether bfloat16 matrix multiplies pay: in hardware on an accelerator,
        and on a CPU measured to pay (`bfloat16_pays`)."""
        if self.kind == "tpu":
            return True
        if self.kind == "gpu":
            return tuple(self.compute_capability) >= (8, 0)
        return bfloat16_pays(self.cpu_flags, self.matmul_flops)

    def describe(self):
        """One line for people, e.g. "1 GPU (NVIDIA H100 80GB HBM3, compute 9.0)"."""
        if self.kind == "gpu":
            capability = ".".join(map(str, self.compute_capability))
            return f"{self.count} GPU{'s' * (self.count > 1)} ({self.name}, compute {capability})"
        if self.kind == "tpu":
            return f"{self.count} TPU cores"
        extensions = [name for name in ("avx512f", "avx512_bf16", "amx_bf16")
                      if self.cpu_flags.get(name)] or (["avx2"] if self.cpu_flags.get("avx2")
                                                       else [])
        extensions += filter(None, [isa_limit(self.cpu_flags)])
        cpus = self.cpu_flags.get("cpus")
        return (f"CPU ({self.cpu_flags.get('model_name') or platform.processor()}, "
                f"{cpus} core{'s' * (cpus != 1)}{', ' if extensions else ''}"
                f"{', '.join(extensions)})")


# What oneDNN may use under each `ONEDNN_MAX_CPU_ISA` (oneDNN's documented values):
# the extensions of `cpu_flags` it leaves out. Values not listed (ALL, DEFAULT, the
# AMX ones) leave out none.
_LEFT_OUT_BY_ISA_LIMIT = {
    **dict.fromkeys(("SSE41", "AVX"), ("avx2", "avx512f", "avx512_bf16", "amx")),
    **dict.fromkeys(("AVX2", "AVX2_VNNI", "AVX2_VNNI_2"), ("avx512f", "avx512_bf16", "amx")),
    **dict.fromkeys(("AVX512_CORE", "AVX512_CORE_VNNI"), ("avx512_bf16", "amx")),
    **dict.fromkeys(("AVX512_CORE_BF16", "AVX512_CORE_FP16"), ("amx",)),
}


def cpu_flags(environ=None, cpuinfo="/proc/cpuinfo"):
    """The CPU's model, the cores this process may run on (`available_cores`:
    one under `taskset -c 0`) and its matrix-multiply extensions, from `cpuinfo`,
    less those that `ONEDNN_MAX_CPU_ISA` in `environ` (by default, this process's
    environment) keeps oneDNN from using: held to AVX2, an AVX-512 CPU is chosen
    for as an AVX2 one (precision, kernel layout), and the limit is recorded."""
    flags, model = set(), ""
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags" and not flags:
                    flags = set(value.split())
                elif key.strip() == "model name" and not model:
                    model = value.strip()
    except OSError:
        pass
    environ = os.environ if environ is None else environ
    limit = environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    left_out = _LEFT_OUT_BY_ISA_LIMIT.get(limit, ())
    if "amx" in left_out:
        flags = {flag for flag in flags if not flag.startswith("amx")}
    flags -= set(left_out)
    result = {
        "model_name": model or platform.processor(),
        "cpus": available_cores(),
        "avx2": "avx2" in flags,
        "avx512f": "avx512f" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx": any(flag.startswith("amx") for flag in flags),
        "amx_bf16": "amx_bf16" in flags,
        "amx_flags": sorted(flag for flag in flags if flag.startswith("amx")),
    }
    if limit:
        result["onednn_max_cpu_isa"] = limit
    return result


def isa_limit(flags):
    """The words "held to ONEDNN_MAX_CPU_ISA=..." where `flags` (`cpu_flags()`)
    were read under that limit, else None: for train's first line and the
    benchmarks' plots (benchmarks/results_table.py, standard library only, spells
    them itself)."""
    limit = flags.get("onednn_max_cpu_isa")
    return f"held to ONEDNN_MAX_CPU_ISA={limit}" if limit else None


def has_bfloat16_instructions(flags):
    """Whether a CPU of `flags` (`cpu_flags()`) multiplies bfloat16 in hardware."""
    return bool(flags.get("amx_bf16") or flags.get("avx512_bf16"))


def bfloat16_pays(flags, matmul_flops):
    """Whether bfloat16 matrix multiplies pay on a CPU of `flags`: it has bfloat16
    instructions, and its measured `matmul_flops` (`measure_cpu_matmuls`) put
    bfloat16's at `BFLOAT16_MIN_SPEEDUP` times float32's or more."""
    if not has_bfloat16_instructions(flags) or "bfloat16" not in matmul_flops:
        return False
    return matmul_flops["bfloat16"] >= BFLOAT16_MIN_SPEEDUP * matmul_flops["float32"]


def bfloat16_reason(flags, matmul_flops):
    """Why bfloat16 pays or not on this CPU (`bfloat16_pays`), in words."""
    if not has_bfloat16_instructions(flags):
        return "this CPU has no bfloat16 instructions"
    if "bfloat16" not in matmul_flops:
        return "bfloat16's speed on this CPU not measured"
    rates = (f"bfloat16 matrix multiplies at {matmul_flops['bfloat16'] / 1e9:.0f} GFLOP/s, "
             f"float32 at {matmul_flops['float32'] / 1e9:.0f}")
    if bfloat16_pays(flags, matmul_flops):
        return rates
    return f"{rates}: bfloat16 does not pay on this CPU"


# How long `--precision auto`'s probe multiplies in each compute dtype.
PROBE_SECONDS = 0.3


def matmul_flops_per_second(compute_dtype="float32", seconds=PROBE_SECONDS):
    """FLOP/s of TensorFlow multiplying (1024 x 256) by (256 x 4096) matrices in
    `compute_dtype`, the best of the calls made in about `seconds`."""
    return _matmul_flops((compute_dtype,), seconds)[compute_dtype]


def measure_cpu_matmuls(flags):
    """`{dtype: FLOP/s}` of this CPU's matrix multiplies (`matmul_flops_per_second`):
    float32's, and bfloat16's where the CPU has bfloat16 instructions (`flags`),
    their calls taken in turn."""
    dtypes = ("float32", "bfloat16") if has_bfloat16_instructions(flags) else ("float32",)
    return _matmul_flops(dtypes, PROBE_SECONDS * len(dtypes))


def _matmul_flops(dtypes, seconds):
    """`{dtype: FLOP/s}` of the (1024 x 256) by (256 x 4096) product in each of
    `dtypes`, the best of each one's calls, made in turn until `seconds` pass. In
    turn, not one dtype after the other: another process's load that comes and
    goes then slows both alike. (Beside a busy test worker, a Zen 4 whose bfloat16
    product is twice as fast chose float32, likely from one after the other;
    2026-12-07.)
    The matrices come from stateless random ops: the run's seed is not set yet,
    and with op determinism on (TF_DETERMINISTIC_OPS) a seedless random op raises."""
    import tensorflow as tf

    multiply = tf.function(
        lambda x, y: tf.reduce_sum(tf.cast(tf.matmul(x, y)[0, :1], "float32")), autograph=False)
    operands = {}
    for dtype in dtypes:
        a = tf.cast(tf.random.stateless_normal((1024, 256), seed=(1, 2)), dtype)
        b = tf.cast(tf.random.stateless_normal((256, 4096), seed=(3, 4)), dtype)
        multiply(a, b)  # trace, once per dtype
        operands[dtype] = a, b
    best = dict.fromkeys(dtypes, float("inf"))
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or float("inf") in best.values():
        for dtype, (a, b) in operands.items():
            start = time.perf_counter()
            multiply(a, b).numpy()
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    return {dtype: 2 * 1024 * 256 * 4096 / fastest for dtype, fastest in best.items()}


def uses_measured_matmuls(config):
    """Whether training with `config` (a `TrainingConfig`) needs a CPU's matrix
    multiplies measured: for `--precision auto` unless XLA is asked for (a CPU
    then gets float32 whatever they measure). A time budget's recipe times real
    steps instead (`training.time_training_step`)."""
    return config.precision == AUTO and config.jit_compile != "on"


def cpu_device(measure_matmuls=True):
    """The `Device` of this CPU, its matrix multiplies measured if `measure_matmuls`."""
    flags = cpu_flags()
    return Device("cpu", cpu_flags=flags,
                  matmul_flops=measure_cpu_matmuls(flags) if measure_matmuls else {})


def detect(strategy, measure_matmuls=True):
    """The `Device` that `strategy`'s replicas run on; a CPU's matrix multiplies
    are measured (`measure_cpu_matmuls`, about a second) if `measure_matmuls`:
    `--precision auto` needs them."""
    import tensorflow as tf

    if strategy is tf.distribute.get_strategy() and not tf.distribute.in_cross_replica_context():
        return cpu_device(measure_matmuls)  # the default strategy, no GPU
    # e.g. "/job:localhost/replica:0/task:0/device:GPU:0"
    kinds = {tf.DeviceSpec.from_string(name).device_type
             for name in strategy.extended.worker_devices}
    if "TPU" in kinds:
        return Device("tpu", count=strategy.num_replicas_in_sync)
    gpus = tf.config.list_physical_devices("GPU")
    if "GPU" in kinds and gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        return Device("gpu", count=strategy.num_replicas_in_sync,
                      name=details.get("device_name", "GPU"),
                      compute_capability=tuple(details.get("compute_capability", ())))
    return cpu_device(measure_matmuls)


def resolve(config, device):
    """`config` with its `auto` settings chosen for `device`, and a line for
    people saying what was chosen and why."""
    accelerator = device.kind in ("gpu", "tpu")
    jit_compile = config.jit_compile
    if jit_compile == AUTO:  # on several GPUs, XLA compiles each replica's step apart
        jit_compile = "on" if accelerator else "off"  # (distributed.MultiWorkerModel.compile)
    precision, why = config.precision, ""
    if device.kind == "gpu" and device.count > 1 and jit_compile == "on":
        why = "XLA compiles each GPU's step; the all-reduce and the update run outside it"
    if precision == AUTO:
        if device.has_bfloat16 and (accelerator or jit_compile == "off"):
            precision = "mixed_bfloat16"  # XLA:CPU multiplies bfloat16 slower than float32
        elif device.kind == "gpu":
            precision = "mixed_float16"
        else:
            precision = "float32"
        if device.kind == "cpu" and jit_compile == "off":
            why = bfloat16_reason(device.cpu_flags, device.matmul_flops)
    length_buckets = config.length_buckets
    if not length_buckets and accelerator:
        length_buckets = ACCELERATOR_LENGTH_BUCKETS
    resolved = dataclasses.replace(config, jit_compile=jit_compile, precision=precision,
                                   length_buckets=length_buckets)
    chosen = [f"--{name.replace('_', '-')} {getattr(resolved, name)}"
              for name in ("precision", "jit_compile")
              if getattr(config, name) == AUTO]
    line = f"Training on {device.describe()}"
    if chosen:
        line += f": {', '.join(chosen)} (auto{'; ' + why if why else ''})"
    return resolved, line


def decoding_jit_compile(setting, xla_max_batch_size=None):
    """Whether an export's beam search is compiled with XLA: `setting` "on",
    "off", or "auto" (on when TensorFlow sees a GPU, or when `xla_max_batch_size`
    asks XLA for small requests, also on a CPU)."""
    if setting not in JIT_COMPILE:
        raise ValueError(f"jit_compile must be auto, on or off. Received: {setting!r}")
    if setting == AUTO and xla_max_batch_size is not None:
        return True
    if setting == AUTO:
        import tensorflow as tf

        return bool(tf.config.list_physical_devices("GPU"))
    return setting == "on"


def decoding_precision(setting, jit_compile=False, flags=None, matmul_flops=None):
    """`(precision, reason)` of an export's weights and matrix multiplies:
    `setting` itself, or for "auto" bfloat16 where bfloat16 pays on this CPU
    (`bfloat16_pays`: bfloat16 instructions, and a measured product that runs
    faster) and the search runs without XLA (XLA:CPU multiplies bfloat16 no
    faster than float32), float32 elsewhere, GPUs included
    (`benchmarks/precision_quality.py` measures the quality, equal to float32's
    within noise, and `benchmarks/decode_throughput.py` the speed). `flags` and
    `matmul_flops`: `cpu_flags()` and `measure_cpu_matmuls` of the machine, by
    default this one's."""
    if setting != AUTO:
        return setting, ""
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return "float32", "a GPU is visible"
    flags = cpu_flags() if flags is None else flags
    if not has_bfloat16_instructions(flags):
        return "float32", bfloat16_reason(flags, {})
    if jit_compile:
        return "float32", "XLA on a CPU multiplies bfloat16 no faster"
    matmul_flops = measure_cpu_matmuls(flags) if matmul_flops is None else matmul_flops
    precision = "bfloat16" if bfloat16_pays(flags, matmul_flops) else "float32"
    return precision, bfloat16_reason(flags, matmul_flops)


def decoding_transposed_kernels(flags=None, gpu=None):
    """Whether a search's steps multiply by kernels stored transposed, `x W^T`
    (`Transformer.step_function(transposed_kernels=True)`): on a CPU without
    AVX-512, where oneDNN runs that layout faster, and not with AVX-512 (slower
    there in float32) or on a GPU (benchmarks/decode_throughput.py on each CPU
    kind). `flags`: `cpu_flags()` of the machine that traces the search, and
    `gpu`: whether it has a GPU; by default, this machine's."""
    if gpu is None:
        import tensorflow as tf

        gpu = bool(tf.config.list_physical_devices("GPU"))
    if gpu:
        return False
    flags = cpu_flags() if flags is None else flags
    return bool(flags.get("avx2")) and not flags.get("avx512f")


# At most this many searches side by side by default: a search traced once
# for each way of splitting a request (`serving_search.search_counts`) keeps
# the graph small, and shares of 16ths of a batch are already small.
MAX_AUTO_PARALLEL_SEARCHES = 16


def decoding_parallel_searches(jit_compile, cores=None):
    """How many beam searches an export without XLA splits a request's sentences
    into, run side by side (`DecodingConfig.parallel_searches`): one per core this
    process may run on (`cores`, by default counted here; at most
    `MAX_AUTO_PARALLEL_SEARCHES`), and 1 with XLA (its padded shapes) or where a
    GPU is visible (one large batch keeps it busy).

    On a CPU, TensorFlow runs a search's small matrix products on one thread each
    (oneDNN's products below its L2-cache heuristic) and hands its larger ones to
    the intra-op threads, which the next small op then waits for. With one search
    per core and one intra-op thread, each core runs a search from end to end:
    the float32 base model's search of 32 sentences ran 1.24x faster on a 2-core
    Xeon, bfloat16 1.4x (`benchmarks/decode_throughput.py`)."""
    if jit_compile:
        return 1
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return 1
    return cpu_parallel_searches(cores)


def cpu_parallel_searches(cores=None):
    """`decoding_parallel_searches` on a CPU: one search per core (`cores`, by
    default those this process may run on), at most `MAX_AUTO_PARALLEL_SEARCHES`."""
    return min(available_cores() if cores is None else cores, MAX_AUTO_PARALLEL_SEARCHES)


def available_cores():
    """The cores this process may run on (its affinity, e.g. under taskset)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
