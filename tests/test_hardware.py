"""`--precision auto` and `--jit-compile auto`: the settings chosen for each device."""

import dataclasses
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from keras_transformer import hardware
from keras_transformer.cli.common import add_config_flags
from keras_transformer.config import TrainingConfig
from tests import python_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

H100 = hardware.Device("gpu", name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0))
EIGHT_H100 = dataclasses.replace(H100, count=8)
V100 = hardware.Device("gpu", name="Tesla V100-SXM2-16GB", compute_capability=(7, 0))
TPU = hardware.Device("tpu", count=8)
# Measured products on 2 cores of the CPUs seen, FLOP/s (tests/test_decoding_precision.py).
AMX = hardware.Device("cpu", cpu_flags={"model_name": "Intel Xeon", "cpus": 2, "avx512f": True,
                                        "avx512_bf16": True, "amx_bf16": True},
                      matmul_flops={"float32": 329e9, "bfloat16": 1323e9})
# An Intel Xeon whose hypervisor hides AMX: bfloat16 at half float32's speed.
HIDDEN_AMX = hardware.Device("cpu", cpu_flags={"model_name": "Intel Xeon", "cpus": 2,
                                               "avx512f": True, "avx512_bf16": True},
                             matmul_flops={"float32": 350e9, "bfloat16": 170e9})
AVX2 = hardware.Device("cpu", cpu_flags={"model_name": "AMD EPYC", "cpus": 2, "avx2": True},
                       matmul_flops={"float32": 129e9})


def chosen(device, **fields):
    config, line = hardware.resolve(TrainingConfig(**fields), device)
    return (config.precision, config.jit_compile, config.length_buckets), line


@pytest.mark.parametrize("device, expected", [
    (H100, ("mixed_bfloat16", "on", hardware.ACCELERATOR_LENGTH_BUCKETS)),
    # each replica's step compiled apart (distributed.MultiWorkerModel.compile)
    (EIGHT_H100, ("mixed_bfloat16", "on", hardware.ACCELERATOR_LENGTH_BUCKETS)),
    (V100, ("mixed_float16", "on", hardware.ACCELERATOR_LENGTH_BUCKETS)),
    (TPU, ("mixed_bfloat16", "on", hardware.ACCELERATOR_LENGTH_BUCKETS)),
    (AMX, ("mixed_bfloat16", "off", 0)),   # oneDNN's bfloat16 matmuls; fine buckets
    (HIDDEN_AMX, ("float32", "off", 0)),   # bfloat16 instructions, but slower
    (AVX2, ("float32", "off", 0)),
])
def test_auto_fits_the_device(device, expected):
    assert chosen(device)[0] == expected


def test_explicit_settings_are_kept():
    assert chosen(H100, precision="float32", jit_compile="off", length_buckets=3)[0] == (
        "float32", "off", 3)
    # XLA:CPU multiplies bfloat16 slower than float32: with XLA asked for, float32.
    assert chosen(AMX, jit_compile="on")[0] == ("float32", "on", 0)
    assert chosen(AVX2, length_buckets=6)[0] == ("float32", "off", 6)


def test_the_line_says_what_auto_chose():
    assert chosen(H100)[1] == ("Training on 1 GPU (NVIDIA H100 80GB HBM3, compute 9.0): "
                               "--precision mixed_bfloat16, --jit-compile on (auto)")
    assert chosen(EIGHT_H100)[1] == (
        "Training on 8 GPUs (NVIDIA H100 80GB HBM3, compute 9.0): --precision mixed_bfloat16, "
        "--jit-compile on (auto; XLA compiles each GPU's step; the all-reduce and the update "
        "run outside it)")
    assert chosen(AVX2, precision="float32")[1] == (
        "Training on CPU (AMD EPYC, 2 cores, avx2): --jit-compile off (auto)")
    assert chosen(AVX2)[1] == (
        "Training on CPU (AMD EPYC, 2 cores, avx2): --precision float32, --jit-compile off "
        "(auto; this CPU has no bfloat16 instructions)")
    assert chosen(HIDDEN_AMX)[1] == (
        "Training on CPU (Intel Xeon, 2 cores, avx512f, avx512_bf16): --precision float32, "
        "--jit-compile off (auto; bfloat16 matrix multiplies at 170 GFLOP/s, float32 at 350: "
        "bfloat16 does not pay on this CPU)")
    held = hardware.Device("cpu", cpu_flags={**AVX2.cpu_flags, "model_name": "Intel Xeon",
                                             "onednn_max_cpu_isa": "AVX2"},
                           matmul_flops=AVX2.matmul_flops)
    assert chosen(held)[1].startswith(
        "Training on CPU (Intel Xeon, 2 cores, avx2, held to ONEDNN_MAX_CPU_ISA=AVX2): "
        "--precision float32")
    one_core = dataclasses.replace(AVX2, cpu_flags={**AVX2.cpu_flags, "cpus": 1})
    assert chosen(one_core, precision="float32")[1] == (
        "Training on CPU (AMD EPYC, 1 core, avx2): --jit-compile off (auto)")
    assert chosen(AMX)[1].endswith(
        "--precision mixed_bfloat16, --jit-compile off (auto; bfloat16 matrix multiplies at "
        "1323 GFLOP/s, float32 at 329)")


@pytest.mark.parametrize("bfloat16, pays", [(1.25 * 300e9, True), (1.24 * 300e9, False)])
def test_bfloat16_pays_from_the_measured_speedup(bfloat16, pays):
    """bfloat16 is taken at BFLOAT16_MIN_SPEEDUP times float32's speed and not below,
    and never without bfloat16 instructions, however fast it measured."""
    assert hardware.BFLOAT16_MIN_SPEEDUP == 1.25
    flops = {"float32": 300e9, "bfloat16": bfloat16}
    assert hardware.bfloat16_pays({"avx512_bf16": True}, flops) is pays
    assert hardware.bfloat16_pays({"amx_bf16": True}, flops) is pays
    assert hardware.bfloat16_pays({"avx2": True, "avx512f": True}, flops) is False
    assert hardware.bfloat16_pays({"avx512_bf16": True}, {"float32": 300e9}) is False
    unmeasured = dataclasses.replace(AMX, matmul_flops={})
    assert chosen(unmeasured)[0][0] == "float32"
    assert chosen(unmeasured)[1].endswith("(auto; bfloat16's speed on this CPU not measured)")
    assert chosen(AVX2, precision="float32", jit_compile="off")[1] == (
        "Training on CPU (AMD EPYC, 2 cores, avx2)")


def test_detect_names_the_strategys_device():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    device = hardware.detect(strategy)
    assert device.kind == "cpu" and device.cpu_flags == hardware.cpu_flags()
    # Measured: float32 always, bfloat16 where the CPU has its instructions.
    expected = {"float32", "bfloat16"} if hardware.has_bfloat16_instructions(
        device.cpu_flags) else {"float32"}
    assert set(device.matmul_flops) == expected
    assert all(1e9 < flops < 1e16 for flops in device.matmul_flops.values())


def test_the_probe_counts_its_products_flops(monkeypatch):
    """`matmul_flops_per_second` is 2 x 1024 x 256 x 4096 FLOPs over the fastest call."""
    import types

    # The deadline; then (check, start, end) for calls of 0.5 and 0.25 s; past the deadline.
    ticks = iter([0.0, 0.1, 0.1, 0.6, 0.6, 0.6, 0.85, 2.0])
    monkeypatch.setattr(hardware, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    assert hardware.matmul_flops_per_second("float32", seconds=1.5) == 2 * 1024 * 256 * 4096 / 0.25


def test_the_probe_times_float32_and_bfloat16_in_turn(monkeypatch):
    """`measure_cpu_matmuls` calls the two products in turn: a load that slows the
    first round (0.2 and 0.1 s) and is gone by the second (0.1 and 0.05 s) leaves
    each its unloaded time, and bfloat16 twice float32's speed. Timed one dtype
    after the other, the load would have fallen on float32's calls alone."""
    import types

    # The deadline, a check; float32's and bfloat16's calls (start, end), loaded; a
    # check; both again, unloaded; past the deadline.
    ticks = iter([0.0, 0.0, 0.0, 0.2, 0.2, 0.3, 0.3, 0.3, 0.4, 0.4, 0.45, 0.7])
    monkeypatch.setattr(hardware, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    flops = hardware.measure_cpu_matmuls({"avx2": True, "avx512f": True, "avx512_bf16": True})
    product = 2 * 1024 * 256 * 4096
    assert flops == {"float32": pytest.approx(product / 0.1),
                     "bfloat16": pytest.approx(product / 0.05)}


def test_jit_compile_flag_and_older_runs():
    import argparse

    parser = argparse.ArgumentParser()
    add_config_flags(parser, TrainingConfig)
    assert parser.parse_args([]).jit_compile == "auto"
    assert parser.parse_args(["--jit-compile"]).jit_compile == "on"
    assert parser.parse_args(["--jit-compile", "off"]).jit_compile == "off"
    # config.json of runs written when jit_compile was a bool.
    assert TrainingConfig(jit_compile=True).jit_compile == "on"
    assert TrainingConfig.from_dict({"jit_compile": False}).jit_compile == "off"
    with pytest.raises(ValueError, match="jit_compile must be auto, on or off"):
        TrainingConfig(jit_compile="yes")
    with pytest.raises(ValueError, match="precision must be auto, float32"):
        TrainingConfig(precision="bf16")
    assert dataclasses.replace(TrainingConfig(), jit_compile="on").jit_compile == "on"


@pytest.mark.parametrize("flags, expected", [
    ({"avx2": True, "avx512f": False}, True),  # oneDNN multiplies x W^T faster there
    ({"avx2": True, "avx512f": True}, False),  # and x W with AVX-512
    ({}, False),  # other CPUs: the kernels as Keras keeps them
])
def test_transposed_kernels_for_decoding_only_without_avx512(flags, expected):
    import tensorflow as tf

    assert hardware.decoding_transposed_kernels(flags, gpu=False) is expected
    assert hardware.decoding_transposed_kernels(flags, gpu=True) is False  # XLA's layouts
    here, gpu = hardware.cpu_flags(), bool(tf.config.list_physical_devices("GPU"))
    assert hardware.decoding_transposed_kernels() is (
        not gpu and here["avx2"] and not here["avx512f"])


def test_parallel_searches_one_per_core_without_xla_on_a_cpu():
    import tensorflow as tf

    assert hardware.decoding_parallel_searches(True, cores=4) == 1  # XLA: its padded shapes
    on_cpu = not tf.config.list_physical_devices("GPU")
    assert hardware.decoding_parallel_searches(False, cores=4) == (4 if on_cpu else 1)
    assert hardware.decoding_parallel_searches(False, cores=96) == (16 if on_cpu else 1)
    assert hardware.decoding_parallel_searches(False) == (
        min(hardware.available_cores(), 16) if on_cpu else 1)
    assert hardware.available_cores() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("settings, measured", [
    ({}, True),                                           # --precision auto, --jit-compile auto
    ({"jit_compile": "on"}, False),                       # XLA: float32 on a CPU, no probe
    ({"precision": "float32"}, False),                    # nothing left to choose
    ({"precision": "float32", "time_budget": 8.0}, False),  # the budget times real steps
    ({"time_budget": 8.0}, True),
])
def test_the_cpu_is_measured_only_where_its_figures_are_used(settings, measured):
    assert hardware.uses_measured_matmuls(TrainingConfig(**settings)) is measured


SAPPHIRE_RAPIDS_FLAGS = ("fpu sse4_1 avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 "
                         "amx_bf16 amx_tile amx_int8")


@pytest.mark.parametrize("limit, extensions", [
    ("", {"avx2", "avx512f", "avx512_bf16", "amx", "amx_bf16"}),
    ("ALL", {"avx2", "avx512f", "avx512_bf16", "amx", "amx_bf16"}),
    ("avx512_core_amx", {"avx2", "avx512f", "avx512_bf16", "amx", "amx_bf16"}),
    ("AVX512_CORE_BF16", {"avx2", "avx512f", "avx512_bf16"}),
    ("AVX512_CORE", {"avx2", "avx512f"}),
    ("AVX2", {"avx2"}),
    ("AVX", set()),
])
def test_flags_are_what_onednn_may_use(tmp_path, limit, extensions):
    """Held by ONEDNN_MAX_CPU_ISA (the AVX2-only CPU's stand-in), an AMX Xeon is
    chosen for as the CPU oneDNN is told it is, and the limit is recorded."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"model name\t: Intel Xeon\nflags\t\t: {SAPPHIRE_RAPIDS_FLAGS}\n"
                       f"\nmodel name\t: Intel Xeon\nflags\t\t: {SAPPHIRE_RAPIDS_FLAGS}\n")
    environ = {"ONEDNN_MAX_CPU_ISA": limit} if limit else {}
    flags = hardware.cpu_flags(environ, cpuinfo=str(cpuinfo))
    assert {name for name in ("avx2", "avx512f", "avx512_bf16", "amx", "amx_bf16")
            if flags[name]} == extensions
    assert flags["amx_flags"] == (["amx_bf16", "amx_int8", "amx_tile"] if "amx" in extensions
                                  else [])
    assert flags.get("onednn_max_cpu_isa") == (limit.upper() or None)
    assert hardware.decoding_transposed_kernels(flags, gpu=False) is (limit == "AVX2")
    assert hardware.has_bfloat16_instructions(flags) is ("avx512_bf16" in extensions)
    assert flags["model_name"] == "Intel Xeon" and flags["cpus"] == hardware.available_cores()


def test_the_cores_are_those_the_process_may_run_on():
    """Pinned to one core (as by `taskset -c 0`), the first line says 1 core, not
    the machine's count."""
    script = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
              "from keras_transformer import hardware; print(hardware.cpu_flags()['cpus'])")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, env=dict(os.environ, PYTHONPATH=python_path(ROOT)))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "1"
