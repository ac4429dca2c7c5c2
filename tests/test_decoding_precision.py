"""`export --precision auto`: bfloat16 only where the CPU multiplies it in hardware,
measured faster than float32."""

import pytest

from keras_transformer import hardware

AVX2 = {"avx2": True}
AVX512_BF16 = {"avx2": True, "avx512f": True, "avx512_bf16": True}
AMX = {"avx2": True, "avx512f": True, "avx512_bf16": True, "amx_bf16": True}
# Measured products on 2 cores, FLOP/s: an AMD EPYC Zen 4 and an Intel Xeon with AMX
# (benchmarks/results/cpu/2026-11-25-decode_throughput*.json), and a Xeon whose
# hypervisor hides AMX (`hardware.matmul_flops_per_second`).
ZEN4 = {"float32": 211e9, "bfloat16": 417e9}
XEON_AMX = {"float32": 329e9, "bfloat16": 1323e9}
XEON_HIDDEN_AMX = {"float32": 350e9, "bfloat16": 170e9}


@pytest.mark.parametrize("flags, jit_compile, flops, expected", [
    (AVX2, False, None, ("float32", "this CPU has no bfloat16 instructions")),
    (AVX512_BF16, False, ZEN4, ("bfloat16", "bfloat16 matrix multiplies at 417 GFLOP/s, "
                                            "float32 at 211")),
    (AVX512_BF16, False, XEON_HIDDEN_AMX, ("float32", "bfloat16 matrix multiplies at 170 "
                                                      "GFLOP/s, float32 at 350: bfloat16 does "
                                                      "not pay on this CPU")),
    (AMX, False, XEON_AMX, ("bfloat16", "bfloat16 matrix multiplies at 1323 GFLOP/s, "
                                        "float32 at 329")),
    (AMX, True, XEON_AMX, ("float32", "XLA on a CPU multiplies bfloat16 no faster")),
])
def test_auto_follows_the_measured_speed(flags, jit_compile, flops, expected, monkeypatch):
    import tensorflow as tf

    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])  # no GPU
    # Nothing is measured where the flags or XLA already decide.
    monkeypatch.setattr(hardware, "measure_cpu_matmuls", lambda flags: pytest.fail("measured"))
    assert hardware.decoding_precision("auto", jit_compile, flags, flops) == expected


def test_auto_measures_this_cpu_when_not_told(monkeypatch):
    import tensorflow as tf

    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])  # no GPU
    monkeypatch.setattr(hardware, "measure_cpu_matmuls", lambda flags: XEON_HIDDEN_AMX)
    assert hardware.decoding_precision("auto", False, AVX512_BF16)[0] == "float32"
    monkeypatch.setattr(hardware, "measure_cpu_matmuls", lambda flags: ZEN4)
    assert hardware.decoding_precision("auto", False, AVX512_BF16)[0] == "bfloat16"


def test_an_explicit_precision_is_kept():
    for precision in ("float32", "bfloat16", "float16"):
        assert hardware.decoding_precision(precision, False, AVX2) == (precision, "")
