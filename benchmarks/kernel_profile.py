"""Where a training step's GPU time goes: the kernels of a profiled window, summed by
kind, for our step (TensorFlow's profiler, an XSpace `.xplane.pb`) and for PyTorch's
(`torch.profiler`), in one shape so that the two compare line by line.

    python benchmarks/kernel_profile.py RUN.xplane.pb --steps 5   # a TensorFlow profile

`train_throughput.py --profile-steps N` and `torch_transformer.py --profile-steps N`
profile N steps after their timed ones and put `summarize`'s dictionary in their
result as `profile`. Per step:

- `kernel_seconds`: the kernels' durations summed (copies and memsets included);
- `busy_seconds`: the time at least one kernel ran (overlaps on several streams count
  once); against the profiled steps' wall time on the host's clock (`wall_seconds`,
  `busy_share_of_wall`) it says how much of a step the GPU idled, waiting on the host
  (launches, Python, the input; the profiler's own cost is in the wall time too);
- `kinds`: seconds by kind of kernel (`KINDS`, read off the kernel's name);
- `top`: the costliest kernels, with their launches per step and, for XLA, the HLO op
  that launched one of them.

From TensorFlow's profile (`summarize_xspace`, which `train_throughput.py` calls) come
also the host's costliest events per step (`host`).
"""

import argparse
import glob
import json
import os
import re

# The first pattern a kernel's name matches gives its kind. Matrix multiplies: cuBLAS
# (sm90_xmma_gemm..., nvjet_...), CUTLASS, and Triton's or XLA's GEMM fusions. PyTorch's
# Inductor names its kernels triton_poi_ (pointwise), triton_red_ and triton_per_
# (reductions); XLA names its fusions after their root (loop_..._fusion, input_reduce_
# fusion, ...). The optimizer's own kernels are named only where the framework launches
# them apart (PyTorch's fused Adam); under XLA the update is in the fusions.
KINDS = (
    ("copy", r"memcpy|memset|copy_kernel|\bcopy"),
    ("matmul", r"gemm|xmma|nvjet|cutlass|wgmma|cublas|matmul|\bdot\b|_dot_|triton_mm|bmm"),
    ("optimizer", r"adam|multi_tensor"),
    ("reduction", r"reduc|triton_red|triton_per|softmax|norm|\bsum\b|argmax|_max_"),
)


def kind_of(name):
    lowered = name.lower()
    for kind, pattern in KINDS:
        if re.search(pattern, lowered):
            return kind
    return "elementwise"


def busy_seconds(intervals):
    """Seconds covered by at least one of `(start, end)` intervals (in seconds)."""
    covered, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            covered += end - start
            reach = end
        elif end > reach:
            covered += end - reach
            reach = end
    return covered


def summarize(kernels, steps, wall_seconds=None, top=25):
    """`kernels`: (name, start seconds, duration seconds, op or None) of every kernel in
    a window of `steps` steps, which took `wall_seconds` on the host's clock where given;
    the per-step summary described in the module's doc."""
    kernels = list(kernels)
    if steps < 1:
        raise ValueError(f"steps must be at least 1, not {steps}")
    if not kernels:
        return {"steps": steps, "kernels_per_step": 0,
                "note": "no GPU kernels in the profile (a CPU run, or the tracer saw none)"}
    by_name, kinds = {}, {}
    for name, _, duration, op in kernels:
        entry = by_name.setdefault(name, {"seconds": 0.0, "launches": 0, "op": op,
                                          "kind": kind_of(name)})
        entry["seconds"] += duration
        entry["launches"] += 1
        kinds[entry["kind"]] = kinds.get(entry["kind"], 0.0) + duration
    total = sum(kinds.values())
    busy = busy_seconds((s, s + d) for _, s, d, _ in kernels)
    wall = {} if wall_seconds is None else {
        "wall_seconds": round(wall_seconds / steps, 9),
        "busy_share_of_wall": round(busy / wall_seconds, 4)}
    costliest = sorted(by_name.items(), key=lambda item: -item[1]["seconds"])[:top]
    return {
        "steps": steps,
        "kernels_per_step": round(len(kernels) / steps, 1),
        "kernel_seconds": round(total / steps, 9),
        "busy_seconds": round(busy / steps, 9),
        **wall,
        "window_seconds": round((max(s + d for _, s, d, _ in kernels)
                                 - min(s for _, s, _, _ in kernels)) / steps, 9),
        "kinds": {kind: {"seconds": round(seconds / steps, 9),
                         "share": round(seconds / total, 4)}
                  for kind, seconds in sorted(kinds.items(), key=lambda item: -item[1])},
        "top": [{"name": name[:160], "kind": entry["kind"],
                 "seconds": round(entry["seconds"] / steps, 9),
                 "launches": round(entry["launches"] / steps, 1),
                 **({"op": entry["op"]} if entry["op"] else {})}
                for name, entry in costliest],
    }


# Lines of a GPU plane that repeat or annotate its streams' kernels.
DERIVED_LINES = ("XLA Modules", "XLA Ops", "Async XLA Ops", "TensorFlow Ops",
                 "TensorFlow Name Scope", "Framework Name Scope", "Source", "Steps",
                 "XLA TraceMe", "Launch Stats")


def xspace_lines(space):
    """{plane: {line: events}} of an XSpace's GPU planes: what `xspace_kernels` chose
    from."""
    return {plane.name: {line.name: len(line.events) for line in plane.lines}
            for plane in space.planes if plane.name.startswith("/device:GPU:")}


def read_xspace(path):
    try:
        from tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return space


def xspace_kernels(space):
    """The kernels (and copies) that TensorFlow's profiler recorded on the GPUs, from an
    XSpace (`read_xspace`): the events of each GPU plane's stream lines ("Stream #N...")."""
    kernels = []
    for plane in space.planes:
        if not plane.name.startswith("/device:GPU:"):
            continue
        stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        streams = [line for line in plane.lines if line.name.startswith("Stream #")]
        for line in streams or [line for line in plane.lines
                                if line.name not in DERIVED_LINES]:
            for event in line.events:
                meta = plane.event_metadata[event.metadata_id]
                op = None
                for stat in event.stats:
                    if stat_names.get(stat.metadata_id) == "hlo_op":
                        op = stat.str_value or (plane.stat_metadata[stat.ref_value].name
                                                if stat.ref_value else None)
                kernels.append((meta.name or meta.display_name,
                                line.timestamp_ns * 1e-9 + event.offset_ps * 1e-12,
                                event.duration_ps * 1e-12, op))
    return kernels


def host_summary(space, steps, top=12):
    """The host's costliest events in an XSpace (TensorFlow's and XLA's own
    trace events on the host's threads: the function call, XLA's launch of the step's
    kernels, `GpuExecutable::ExecuteThunks`, ...), per step: where the host's time goes.
    Nested events each count their whole length."""
    totals = {}
    for plane in space.planes:
        if not plane.name.startswith("/host:"):
            continue
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                seconds, count = totals.get(name, (0.0, 0))
                totals[name] = (seconds + event.duration_ps * 1e-12, count + 1)
    costliest = sorted(totals.items(), key=lambda item: -item[1][0])[:top]
    return [{"name": name[:160], "seconds": round(seconds / steps, 9),
             "calls": round(count / steps, 1)} for name, (seconds, count) in costliest]


def summarize_xspace(path, steps, wall_seconds=None, top=25):
    """An `.xplane.pb` of `steps` steps, read once: `summarize` of its GPU kernels, with
    the lines they came from (`lines`) and the host's costliest events (`host`)."""
    space = read_xspace(path)
    return {"lines": xspace_lines(space),
            **summarize(xspace_kernels(space), steps, wall_seconds, top),
            "host": host_summary(space, steps)}


def find_xspace(directory):
    """The newest `.xplane.pb` that `tf.profiler.experimental.stop` wrote under `directory`."""
    found = glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True)
    if not found:
        raise FileNotFoundError(f"no .xplane.pb under {directory}")
    return max(found, key=os.path.getmtime)


def torch_kernels(profiler):
    """The CUDA kernels (and copies) of a finished `torch.profiler.profile`."""
    from torch.autograd import DeviceType

    return [(event.name, event.time_range.start * 1e-6,
             (event.time_range.end - event.time_range.start) * 1e-6, None)
            for event in profiler.events() if event.device_type == DeviceType.CUDA]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("xplane", help="a .xplane.pb, or a folder holding one")
    parser.add_argument("--steps", type=int, required=True, help="steps the profile holds")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    path = find_xspace(args.xplane) if os.path.isdir(args.xplane) else args.xplane
    print(json.dumps(summarize_xspace(path, args.steps, top=args.top), indent=2))


if __name__ == "__main__":
    main()
