"""What every benchmark records of the machine it ran on: timings compare only
between runs on the same CPU, and bfloat16 speed depends on its extensions; on a
GPU, the device and the peak that model FLOPs utilization (MFU) is taken against:
the datasheet's dense figure for known GPUs, and a large on-device matmul."""

import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The package's own reading of /proc/cpuinfo (it picks --precision auto by it);
# imports no TensorFlow.
from keras_transformer.hardware import cpu_flags  # noqa: E402,F401
from keras_transformer.hardware import isa_limit  # noqa: E402,F401


# The flag of every benchmark that quiets the libraries (`quiet_libraries`).
VERBOSE_HELP = "show TensorFlow's start-up logs and the libraries' warnings on stderr"


def quiet_libraries():
    """Before TensorFlow starts: keeps the libraries' log lines (TensorFlow's C++
    start-up logs) and unactionable warnings off stderr, as the command lines do,
    unless `--verbose` is on the command line (a flag of every benchmark that calls
    this); the benchmark's own lines pass."""
    from keras_transformer.cli import common  # sets TF_CPP_MIN_LOG_LEVEL=2 unless set

    if "--verbose" not in sys.argv[1:]:
        common.quiet_libraries()


def set_decoding_environment(parallel_searches=1):
    """Sets, unless the environment does, before TensorFlow starts, what the decoding
    commands set (`keras_transformer.cli.common.start_decoding`: oneDNN's kernels on
    every x86 CPU, weights reordered once, and for `parallel_searches` > 1 one
    intra-op thread) and quiets the libraries (`quiet_libraries`); returns those
    settings, for the report."""
    from keras_transformer.cli import common

    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    quiet_libraries()
    common.start_decoding(verbose=True, parallel_searches=parallel_searches)
    return {name.lower(): os.environ[name]
            for name in common.decoding_environment(parallel_searches)}


def require(parser, module, extra, without):
    """Before any timing: ends the benchmark with `parser`'s usage error naming
    how to install `module` (the package's `extra`) or run `without` it, where
    it is not installed, rather than a traceback minutes into the run."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        parser.error(f"{module} is not installed: pip install -e '.[{extra}]' (or "
                     f"bash scripts/setup.sh {extra}), or {without}")


def best_seconds(run, repeats):
    """The fastest of `repeats` timed calls of `run`, after one untimed call
    (tracing, compilation, first-touch allocations)."""
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_peak(dtype, jit_compile=True, size=2048, repeats=10, side_by_side=1):
    """FLOP/s of a square matrix multiply, with XLA or TensorFlow's own kernels
    (oneDNN on a CPU), the best of a few runs; `side_by_side` independent ones at
    once, for a process whose ops run on one thread each (TF_NUM_INTRAOP_THREADS=1).
    Each run copies the products to the host: free on a CPU, but on a GPU that copy
    is most of the time (an H100 read 3.6 to 7.4 TFLOP/s); there, `gpu_matmul_peak`."""
    import tensorflow as tf

    matrices = [tf.cast(tf.random.normal((size, size), dtype=tf.float32), dtype)
                for _ in range(side_by_side)]
    multiply = tf.function(lambda xs: [tf.matmul(x, x) for x in xs], jit_compile=jit_compile)
    seconds = best_seconds(lambda: [p.numpy() for p in multiply(matrices)], repeats)
    return side_by_side * 2 * size**3 / seconds


# === Accelerators: what the device is, and the peak its MFU is measured against ===

# Dense peak TFLOP/s (no structured sparsity: NVIDIA's datasheets print the sparse
# figure, twice these, for the tensor-core rows), at boost clock, by matrix-multiply
# dtype: "fp32" on CUDA cores, "tf32"/"bf16"/"fp16" on tensor cores. A dtype a GPU
# has no tensor-core path for (bf16 and tf32 on a V100) is absent.
DATASHEET_DENSE_TFLOPS = {
    "NVIDIA H100 SXM": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0},
    "NVIDIA H100 PCIe": {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.0},
    "NVIDIA H100 NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "NVIDIA H200": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0},
    "NVIDIA H200 NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "NVIDIA A100 SXM": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "NVIDIA A100 PCIe": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "NVIDIA L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "NVIDIA V100 SXM2": {"fp16": 125.0, "fp32": 15.7},
    "NVIDIA V100 PCIe": {"fp16": 112.0, "fp32": 14.0},
    "NVIDIA V100S PCIe": {"fp16": 130.0, "fp32": 16.4},
}

_DTYPE_KEYS = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16",
               "half": "fp16", "tf32": "tf32", "float32": "fp32", "fp32": "fp32"}


def _word(word, name):
    """Whether `word` is in `name` not as part of a longer name ("h200" is not in
    "gh200", "l4" not in "l40s")."""
    return re.search(rf"(?<![a-z0-9]){word}(?![a-z0-9])", name) is not None


def datasheet_gpu(device_name):
    """The key of `DATASHEET_DENSE_TFLOPS` for a device name as the driver reports
    it (TensorFlow's `get_device_details(...)["device_name"]`, PyTorch's
    `get_device_name()`, nvidia-smi's), or None for a GPU not in the table, a MIG
    slice of one (a fraction of its peak), or a variant the name leaves open.

    >>> datasheet_gpu("NVIDIA H100 80GB HBM3"), datasheet_gpu("NVIDIA H100 PCIe")
    ('NVIDIA H100 SXM', 'NVIDIA H100 PCIe')
    """
    name = (device_name or "").lower()
    if not name or _word("mig", name):
        return None
    if _word("h200", name):
        return "NVIDIA H200 NVL" if "nvl" in name else "NVIDIA H200"
    if _word("h100", name):
        if "pcie" in name:
            return "NVIDIA H100 PCIe"
        if "nvl" in name:
            return "NVIDIA H100 NVL"
        if "hbm3" in name or "sxm" in name:  # "NVIDIA H100 80GB HBM3": the SXM board
            return "NVIDIA H100 SXM"
        return None
    if _word("a100", name):
        return "NVIDIA A100 PCIe" if "pcie" in name else "NVIDIA A100 SXM"
    if _word("l4", name):
        return "NVIDIA L4"
    if _word("v100s", name):
        return "NVIDIA V100S PCIe"
    if _word("v100", name):
        return "NVIDIA V100 PCIe" if "pcie" in name else (
            "NVIDIA V100 SXM2" if "sxm" in name else None)
    return None


def datasheet_peak(device_name, dtype):
    """`{"flops", "source"}`: the datasheet's dense peak of the GPU named
    `device_name` for matrix multiplies in `dtype` (bfloat16/bf16, float16/fp16,
    tf32, float32/fp32), or None when the GPU or that dtype is not in the table."""
    gpu, key = datasheet_gpu(device_name), _DTYPE_KEYS.get(dtype)
    if gpu is None or key is None or key not in DATASHEET_DENSE_TFLOPS[gpu]:
        return None
    return {"flops": DATASHEET_DENSE_TFLOPS[gpu][key] * 1e12,
            "source": f"datasheet: {gpu} {key} dense"}


def gpu_matmul_dtype(compute_dtype, tensor_float_32, compute_capability):
    """The dtype a GPU multiplies `compute_dtype` matrices in: float32 runs as
    "tf32" on tensor cores where the framework allows TF32 (TensorFlow does by
    default) and the GPU has them (compute capability 8.0 on: Ampere, Ada, Hopper)."""
    capability = tuple(compute_capability or (0, 0))
    if compute_dtype == "float32" and tensor_float_32 and capability >= (8, 0):
        return "tf32"
    return compute_dtype


def mfu(flops_per_step, seconds_per_step, peak_flops):
    """Model FLOPs utilization: the step's FLOPs per second over the peak."""
    return flops_per_step / seconds_per_step / peak_flops


def primary_peak(peaks):
    """The peak an `mfu` field is against: the datasheet's where there is one,
    else the measured one. `peaks` is `{"measured": {...}, "datasheet": {...} or None}`."""
    return peaks.get("datasheet") or peaks["measured"]


def mfu_fields(flops_per_step, seconds_per_step, peaks):
    """`peak` (the primary one), `mfu` against it, and `mfu_measured` and
    `mfu_datasheet` against each peak there is, rounded for the JSON."""
    fields = {"peak": {"flops": round(primary_peak(peaks)["flops"]),
                       "source": primary_peak(peaks)["source"]},
              "mfu": round(mfu(flops_per_step, seconds_per_step, primary_peak(peaks)["flops"]), 4)}
    for kind in ("measured", "datasheet"):
        if peaks.get(kind):
            fields[f"mfu_{kind}"] = round(
                mfu(flops_per_step, seconds_per_step, peaks[kind]["flops"]), 4)
    return fields


def nvidia_smi(index=0):
    """Total memory, driver and the driver's CUDA version of GPU `index`, from
    nvidia-smi; {} where it is missing."""
    try:
        query = subprocess.run(
            ["nvidia-smi", f"--id={index}", "--query-gpu=name,memory.total,driver_version",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    if query.returncode:
        return {}
    name, memory, driver = (field.strip() for field in query.stdout.split(",")[:3])
    info = {"nvidia_smi_name": name, "memory_total_mib": int(float(memory)),
            "driver_version": driver}
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", header.stdout)
    if cuda:
        info["driver_cuda_version"] = cuda.group(1)
    return info


def tensorflow_device():
    """The device TensorFlow trains on: the first GPU's name, compute capability,
    TF32 setting and TensorFlow's CUDA/cuDNN build versions (as
    `get_device_details` and `get_build_info` report them), with nvidia-smi's
    memory and driver; or the CPU."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return {"type": "CPU", "name": cpu_flags()["model_name"]}
    details = tf.config.experimental.get_device_details(gpus[0])
    capability = details.get("compute_capability")
    build = tf.sysconfig.get_build_info()
    info = {
        "type": "GPU",
        "name": details.get("device_name", ""),
        "count": len(gpus),
        "compute_capability": ".".join(map(str, capability)) if capability else None,
        "tensor_float_32": tf.config.experimental.tensor_float_32_execution_enabled(),
        "tensorflow_cuda_version": build.get("cuda_version"),
        "tensorflow_cudnn_version": build.get("cudnn_version"),
    }
    info.update(nvidia_smi())
    return info


def gpu_matmul_peak(dtype, jit_compile=True, size=8192, chain=16, repeats=5):
    """FLOP/s of `chain` chained square matrix multiplies on the GPU, the best of
    `repeats` runs: the products stay on the device, and one scalar of the last,
    fetched afterwards, synchronizes (a host copy of a whole matrix, as
    `matmul_peak` makes, would time PCIe instead)."""
    import tensorflow as tf

    with tf.device("/GPU:0"):
        a = tf.cast(tf.random.normal((size, size)), dtype)
        w = tf.cast(tf.random.normal((size, size), stddev=size**-0.5), dtype)

    @tf.function(jit_compile=jit_compile)
    def multiply(x, w):
        for _ in range(chain):
            x = tf.matmul(x, w)
        return x

    def run():
        with tf.device("/GPU:0"):
            return tf.reshape(multiply(a, w), [-1])[0].numpy()

    return 2 * size**3 * chain / best_seconds(run, repeats)


def tensorflow_peaks(device, compute_dtype, jit_compile):
    """`{"measured": {"flops", "source"}, "datasheet": {...} or None}` for steps
    computing in `compute_dtype` with XLA or without: on a GPU, an on-device
    8192-size matmul chain and the datasheet; on the CPU, `matmul_peak`."""
    kernels = "XLA" if jit_compile else "TensorFlow kernels"
    if device["type"] != "GPU":
        size = 2048
        measured = matmul_peak(compute_dtype, jit_compile=jit_compile, size=size)
        return {"measured": {"flops": measured,
                             "source": f"measured: {size}^3 {compute_dtype} matmul, {kernels}"},
                "datasheet": None}
    capability = tuple(int(part) for part in (device["compute_capability"] or "0.0").split("."))
    matmul_dtype = gpu_matmul_dtype(compute_dtype, device["tensor_float_32"], capability)
    size, chain = 8192, 16
    measured = gpu_matmul_peak(compute_dtype, jit_compile=jit_compile, size=size, chain=chain)
    return {"measured": {"flops": measured,
                         "source": f"measured: {size}^3 {matmul_dtype} matmul (x{chain} chained), "
                                   f"{kernels}"},
            "datasheet": datasheet_peak(device["name"], matmul_dtype)}
