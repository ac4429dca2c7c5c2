"""benchmarks/train_throughput.py and its PyTorch comparator: the MFU peak logic and
the FLOP count as pure functions, and the scripts' JSON (speed targets are met in
benchmark runs, never in tests)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)

import machine  # noqa: E402
import train_throughput  # noqa: E402

from keras_transformer.config import TransformerConfig  # noqa: E402
from tests import python_path  # noqa: E402

# The tiny preset with a 300-id vocabulary: 2 + 2 layers, d_model 64, 4 heads, d_ff 256.
# Shared embedding 300 x 64; per attention 4 projections of 64 x 64 and a bias of 64;
# feed-forward 64 x 256 + 256 and 256 x 64 + 64; layer norms 2 x 64; an encoder layer
# has one attention and 2 norms, a decoder layer two and 3; post-norm, no final norms.
TINY_300_PARAMETERS = (300 * 64
                       + 2 * (4 * (64 * 64 + 64) + (64 * 256 + 256 + 256 * 64 + 64) + 2 * 128)
                       + 2 * (8 * (64 * 64 + 64) + (64 * 256 + 256 + 256 * 64 + 64) + 3 * 128))


def run_script(*arguments, timeout=600):
    command = [sys.executable, *arguments]
    env = dict(os.environ, PYTHONPATH=python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


# === Peaks and MFU, pure ===


@pytest.mark.parametrize("name, gpu", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
    ("NVIDIA H100 NVL", "NVIDIA H100 NVL"),
    ("NVIDIA H200", "NVIDIA H200"),
    ("NVIDIA H200 NVL", "NVIDIA H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM"),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 PCIe"),
    ("NVIDIA L4", "NVIDIA L4"),
    ("Tesla V100-SXM2-16GB", "NVIDIA V100 SXM2"),
    ("Tesla V100-PCIE-32GB", "NVIDIA V100 PCIe"),
    ("Tesla V100S-PCIE-32GB", "NVIDIA V100S PCIe"),
    ("NVIDIA L40S", None),  # not an L4
    ("NVIDIA GH200 480GB", None),  # not an H200
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", None),  # a slice: a fraction of the peak
    ("NVIDIA H100", None),  # SXM or PCIe: the name does not say
    ("NVIDIA GeForce RTX 4090", None),
    ("", None),
])
def test_datasheet_gpu_by_device_name(name, gpu):
    assert machine.datasheet_gpu(name) == gpu


def test_datasheet_peak_by_dtype():
    h100 = "NVIDIA H100 80GB HBM3"
    assert machine.datasheet_peak(h100, "bfloat16") == {
        "flops": 989e12, "source": "datasheet: NVIDIA H100 SXM bf16 dense"}
    assert machine.datasheet_peak(h100, "bf16")["flops"] == 989e12
    assert machine.datasheet_peak(h100, "float16")["flops"] == 989e12
    assert machine.datasheet_peak(h100, "tf32") == {
        "flops": 494.5e12, "source": "datasheet: NVIDIA H100 SXM tf32 dense"}
    assert machine.datasheet_peak(h100, "float32")["flops"] == 67e12
    assert machine.datasheet_peak("NVIDIA H100 PCIe", "tf32")["flops"] == 378e12
    assert machine.datasheet_peak("NVIDIA A100-SXM4-40GB", "bfloat16")["flops"] == 312e12
    assert machine.datasheet_peak("NVIDIA L4", "float32")["flops"] == pytest.approx(30.3e12)
    # A V100 has no bfloat16 or TF32 path; unknown GPUs and dtypes have no figure.
    assert machine.datasheet_peak("Tesla V100-SXM2-16GB", "bfloat16") is None
    assert machine.datasheet_peak("Tesla V100-SXM2-16GB", "float16")["flops"] == 125e12
    assert machine.datasheet_peak("NVIDIA GeForce RTX 4090", "bfloat16") is None
    assert machine.datasheet_peak(h100, "int8") is None


def test_gpu_matmul_dtype():
    assert machine.gpu_matmul_dtype("float32", True, (9, 0)) == "tf32"
    assert machine.gpu_matmul_dtype("float32", True, (8, 0)) == "tf32"
    assert machine.gpu_matmul_dtype("float32", False, (9, 0)) == "float32"
    assert machine.gpu_matmul_dtype("float32", True, (7, 0)) == "float32"  # V100
    assert machine.gpu_matmul_dtype("bfloat16", True, (9, 0)) == "bfloat16"


def test_mfu_arithmetic():
    # 3e12 FLOPs a step at 0.01 s a step is 300 TFLOP/s: 0.3034 of 989 TFLOP/s.
    assert machine.mfu(3e12, 0.01, 989e12) == pytest.approx(300 / 989)
    peaks = {"measured": {"flops": 750e12, "source": "measured: x"},
             "datasheet": machine.datasheet_peak("NVIDIA H100 80GB HBM3", "bf16")}
    fields = machine.mfu_fields(3e12, 0.01, peaks)
    assert fields == {"peak": {"flops": 989 * 10**12,
                               "source": "datasheet: NVIDIA H100 SXM bf16 dense"},
                      "mfu": 0.3033, "mfu_measured": 0.4, "mfu_datasheet": 0.3033}
    # Without a datasheet figure (the CPU, an unknown GPU): the measured peak.
    fields = machine.mfu_fields(3e9, 0.1, {"measured": {"flops": 1.5e11, "source": "m"},
                                           "datasheet": None})
    assert fields == {"peak": {"flops": 150 * 10**9, "source": "m"}, "mfu": 0.2,
                      "mfu_measured": 0.2}


def test_tensorflow_peaks_on_a_gpu_names_datasheet_and_measurement(monkeypatch):
    calls = []
    monkeypatch.setattr(machine, "gpu_matmul_peak",
                        lambda dtype, jit_compile, size, chain: calls.append(
                            (dtype, jit_compile, size, chain)) or 400e12)
    device = {"type": "GPU", "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
              "tensor_float_32": True}
    peaks = machine.tensorflow_peaks(device, "float32", jit_compile=True)
    assert calls == [("float32", True, 8192, 16)]
    assert peaks == {
        "measured": {"flops": 400e12,
                     "source": "measured: 8192^3 tf32 matmul (x16 chained), XLA"},
        "datasheet": {"flops": 494.5e12, "source": "datasheet: NVIDIA H100 SXM tf32 dense"}}
    peaks = machine.tensorflow_peaks(dict(device, name="NVIDIA RTX A6000"), "bfloat16",
                                     jit_compile=False)
    assert peaks["datasheet"] is None
    assert peaks["measured"]["source"] == (
        "measured: 8192^3 bfloat16 matmul (x16 chained), TensorFlow kernels")
    assert machine.primary_peak(peaks) is peaks["measured"]


def test_gpu_matmul_peak_chain_runs():
    """The GPU measurement's code, on whatever device TensorFlow places it (the CPU
    here), at a small size."""
    assert machine.gpu_matmul_peak("float32", jit_compile=False, size=64, chain=3,
                                   repeats=2) > 0


def test_cpu_flags_keeps_its_fields():
    assert {"model_name", "cpus", "avx2", "avx512f", "avx512_bf16", "amx",
            "amx_flags"} <= set(machine.cpu_flags())


# === FLOPs, pure ===


def test_forward_flops_closed_form():
    """tiny (2 + 2 layers, d 64, 4 heads of 16, d_ff 256), vocabulary 300, 2 rows of
    3 source and 5 target tokens; 2 FLOPs a multiply-add."""
    config = TransformerConfig.preset("tiny", vocab_size=300)
    source_tokens, target_tokens = 2 * 3, 2 * 5
    encoder_layer = (
        4 * 2 * source_tokens * 64 * 64  # Q, K, V, O projections: 196608
        + 2 * (2 * 2 * 4 * 3 * 3 * 16)  # Q K^T and weights x V, 4 heads: 4608
        + 2 * 2 * source_tokens * 64 * 256)  # feed-forward: 393216
    decoder_layer = (
        4 * 2 * target_tokens * 64 * 64  # self-attention projections: 327680
        + 2 * (2 * 2 * 4 * 5 * 5 * 16)  # its scores and weighted sum: 12800
        + 2 * 2 * target_tokens * 64 * 64  # cross-attention Q and O: 163840
        + 2 * 2 * source_tokens * 64 * 64  # its K and V, from the encoder output: 98304
        + 2 * (2 * 2 * 4 * 5 * 3 * 16)  # its scores and weighted sum: 7680
        + 2 * 2 * target_tokens * 64 * 256)  # feed-forward: 655360
    logits = 2 * target_tokens * 64 * 300  # 384000
    assert (encoder_layer, decoder_layer) == (594432, 1265664)
    expected = 2 * (encoder_layer + decoder_layer) + logits
    assert expected == 4104192
    assert train_throughput.forward_flops(config, 2, 3, 5) == expected


# === The comparator's model (fast; in a subprocess, so that PyTorch and TensorFlow
# never share a process). PyTorch is in the test extra, so CI runs these. ===


def run_torch_code(code):
    """`code`'s JSON on stdout, run with PyTorch in its own process."""
    prelude = f"import json, sys; sys.path.insert(0, {BENCHMARKS!r}); import torch\n"
    result = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                            capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, PYTHONPATH=python_path(ROOT)))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_torch_model_has_our_parameter_count():
    counts = run_torch_code("""
        import torch_transformer
        from keras_transformer.config import TransformerConfig
        counts = {}
        for preset in ("tiny", "cpu-medium"):
            model = torch_transformer.build_model(
                TransformerConfig.preset(preset, vocab_size=300), max_length=16)
            logits = model(torch.randint(4, 300, (2, 7)), torch.randint(4, 300, (2, 5)))
            counts[preset] = [torch_transformer.count_parameters(model), list(logits.shape)]
        print(json.dumps(counts))
    """)
    assert TINY_300_PARAMETERS == 252672
    # Tied: the output projection is the embedding (untied: 300 x 64 more).
    assert counts["tiny"] == [TINY_300_PARAMETERS, [2, 5, 300]]
    # Pre-norm (cpu-medium: 2 + 2 layers of 256, d_ff 1024): a final norm after each
    # stack, as ours.
    d = 256
    assert counts["cpu-medium"][0] == (
        300 * d + 2 * (4 * (d * d + d) + (2 * d * 1024 + 1024 + d) + 2 * 2 * d)
        + 2 * (8 * (d * d + d) + (2 * d * 1024 + 1024 + d) + 3 * 2 * d) + 2 * 2 * d)


def test_torch_compile_failure_is_reported():
    report = run_torch_code("""
        import io, contextlib
        import torch_transformer

        def fail(*args, **kwargs):
            raise RuntimeError("no C++ compiler")

        torch.compile = fail
        sys.argv = ["torch_transformer.py", "--model", "tiny", "--vocab-size", "300",
                    "--batch-size", "2", "--length", "4", "--precisions", "float32",
                    "--compile", "on", "--warmup-steps", "1", "--steps", "1", "--device", "cpu"]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            torch_transformer.main()
        print(json.dumps(json.loads(out.getvalue())))
    """)
    [result] = report["results"]
    assert result["status"] == "failed" and result["mode"] == "float32+compile"
    assert result["error"] == "RuntimeError: no C++ compiler"


# === The scripts, end to end ===


@pytest.mark.slow
def test_train_throughput_prints_json():
    report = run_script(os.path.join(BENCHMARKS, "train_throughput.py"),
                        "--model", "tiny", "--vocab-size", "300", "--batch-size", "8",
                        "--length", "16", "--warmup-steps", "1", "--steps", "2",
                        "--xla", "off,on")
    assert report["tokens_per_batch"] == 8 * 16
    assert {"model_name", "avx2", "avx512f", "avx512_bf16", "amx"} <= set(report["machine"])
    assert report["device"]["type"] == "CPU"
    assert set(report["peaks"]) == {"float32/graph", "float32/xla"}
    assert [r["xla"] for r in report["results"]] == [False, True]
    for result in report["results"]:
        assert result["parameters"] == TINY_300_PARAMETERS
        assert len(result["step_seconds"]) == 2
        assert result["target_tokens_per_second"] == pytest.approx(
            128 / result["seconds_per_step"], rel=1e-2)
        assert result["train_flops_per_step"] == 3 * train_throughput.forward_flops(
            TransformerConfig.preset("tiny", vocab_size=300), 8, 16, 16)
        # On the CPU: the matmul measured in this run, with XLA as the step ran or not.
        kernels = "XLA" if result["xla"] else "TensorFlow kernels"
        assert result["peak"]["source"] == f"measured: 2048^3 float32 matmul, {kernels}"
        assert result["peak"] == report["peaks"][
            "float32/xla" if result["xla"] else "float32/graph"]["measured"]
        assert 0 < result["mfu"] < 1 and result["mfu"] == result["mfu_measured"]
        assert "mfu_datasheet" not in result


@pytest.mark.slow
def test_train_throughput_real_batches():
    """train.py's batches of the bundled corpus (a 400-id vocabulary, pairs of up to
    32 tokens: 4 length buckets), 12 steps under XLA after the fixed batch, then
    `model.fit` over 4 an epoch."""
    report = run_script(os.path.join(BENCHMARKS, "train_throughput.py"),
                        "--model", "tiny", "--vocab-size", "400", "--length", "16",
                        "--tokens-per-batch", "256", "--warmup-steps", "1", "--steps", "2",
                        "--xla", "on", "--real-batches", "bundled",
                        "--max-sentence-tokens", "32", "--real-steps", "12", "--fit-steps", "4",
                        timeout=300)
    assert (report["batch_size"], report["tokens_per_batch"]) == (16, 256)
    corpus = report["real_batches"]
    assert corpus["corpus"] == "bundled" and corpus["tokens_per_batch"] == 256
    assert corpus["pairs"] + corpus["pairs_too_long"] == 27687
    assert report["vocab_size"] == corpus["vocab_size"] <= 400
    [result] = report["results"]
    real = result["real_batches"]
    assert real["steps"] == 12 and sum(real["shapes"].values()) == 12
    assert 1 <= real["distinct_shapes"] == len(real["shapes"]) <= 4
    for shape in real["shapes"]:
        rows, source_length, target_length = map(int, shape.split("x"))
        assert rows * source_length <= 256 and source_length in (8, 16, 24, 32)
    # Every shape compiled ahead, as train does; each new shape's first step timed apart
    # (the fixed batch's is 16 x 16 x 16).
    assert real["compile_ahead_seconds"] > 0
    assert real["new_shape_steps"] == len(real["new_shape_first_steps"])
    # ... and not compiled again when it first comes: each such step takes far less
    # than a compilation (compile_ahead's seconds over its shapes, 2 at a time on a
    # 2-core CPU). Stepped with `train_on_batch`, each compiled anew, as long again.
    compilation = real["compile_ahead_seconds"] / (2 * len(corpus["shapes"]))
    assert max(step["seconds"] for step in real["new_shape_first_steps"]) < compilation / 2
    assert real["new_shape_steps"] == real["distinct_shapes"] - ("16x16x16" in real["shapes"])
    assert real["new_shape_seconds"] == pytest.approx(
        sum(step["seconds"] for step in real["new_shape_first_steps"]), abs=0.02)
    assert real["sustained_steps"] == 12 - real["new_shape_steps"] > 0
    assert 0 < real["target_tokens_per_second"] < real["padded_target_tokens_per_second"]
    assert 0 < real["padding_fraction"] < 1
    assert real["real_over_fixed"] == pytest.approx(
        real["target_tokens_per_second"] / result["target_tokens_per_second"], rel=0.01)
    assert 0 < real["mfu"] < 1
    # model.fit over 4 more real batches, without callbacks and with train.py's, and
    # on a twin made as train makes its model (its metrics, its strategy).
    fit = real["fit"]
    assert fit["steps"] == 4 and 0 < fit["target_tokens"] <= 4 * 256
    assert {"token_accuracy", "perplexity", "target_tokens"} <= set(fit["as_train"]["logs"])
    assert "token_accuracy" not in fit["train_callbacks"].get("logs", [])
    assert fit["as_train"]["strategy"] == "_DefaultDistributionStrategy"  # a CPU: no strategy
    for name in ("no_callbacks", "train_callbacks", "as_train"):
        timed = fit[name]
        assert timed["target_tokens_per_second"] == pytest.approx(
            fit["target_tokens"] / (4 * timed["seconds_per_step"]), rel=0.02)
        assert timed["over_real_steps"] == pytest.approx(
            timed["target_tokens_per_second"] / real["target_tokens_per_second"], rel=0.01)


@pytest.mark.slow
def test_compare_torch_adds_speedup():
    """The comparator in its own process at the tiny shape, eager float32 (one thread:
    on a CPU that other processes load, OpenMP's threads can stall each other)."""
    report = run_script(os.path.join(BENCHMARKS, "train_throughput.py"),
                        "--model", "tiny", "--vocab-size", "300", "--batch-size", "8",
                        "--length", "16", "--warmup-steps", "1", "--steps", "3",
                        "--compare-torch", "--torch-compile", "off", "--torch-threads", "1",
                        "--profile-steps", "2", timeout=300)
    torch_report = report["torch"]
    assert torch_report["benchmark"] == "torch_transformer"
    assert (torch_report["batch_size"], torch_report["length"],
            torch_report["vocab_size"]) == (8, 16, 300)
    [ours] = report["results"]
    [torch_run] = torch_report["results"]
    assert torch_run["status"] == "ok" and torch_run["mode"] == "float32"
    assert torch_run["parameters"] == ours["parameters"] == TINY_300_PARAMETERS
    assert torch_run["train_flops_per_step"] == ours["train_flops_per_step"]
    assert torch_run["peak"]["source"].startswith("measured: ")
    assert torch_run["target_tokens_per_second"] == pytest.approx(
        128 / torch_run["seconds_per_step"], rel=1e-2)
    assert ours["torch_compared"] == "float32"
    # --profile-steps: both profiled after their timed steps; on a CPU, no GPU kernels
    # (tests/test_kernel_profile.py sums a GPU profile).
    for profile in (ours["profile"], torch_run["profile"]):
        assert profile["steps"] == 2 and profile["kernels_per_step"] == 0
    assert os.path.exists(ours["profile"]["xplane"]) and ours["profile"]["lines"] == {}
    assert ours["speedup_over_torch"] == pytest.approx(
        ours["target_tokens_per_second"] / torch_run["target_tokens_per_second"], rel=1e-2)
