"""benchmarks/kernel_profile.py: the GPU kernels of a profile summed per step, checked
against sums worked out by hand on a made-up TensorFlow profile (an XSpace with a GPU
plane, the shape TensorFlow's profiler writes) and made-up PyTorch events."""

import json
import os
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)

import kernel_profile  # noqa: E402


@pytest.mark.parametrize("name, kind", [
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "matmul"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float>", "matmul"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "matmul"),
    ("input_reduce_fusion_172", "reduction"),
    ("triton_per_fused_add_native_layer_norm_3", "reduction"),
    ("triton_poi_fused_native_dropout_relu_view_20", "elementwise"),
    ("loop_add_subtract_fusion_145", "elementwise"),
    ("Memset 3", "copy"),
    ("MemcpyD2D", "copy"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdam>", "optimizer"),
])
def test_kind_of_reads_the_kernel_name(name, kind):
    assert kernel_profile.kind_of(name) == kind


def test_busy_seconds_counts_overlaps_once():
    assert kernel_profile.busy_seconds([]) == 0
    # [0, 2] and [1, 3] overlap: 3 s; [5, 6] apart: 1 s; [5.2, 5.5] inside it.
    assert kernel_profile.busy_seconds([(1, 3), (0, 2), (5, 6), (5.2, 5.5)]) == pytest.approx(4)


def write_xspace(path):
    """Two steps on a GPU: each a GEMM (3 us, stream 7), a fusion (1 us, stream 7)
    and a memset (0.5 us, stream 9, overlapping the GEMM); the derived "XLA Ops" line
    repeats the GEMMs and a CPU plane holds host events, both to be left out."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    host = space.planes.add(name="/host:CPU")
    host.event_metadata[1].name = "EagerExecute"
    host.lines.add(name="python3").events.add(metadata_id=1, duration_ps=10**9)
    gpu = space.planes.add(name="/device:GPU:0")
    for key, name in ((1, "nvjet_sm90_tst_256x128_h_bz_NNT"), (2, "loop_add_fusion_3"),
                      (3, "Memset 3")):
        gpu.event_metadata[key].id, gpu.event_metadata[key].name = key, name
    gpu.stat_metadata[1].id, gpu.stat_metadata[1].name = 1, "hlo_op"
    compute = gpu.lines.add(name="Stream #7(Compute)", timestamp_ns=1000)
    copies = gpu.lines.add(name="Stream #9(Memset)", timestamp_ns=1000)
    derived = gpu.lines.add(name="XLA Ops", timestamp_ns=1000)
    us = 10**6  # picoseconds
    for step in range(2):
        start = step * 10 * us
        gemm = compute.events.add(metadata_id=1, offset_ps=start, duration_ps=3 * us)
        gemm.stats.add(metadata_id=1, str_value="custom-call.7")
        compute.events.add(metadata_id=2, offset_ps=start + 4 * us, duration_ps=us)
        copies.events.add(metadata_id=3, offset_ps=start + us, duration_ps=us // 2)
        derived.events.add(metadata_id=1, offset_ps=start, duration_ps=3 * us)
    with open(path, "wb") as f:
        f.write(space.SerializeToString())


def test_an_xspaces_gpu_streams_summed_per_step(tmp_path):
    path = tmp_path / "plugins" / "profile" / "run" / "host.xplane.pb"
    path.parent.mkdir(parents=True)
    write_xspace(str(path))
    assert kernel_profile.find_xspace(str(tmp_path)) == str(path)
    space = kernel_profile.read_xspace(str(path))
    kernels = kernel_profile.xspace_kernels(space)
    assert len(kernels) == 6  # the derived line's and the host's events left out
    first = min(kernels, key=lambda kernel: kernel[1])
    assert first[0] == "nvjet_sm90_tst_256x128_h_bz_NNT" and first[3] == "custom-call.7"
    assert first[1] == pytest.approx(1000e-9) and first[2] == pytest.approx(3e-6)
    assert kernel_profile.xspace_lines(space) == {
        "/device:GPU:0": {"Stream #7(Compute)": 4, "Stream #9(Memset)": 2, "XLA Ops": 2}}

    summary = kernel_profile.summarize(kernels, steps=2, wall_seconds=40e-6)
    assert summary["kernels_per_step"] == 3
    assert summary["kernel_seconds"] == pytest.approx(4.5e-6)  # 3 + 1 + 0.5 us
    assert summary["busy_seconds"] == pytest.approx(4e-6)  # the memset under the GEMM
    assert summary["wall_seconds"] == pytest.approx(20e-6)
    assert summary["busy_share_of_wall"] == pytest.approx(0.2)
    assert summary["window_seconds"] == pytest.approx(7.5e-6)  # 0 to 15 us over 2 steps
    assert summary["kinds"] == {
        "matmul": {"seconds": pytest.approx(3e-6), "share": pytest.approx(3 / 4.5, abs=1e-4)},
        "elementwise": {"seconds": pytest.approx(1e-6), "share": pytest.approx(1 / 4.5, abs=1e-4)},
        "copy": {"seconds": pytest.approx(0.5e-6), "share": pytest.approx(0.5 / 4.5, abs=1e-4)}}
    assert [item["name"] for item in summary["top"]] == [
        "nvjet_sm90_tst_256x128_h_bz_NNT", "loop_add_fusion_3", "Memset 3"]
    assert summary["top"][0]["launches"] == 1 and summary["top"][0]["op"] == "custom-call.7"
    assert "op" not in summary["top"][1]


def test_the_hosts_events_summed_per_step(tmp_path):
    path = str(tmp_path / "a.xplane.pb")
    write_xspace(path)  # one host event of 1 ms in the 2 steps
    assert kernel_profile.host_summary(kernel_profile.read_xspace(path), steps=2) == [
        {"name": "EagerExecute", "seconds": pytest.approx(0.5e-3), "calls": 0.5}]


def test_a_profile_read_once_and_summed_from_the_command_line(tmp_path, monkeypatch, capsys):
    """`summarize_xspace` (what train_throughput.py calls) and the command line, which
    names a folder: the kernels' summary, the lines and the host's events together;
    `--top` bounds the kernels listed and is no wall time."""
    path = tmp_path / "plugins" / "profile" / "run" / "host.xplane.pb"
    path.parent.mkdir(parents=True)
    write_xspace(str(path))
    summary = kernel_profile.summarize_xspace(str(path), steps=2, wall_seconds=40e-6)
    assert summary["kernel_seconds"] == pytest.approx(4.5e-6)
    assert summary["wall_seconds"] == pytest.approx(20e-6)
    assert set(summary["lines"]["/device:GPU:0"]) == {
        "Stream #7(Compute)", "Stream #9(Memset)", "XLA Ops"}
    assert [event["name"] for event in summary["host"]] == ["EagerExecute"]
    monkeypatch.setattr(sys, "argv", ["kernel_profile.py", str(tmp_path), "--steps", "2",
                                      "--top", "2"])
    kernel_profile.main()
    printed = json.loads(capsys.readouterr().out)
    assert [item["name"] for item in printed["top"]] == [
        "nvjet_sm90_tst_256x128_h_bz_NNT", "loop_add_fusion_3"]
    assert "wall_seconds" not in printed and printed["busy_seconds"] == pytest.approx(4e-6)


def test_a_gpu_plane_without_stream_lines_keeps_its_own_lines(tmp_path):
    """Older or newer profilers may name their lines otherwise: every line but the
    known derived ones is read then."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    gpu = space.planes.add(name="/device:GPU:0")
    gpu.event_metadata[1].name = "input_reduce_fusion"
    gpu.lines.add(name="Compute").events.add(metadata_id=1, duration_ps=2 * 10**6)
    gpu.lines.add(name="Steps").events.add(metadata_id=1, duration_ps=9 * 10**6)
    path = tmp_path / "a.xplane.pb"
    path.write_bytes(space.SerializeToString())
    [(name, _, seconds, op)] = kernel_profile.xspace_kernels(
        kernel_profile.read_xspace(str(path)))
    assert (name, op) == ("input_reduce_fusion", None) and seconds == pytest.approx(2e-6)


def test_torch_events_on_the_gpu_only():
    """torch.profiler's events (times in microseconds): its CUDA kernels, not the CPU
    side's operators."""
    from torch.autograd import DeviceType

    def event(name, device_type, start, end):
        return types.SimpleNamespace(name=name, device_type=device_type,
                                     time_range=types.SimpleNamespace(start=start, end=end))

    profiler = types.SimpleNamespace(events=lambda: [
        event("aten::mm", DeviceType.CPU, 0, 50),
        event("nvjet_sm90_gemm", DeviceType.CUDA, 10, 40),
        event("triton_poi_fused_relu_0", DeviceType.CUDA, 40, 45)])
    kernels = kernel_profile.torch_kernels(profiler)
    assert [(name, pytest.approx(start), pytest.approx(seconds), op)
            for name, start, seconds, op in kernels] == [
        ("nvjet_sm90_gemm", 10e-6, 30e-6, None), ("triton_poi_fused_relu_0", 40e-6, 5e-6, None)]
    summary = kernel_profile.summarize(kernels, steps=1)
    assert summary["busy_seconds"] == pytest.approx(35e-6)
    assert "wall_seconds" not in summary


def test_a_profile_without_kernels_says_so():
    summary = kernel_profile.summarize([], steps=3)
    assert summary["kernels_per_step"] == 0 and "no GPU kernels" in summary["note"]
    with pytest.raises(ValueError, match="at least 1"):
        kernel_profile.summarize([], steps=0)
