"""How a benchmark hands over its figures: the JSON report first, to a file and
to stdout, then what is optional (a plot): a finished run's figures are never
lost to a missing package or a failing plot."""

import importlib.util
import json
import os


def write_report(report, out_dir, plot_path, plot, log):
    """Writes `report` to OUT_DIR/report.json and stdout, then calls
    `plot(report, plot_path)`. Without matplotlib, or if the plot fails, one
    line to `log` (the benchmark's, on stderr) says so; `report["plot"]` is the
    plot's path, or None."""
    os.makedirs(out_dir, exist_ok=True)
    can_plot = importlib.util.find_spec("matplotlib") is not None
    report["plot"] = plot_path if can_plot else None
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2), flush=True)
    if not can_plot:
        log("no plot: matplotlib is not installed (pip install matplotlib, or the "
            "package's [benchmarks] extra); the figures are in report.json")
        return
    try:
        plot(report, plot_path)
    except Exception as error:  # noqa: BLE001 (the report is written; the plot is extra)
        log(f"no plot: {type(error).__name__}: {error}; the figures are in report.json")

