"""`export --precision auto`: bfloat16 only where the CPU multiplies it in hardware."""

import pytest

from keras_transformer import hardware

AVX2 = {"avx2": True}
AVX512_BF16 = {"avx2": True, "avx512f": True, "avx512_bf16": True}
AMX = {"avx2": True, "avx512f": True, "avx512_bf16": True, "amx_bf16": True}


@pytest.mark.parametrize("flags, jit_compile, expected", [
    (AVX2, False, ("float32", "this CPU has no bfloat16 instructions")),
    (AVX512_BF16, False, ("bfloat16", "this CPU has AVX512-BF16")),
    (AMX, False, ("bfloat16", "this CPU has AMX")),
    (AMX, True, ("float32", "XLA on a CPU multiplies bfloat16 no faster")),
])
def test_auto_follows_the_cpu_flags(flags, jit_compile, expected, monkeypatch):
    import tensorflow as tf

    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])  # no GPU
    assert hardware.decoding_precision("auto", jit_compile, flags) == expected


def test_an_explicit_precision_is_kept():
    for precision in ("float32", "bfloat16", "float16"):
        assert hardware.decoding_precision(precision, False, AVX2) == (precision, "")
