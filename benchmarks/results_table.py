"""Renders the benchmarks' kept JSON reports as one Markdown table, so that the docs
quote measured files instead of hand-typed figures.

A kept report is the JSON a benchmark printed, unchanged, saved as
`benchmarks/results/<device>/<YYYY-MM-DD>-<name>.json` (device: `cpu`, `gpu`, ...),
beside `<YYYY-MM-DD>-<name>.command`, the one command line that printed it. Each row
gives the date, the benchmark, the machine the report recorded, the command, and the
report's headline figures (the fields in `HEADLINE_FIELDS`, wherever they sit).

    python benchmarks/results_table.py                  # the table, on stdout
    python benchmarks/results_table.py --check docs/benchmarks.md   # the page holds it

`docs/benchmarks.md` holds the table between the two `MARKERS` lines; `--write PAGE`
replaces it there. Imports nothing beyond the standard library.
"""

import argparse
import json
import os
import re
import sys

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
MARKERS = ("<!-- results table: python benchmarks/results_table.py --write docs/benchmarks.md -->",
           "<!-- end results table -->")
FILE_NAME = re.compile(r"^(\d{4}-\d{2}-\d{2})-(.+)\.json$")
# The figures a row shows, by key, in this order, wherever they sit in the report
# (dotted path shown); at most MAX_FIGURES of them.
HEADLINE_FIELDS = (
    "replicas_over_one_device", "speedup_over_one_gpu", "allreduce_share_of_step", "outside_step_share",
    "first_step_seconds", "sustained_target_tokens_per_second", "ours_over_torch",
    "mfu_bf16_datasheet", "first_steps_seconds", "bleu", "sacrebleu", "sentences_per_second", "seconds_per_batch", "seconds_per_step",
    "dispatch_seconds",
    "target_tokens_per_second", "tokens_per_second", "pairs_per_second", "mfu",
    "speedup_over_torch", "ratio", "p50_ms", "p95_ms",
    "graph_over_ctranslate2_float32", "best_ours_graph_over_ctranslate2_int8",
    "best_ours_graph-bfloat16_over_ctranslate2_int8", "step_speedup_bfloat16",
    "step_speedup_onednn_int8", "step_speedup_xla_int8", "first_fit_seconds", "train_step_traces", "train_step_graph_ops", "real_over_fixed", "over_real_steps",
)
MAX_FIGURES = 6
CPU_EXTENSIONS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def find_reports(results_dir=RESULTS_DIR):
    """`(date, device, name, path)` of every kept report, oldest first."""
    reports = []
    for directory, _, files in os.walk(results_dir):
        for file in files:
            match = FILE_NAME.match(file)
            if match:
                device = os.path.relpath(directory, results_dir)
                reports.append((match.group(1), device, match.group(2),
                                os.path.join(directory, file)))
    return sorted(reports)


def machine(report):
    """One line for the machine a report recorded: a GPU's name, or the CPU's
    model, cores and matrix-multiply extensions."""
    for key in ("device", "machine", "cpu_flags"):
        value = report.get(key)
        if isinstance(value, dict) and "model_name" in value:
            cpu = value
            break
    else:
        cpu = {}
    gpu = report.get("gpu")  # benchmarks/gpu_training.py: nvidia-smi's reading
    if isinstance(gpu, dict) and gpu.get("nvidia_smi_name"):
        return gpu["nvidia_smi_name"]
    device = report.get("device") or report.get("machine", {}).get("device")
    if isinstance(device, dict):
        name = device.get("name") or device.get("device_name") or ""
        if "gpu" in str(device.get("type", device.get("kind", ""))).lower() or "NVIDIA" in name:
            return name
    if not cpu:
        return "not recorded"
    extensions = [flag for flag in CPU_EXTENSIONS if cpu.get(flag)] or ["no AVX2"]
    if cpu.get("onednn_max_cpu_isa"):
        extensions.append(f"held to ONEDNN_MAX_CPU_ISA={cpu['onednn_max_cpu_isa']}")
    return f"{cpu['model_name']}, {cpu.get('cpus')} CPUs ({', '.join(extensions)})"


def headline_figures(report):
    """`path = value` for the first `MAX_FIGURES` numbers found under a key of
    `HEADLINE_FIELDS`, searched breadth first (a top-level figure before a nested
    one; in a list of runs, the first run)."""
    found = {}
    level = [("", report)]
    while level:
        deeper = []
        for prefix, node in level:
            if not isinstance(node, dict):
                continue
            for key, value in node.items():
                path = f"{prefix}{key}"
                if key in HEADLINE_FIELDS and isinstance(value, (int, float)) \
                        and not isinstance(value, bool) and key not in found:
                    found[key] = (path, value)
                elif isinstance(value, dict):
                    deeper.append((path + ".", value))
                elif isinstance(value, list) and value and isinstance(value[0], dict):
                    deeper.append((path + "[0].", value[0]))  # a list of runs: the first
        level = deeper
    ordered = [found[key] for key in HEADLINE_FIELDS if key in found][:MAX_FIGURES]
    return ", ".join(f"{path} = {value:g}" for path, value in ordered) or "(none)"


def row(date, device, name, path):
    with open(path) as f:
        report = json.load(f)
    command_path = path[:-len(".json")] + ".command"
    if os.path.exists(command_path):
        with open(command_path) as f:
            command = f"`{f.read().strip()}`"
    else:
        command = "not recorded"
    benchmark = report.get("benchmark", name)
    link = os.path.relpath(path, os.path.dirname(RESULTS_DIR)).replace(os.sep, "/")
    return (f"| {date} | [{benchmark}](../benchmarks/{link}) | {device}: {machine(report)} "
            f"| {command} | {headline_figures(report)} |")


def table(results_dir=RESULTS_DIR):
    """The Markdown table of every kept report."""
    reports = find_reports(results_dir)
    if not reports:
        return "No reports are kept in `benchmarks/results/` yet."
    lines = ["| date | report | machine | command | figures |", "|---|---|---|---|---|"]
    return "\n".join(lines + [row(*report) for report in reports])


def replace_table(text, new_table):
    """`text` with what lies between the two `MARKERS` lines replaced."""
    start, end = (text.index(marker) for marker in MARKERS)
    return text[:start + len(MARKERS[0])] + "\n" + new_table + "\n" + text[end:]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results-dir", default=RESULTS_DIR)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="PAGE", help="replace the table in PAGE")
    group.add_argument("--check", metavar="PAGE",
                       help="exit 1 unless PAGE holds the table as this script renders it")
    args = parser.parse_args(argv)
    rendered = table(args.results_dir)
    if not (args.write or args.check):
        print(rendered)
        return 0
    page = args.write or args.check
    with open(page) as f:
        text = f.read()
    updated = replace_table(text, rendered)
    if args.check:
        if updated != text:
            print(f"{page}: the results table is stale; run python benchmarks/results_table.py "
                  f"--write {page}", file=sys.stderr)
            return 1
        return 0
    with open(page, "w") as f:
        f.write(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
