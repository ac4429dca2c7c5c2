"""What every benchmark records of the machine it ran on: timings compare only
between runs on the same CPU, and bfloat16 speed depends on its extensions."""

import os
import platform
import time


def cpu_flags():
    """The CPU's model, cores and matrix-multiply extensions, from /proc/cpuinfo."""
    flags, model = set(), ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags" and not flags:
                    flags = set(value.split())
                elif key.strip() == "model name" and not model:
                    model = value.strip()
    except OSError:
        pass
    return {
        "model_name": model or platform.processor(),
        "cpus": os.cpu_count(),
        "avx2": "avx2" in flags,
        "avx512f": "avx512f" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx": any(flag.startswith("amx") for flag in flags),
        "amx_flags": sorted(flag for flag in flags if flag.startswith("amx")),
    }


def matmul_peak(dtype, jit_compile=True, size=2048, repeats=10):
    """FLOP/s of a square matrix multiply, with XLA or TensorFlow's own kernels
    (oneDNN on a CPU), the best of a few runs."""
    import tensorflow as tf

    a = tf.random.normal((size, size), dtype=tf.float32)
    a = tf.cast(a, dtype)
    multiply = tf.function(lambda x: tf.matmul(x, x), jit_compile=jit_compile)
    multiply(a).numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        multiply(a).numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best
