"""The benchmark scripts run and print the JSON they promise (speed targets are met
in benchmark runs, never in tests)."""

import json
import os
import subprocess
import sys

import pytest

from keras_transformer.cli.common import LIBRARY_LOG_LINE
from tests import python_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_benchmark(command, timeout=900):
    """The JSON report a benchmark's `command` prints, and its finished process; it must
    exit 0 (TensorFlow's C++ start-up logs kept off its stderr)."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                            env=dict(os.environ, PYTHONPATH=python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout), result


@pytest.mark.slow
def test_quality_per_compute_prints_json(tmp_path):
    """Both systems on a small corpus (4000 bundled training pairs, so that the
    vocabularies leave the budget some training), 40 CPU-seconds each."""
    import gzip

    import sacrebleu

    from keras_transformer import data

    sizes = {"train": 4000, "dev": 64, "test": 10}
    for split, size in sizes.items():
        with gzip.open(tmp_path / f"{split}.tsv.gz", "wt", encoding="utf-8") as f:
            for pair in data.load_parallel("bundled", split).take(size).as_numpy_iterator():
                f.write(f"{pair['source'].decode()}\t{pair['target'].decode()}\n")
    budget = 40
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "quality_per_compute.py"),
               "--corpus", str(tmp_path / "{split}.tsv.gz"), "--cpu-seconds", str(budget),
               "--test-pairs", "10", "--out-dir", str(tmp_path / "out")]
    env = dict(os.environ, PYTHONPATH=python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["cpu_seconds_budget"] == budget and report["test_pairs"] == 10
    assert {"avx512f", "avx512_bf16", "amx"} <= set(report["cpu_flags"])
    assert os.path.getsize(report["plot"]) > 0
    references = [pair["target"].decode() for pair in data.load_parallel(
        str(tmp_path / "{split}.tsv.gz"), "test").as_numpy_iterator()]
    assert set(report["systems"]) == {"ours", "keras_hub"}
    for name, system in report["systems"].items():
        with open(system["hypotheses_file"], encoding="utf-8") as f:
            hypotheses = f.read().split("\n")[:-1]
        with open(system["references_file"], encoding="utf-8") as f:
            assert f.read().split("\n")[:-1] == references
        assert len(hypotheses) == 10
        assert system["bleu"] == pytest.approx(
            sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=1e-9)
        assert system["bleu_lowercase"] == pytest.approx(
            sacrebleu.corpus_bleu(hypotheses, [references], lowercase=True).score, abs=1e-9)
        assert system["signature"].startswith("nrefs:1|case:mixed|")
        assert "case:lc" in system["signature_lowercase"]
        assert [s["hypothesis"] for s in system["samples"]] == hypotheses[:3]
        curve = system["curve"]
        seconds = [point["cpu_seconds"] for point in curve]
        assert seconds == sorted(set(seconds)), (name, seconds)  # increasing
        assert [point["steps"] for point in curve] == sorted({p["steps"] for p in curve})
        assert (curve[-1]["cpu_seconds"], curve[-1]["steps"]) == (
            system["cpu_seconds"], system["steps"])
        # Training stops at the first budget check that finds the budget spent:
        # after a batch (keras_hub) or a checkpoint (ours); both count CPU time
        # from the process's start. The check before the stop found it unspent;
        # the stop came once it was (ours' last check may come just before work
        # that ends the epoch, so its whole process is what has spent it).
        checks = system["budget_checks"]
        assert checks["at_stop"] == pytest.approx(system["cpu_seconds"], abs=0.01)
        assert checks["before_stop"] is None or checks["before_stop"] < budget, (name, checks)
        spent = checks["at_stop"] if name == "keras_hub" else system["cpu_seconds_train_process"]
        assert spent >= budget, (name, checks, spent)
        assert system["steps"] >= 1
    keras_hub = report["systems"]["keras_hub"]
    assert keras_hub["decoding_check"]["agree"] == keras_hub["decoding_check"]["sentences"]
    # The example outputs lowercase text (and its special tokens but for [UNK] removed).
    assert all(h == h.lower() for h in
               (s["hypothesis"].replace("[UNK]", "") for s in keras_hub["samples"]))
    ours = report["systems"]["ours"]
    assert ours["config"]["training"]["time_budget_clock"] == "cpu"
    if keras_hub["bleu"]:
        assert report["bleu_ratio"] == pytest.approx(ours["bleu"] / keras_hub["bleu"])


@pytest.mark.slow
def test_resume_time_prints_json():
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "resume_time.py"),
               "--far-step", "1000", "--repeats", "1", "--no-stream-skip"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900,
                            env=dict(os.environ, PYTHONPATH=python_path(ROOT)))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert (report["near"]["step"], report["far"]["step"]) == (10, 1000)
    for side in ("near", "far"):
        [first] = report[side]["seconds_to_first_step"]
        assert 0 < first <= report[side]["process_seconds"][0]
    assert report["far_over_near"] > 0 and "stream_skip_seconds" not in report
    assert "avx512_bf16" in report["machine"]


def test_a_comparison_without_its_engine_stops_before_timing_with_what_to_install(capsys):
    """A missing comparator ends the benchmark at its arguments, naming the
    extra that installs it and the flag that leaves it out."""
    import argparse

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        from machine import require
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    parser = argparse.ArgumentParser(prog="decode_throughput.py")
    require(parser, "json", "benchmarks", "leave out --compare-ctranslate2")  # installed: no-op
    with pytest.raises(SystemExit) as stopped:
        require(parser, "no_such_engine_xyz", "benchmarks", "leave out --compare-ctranslate2")
    assert stopped.value.code == 2
    assert ("decode_throughput.py: error: no_such_engine_xyz is not installed: pip install -e "
            "'.[benchmarks]' (or bash scripts/setup.sh benchmarks), or leave out "
            "--compare-ctranslate2") in capsys.readouterr().err


@pytest.mark.slow
def test_decode_throughput_prints_json():
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "decode_throughput.py"),
               "--preset", "tiny", "--vocab-size", "2000", "--batch-size", "2",
               "--source-length", "8", "--forced-steps", "12",
               "--repeats", "1", "--uncached-repeats", "1", "--compare-ctranslate2",
               "--precisions", "float32,bfloat16"]
    report, _ = run_benchmark(command)
    assert report["config"]["forced_steps"] == 12 and report["config"]["batch_size"] == 2
    assert set(report["machine"]["matmul_peak_flops"]) == {
        "graph-float32", "xla-float32", "graph-bfloat16", "xla-bfloat16"}
    assert report["config"]["precisions"] == ["float32", "bfloat16"]
    for variant in ("graph", "xla", "uncached", "graph-bfloat16", "xla-bfloat16",
                    "uncached-bfloat16"):
        measured = report[variant]
        assert measured["output_length"] == 12  # EOS ignored: every search runs 12 steps
        assert measured["generated_tokens"] == 2 * 12
        assert 0 < measured["mfu"] < 1
        # (seconds_per_batch is rounded to milliseconds; a tiny model's are few)
        assert measured["sentences_per_second"] == pytest.approx(
            2 / measured["seconds_per_batch"], rel=0.2)
    assert report["cached_speedup"] > 0 and report["xla_speedup"] > 0
    for quantization in ("float32", "int8"):  # the same weights in CTranslate2
        measured = report[f"ctranslate2_{quantization}"]
        assert measured["generated_tokens"] >= 2 * 11 and measured["seconds_per_batch"] > 0
    assert report["over_ctranslate2"]["graph_over_ctranslate2_float32"] > 0
    assert report["over_ctranslate2"]["graph-bfloat16_over_ctranslate2_float32"] > 0
    assert 0 < report["profile"]["output_projection_share_of_step"] < 1


@pytest.mark.slow
def test_serving_latency_prints_json(tmp_path):
    """Tiny random model, 8 forced steps a request, requests of 1 and 4 sentences."""
    out = tmp_path / "out"
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "serving_latency.py"),
               "--quick", "--out-dir", str(out)]
    report, _ = run_benchmark(command)
    assert report == json.loads((out / "report.json").read_text())
    assert report["batch_sizes"] == [1, 4] and report["machine"]["device"]["type"] == "CPU"
    assert set(report["engines"]) == {"ours_float32", "ctranslate2_float32", "ctranslate2_int8"}
    for engine in report["engines"].values():
        for size, measured in engine.items():
            # 8 sentences per batch size, at least 2 requests.
            assert measured["requests"] == max(2, 8 // int(size))
            assert 0 < measured["p50_ms"] <= measured["p95_ms"]
            assert measured["sentences_per_second"] > 0 and measured["first_request_ms"] > 0
    # The same weights and settings: CTranslate2 float32 translates as ours does.
    assert report["same_translations_as_ours_float32"]["ctranslate2_float32"] >= 0.95
    assert report["over_ctranslate2"]["ours_float32/ctranslate2_int8"]["4"] > 0
    assert os.path.getsize(report["plot"]) > 0


@pytest.mark.slow
@pytest.mark.parametrize("isa_limit", [None, "AVX2"])
def test_int8_matmul_prints_json(isa_limit):
    """Also held to AVX2 (the AVX2-only CPU's stand-in), where a bfloat16 product
    handed to oneDNN aborted the process: bfloat16 is then left out."""
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "int8_matmul.py"),
               "--rows", "4", "--d-model", "32", "--d-ff", "64", "--vocab-size", "100",
               "--layers", "2", "--repeats", "1", "--min-seconds", "0.01"]
    env = dict(os.environ, PYTHONPATH=python_path(ROOT))
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    if isa_limit:
        env["ONEDNN_MAX_CPU_ISA"] = isa_limit
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    shapes = [(product["shape"], product["per_step"]) for product in report["products"]]
    assert shapes == [([4, 32, 96], 2), ([4, 32, 32], 4), ([4, 32, 32], 2), ([4, 32, 64], 2),
                      ([4, 64, 32], 2), ([4, 32, 100], 1)]
    timed = ["onednn_int8", "xla_int8"]
    if report["machine"]["avx512_bf16"] or report["machine"]["amx_bf16"]:
        timed.append("bfloat16")
    assert isa_limit is None or timed == ["onednn_int8", "xla_int8"]
    assert sorted(report["step_seconds"]) == sorted(["float32"] + timed)
    for product in report["products"]:
        for variant in timed:
            # Per-tensor int8 of Gaussian operands: about 1% off float32, bfloat16
            # about 0.3%. A lost shift (the bias's 128 column sums) or scale is off
            # by far more.
            assert 0 < product[variant]["relative_error"] < 0.03, product
            assert product[variant]["seconds"] > 0
    float32 = sum(p["float32_seconds"] * p["per_step"] for p in report["products"])
    assert abs(report["step_seconds"]["float32"] - float32) < 1e-5
    assert report["step_speedup_onednn_int8"] == pytest.approx(
        report["step_seconds"]["float32"] / report["step_seconds"]["onednn_int8"], rel=1e-2)
    assert report["machine"]["tf_enable_onednn_opts"]
    assert report["machine"].get("onednn_max_cpu_isa") == isa_limit
    assert "cuda" not in result.stderr.lower(), result.stderr[-2000:]


def test_first_fit_prints_json():
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "first_fit.py"),
               "--model", "tiny", "--vocab-size", "300", "--steps", "2"]
    report, _ = run_benchmark(command)
    assert report["first_fit_seconds"] > report["seconds_per_step"] > 0
    # Traced once, with Adam's slots already there (1 + 2 per trainable variable).
    assert report["train_step_traces"] == 1
    assert report["optimizer_variables_at_each_trace"][0] > 1
    assert report["train_step_graph_ops"] > 1000  # the traced step's, not an empty graph
    assert "avx512_bf16" in report["machine"]


@pytest.mark.slow
def test_step_dispatch_prints_json():
    """Each strategy (at each batch size), sync and async; fit and steps_per_execution
    for the first only."""
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "step_dispatch.py"),
               "--model", "tiny", "--vocab-size", "300", "--batch-sizes", "4",
               "--length", "8", "--strategy", "default,one_device", "--steps", "3",
               "--repeats", "1", "--steps-per-execution", "2"]
    report, _ = run_benchmark(command)
    assert [(run["strategy"], run["strategy_class"], run["batch_size"], run["target_tokens"])
            for run in report["runs"]] == [
        ("default", "_DefaultDistributionStrategy", 4, 32),
        ("one_device", "OneDeviceStrategy", 4, 32)]
    for index, run in enumerate(report["runs"]):
        assert run["sync"]["seconds_per_step"] > 0
        # Starting a step takes part of the step, at most all of it (rounding aside).
        assert 0 < run["async"]["dispatch_seconds"] <= run["async"]["seconds_per_step"] + 1e-5
        assert ("fit" in run) == (index == 0)
    first = report["runs"][0]
    assert first["fit"]["seconds_per_step"] > 0
    assert first["fit_steps_per_execution"]["steps_per_execution"] == 2
    assert "avx512_bf16" in report["machine"] and report["device"]["type"] == "CPU"


def test_input_pipeline_prints_json():
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "input_pipeline.py"),
               "--split", "dev", "--vocab-size", "600", "--epochs", "2",
               "--tokens-per-batch", "2000", "--max-sentence-tokens", "64", "--deterministic"]
    report, result = run_benchmark(command)
    assert report["corpus"] == "bundled/dev" and report["pairs"] == 1583
    assert report["pairs_batched"] + report["pairs_too_long"] == report["pairs"]
    assert 0 < report["padding_fraction"] < 1 and 0 <= report["filler_row_fraction"] < 1
    assert report["tokens_per_second"] > 0 and report["settings"]["epochs"] == 2
    assert "avx512_bf16" in report["machine"]
    # TensorFlow's start-up logs kept off stderr (`--verbose` shows them).
    assert LIBRARY_LOG_LINE.search(result.stderr.encode()) is None, result.stderr[-3000:]


@pytest.mark.slow
def test_precision_quality_prints_json(tmp_path, tokenizer, model):
    """A tiny random run, exported in float32 and bfloat16, on 6 test pairs."""
    from tests.translation_fixtures import make_run_dir

    run = make_run_dir(tmp_path / "run", tokenizer, model)
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "precision_quality.py"),
               "--run", str(run), "--limit", "6"]
    report, result = run_benchmark(command)
    assert report["limit"] == 6 and "avx512_bf16" in report["machine"]
    assert list(report["precisions"]) == ["float32", "bfloat16"]
    reference = report["precisions"]["float32"]
    assert reference["identical_to_float32"] == 1.0 and reference["bleu_minus_float32"] == 0
    reduced = report["precisions"]["bfloat16"]
    assert 0 <= reduced["identical_to_float32"] <= 1
    assert reduced["bleu_minus_float32"] == pytest.approx(reduced["bleu"] - reference["bleu"],
                                                          abs=0.011)
    assert reduced["within_0.3_bleu"] == (abs(reduced["bleu_minus_float32"]) <= 0.3)
    assert reduced["signature"].startswith("nrefs:1|case:mixed|")
    # The benchmark's own lines on stderr, the libraries' log lines off it.
    assert "float32: BLEU" in result.stderr and "bfloat16: BLEU" in result.stderr
    assert LIBRARY_LOG_LINE.search(result.stderr.encode()) is None, result.stderr[-3000:]


@pytest.mark.slow
def test_recipe_curves_prints_json(tmp_path):
    """One tiny recipe for a few seconds: its curve is its kept checkpoints, each
    at the step, CPU-seconds and sacreBLEU of its own. A minute and a checkpoint
    every 4 steps: start-up, the vocabulary and the 20 timed steps took 18 s of a busy
    2-core Xeon, so that a budget of 18 s ended at its first checkpoint, and 28 s of
    an AMX-hidden Xeon running other tests beside it, where half a minute did too."""
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "recipe_curves.py"),
               "--recipes", "600/256/0/0.5", "--minutes", "1", "--dev-pairs", "5",
               "--curve-points", "2", "--precision", "float32", "--out-dir",
               str(tmp_path / "out"), "--train-flags",
               "--model tiny --vocab-sentences 4000 --max-sentence-tokens 24 "
               "--checkpoint-every 4"]
    env = dict(os.environ, PYTHONPATH=python_path(ROOT))
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not any(LIBRARY_LOG_LINE.match(line.encode())
                   for line in result.stderr.splitlines()), result.stderr[-3000:]
    report = json.loads(result.stdout)
    record = report["recipes"]["600/256/0/0.5"]
    assert (record["vocab_size"], record["tokens_per_batch"], record["dropout_rate"],
            record["learning_rate_scale"]) == (600, 256, 0.0, 0.5)
    with open(tmp_path / "out" / "600-256-0-0.5" / "run" / "config.json") as f:
        config = json.load(f)
    assert config["model"]["dropout_rate"] == 0.0 and config["training"]["vocab_size"] == 600
    # The recipe's peak (scale 0.5 at the default warm-up of 300), over the planned warm-up.
    training = config["training"]
    assert training["warmup_steps"] != 300
    assert training["learning_rate_scale"] == pytest.approx(
        0.5 * (training["warmup_steps"] / 300) ** 0.5, rel=1e-6)
    steps = [point["steps"] for point in record["curve"]]
    assert len(steps) == 2 and steps == sorted(steps) and steps[-1] == record["steps"]
    assert all(0 <= point["bleu"] <= 100 for point in record["curve"])
    assert {"avx2", "avx512f"} <= set(report["cpu_flags"])



@pytest.mark.slow
def test_gpu_training_reads_the_runs_as_their_logs_say(tmp_path):
    """benchmarks/gpu_training.py on a CPU with a tiny model: a cold run that ends,
    then the same command (a resume with nothing left to train)."""
    import csv
    import statistics

    command = [sys.executable, os.path.join(ROOT, "benchmarks", "gpu_training.py"),
               "--model", "tiny", "--vocab-size", "500", "--tokens-per-batch", "1000",
               "--steps", "60", "--checkpoint-every", "20", "--cold-seconds", "300",
               "--warm-seconds", "120", "--torch-steps", "0", "--work-dir", str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    cold, warm = report["cold"], report["warm"]
    assert cold["returncode"] == 0 and cold["stopped_after_seconds"] is None
    assert 0 < cold["first_step_seconds"] <= cold["progress"][0]["seconds"]
    assert [item["line"].split()[1] for item in cold["progress"]] == ["20/60", "40/60", "60/60"]
    assert cold["shapes"] and 0 < cold["padding"]["target"] < 1
    assert any(line.startswith("Resuming ") for line in warm["summary"])
    with open(tmp_path / "run" / "log.csv") as f:
        rows = list(csv.DictReader(f))
    rates = [float(row["target_tokens_per_second"]) for row in rows]
    assert len(rates) == 3 and report["intervals"]["warm"] == []
    # Whether the run learns: each interval's training and dev loss, as log.csv has them.
    assert [(item["loss"], item["val_loss"]) for item in report["intervals"]["cold"]] == [
        (round(float(row["loss"]), 4), round(float(row["val_loss"]), 4)) for row in rows]
    assert report["sustained_target_tokens_per_second"] == statistics.median(rates[1:])
    # Where a steady interval's wall clock went, from log.csv's times: the parts add up.
    assert all(float(row["median_step_seconds"]) > 0 and float(row["dev_pass_seconds"]) > 0
               and float(row["checkpoint_seconds"]) > 0 for row in rows)
    walls = [float(b["elapsed_seconds"]) - float(a["elapsed_seconds"])
             for a, b in zip(rows[1:], rows[2:])]
    split = report["interval_split_seconds"]
    assert split["wall"] == pytest.approx(statistics.median(walls), abs=1e-3)
    assert split["steps"] == pytest.approx(
        20 * statistics.median(float(row["median_step_seconds"]) for row in rows[2:]), abs=1e-3)
    assert 0 < split["steps"] < split["wall"] and split["dev_pass"] > 0
    assert split["steps_by_mean"] == pytest.approx(
        20 * statistics.median(float(row["mean_step_seconds"]) for row in rows[2:]), abs=1e-3)
    assert 0 < split["slowest_step"] < split["wall"]
    assert split["wall"] == pytest.approx(
        split["steps"] + split["dev_pass"] + split["checkpoint"] + split["between"], abs=5e-3)


@pytest.mark.slow
def test_allreduce_times_the_replicas_against_one_device():
    """benchmarks/allreduce.py over 2 logical CPUs, the tiny model, steps with XLA
    (each replica's compiled apart) and without; its projection adds up."""
    import keras_transformer as kt

    command = [sys.executable, os.path.join(ROOT, "benchmarks", "allreduce.py"),
               "--model", "tiny", "--vocab-size", "300", "--tokens-per-batch", "512",
               "--length", "16", "--precision", "float32", "--steps", "2",
               "--reduce-repeats", "3", "--xla", "both"]
    report, _ = run_benchmark(command)
    parameters = kt.build_transformer(kt.TransformerConfig.tiny(300)).count_params()
    assert report["allreduce"]["bytes"] == 4 * parameters  # float32 gradients
    assert report["global_batch"] == [32, 16] and report["logical_devices"] == ["/cpu:0", "/cpu:1"]
    steps = report["steps"]
    assert set(steps) == {f"{name}{xla}" for xla in ("", "_xla") for name in
                          ("2_replicas", "one_device", "one_device_4_rows", "one_device_16_rows")}
    for name, step in steps.items():
        assert step["target_tokens_per_second"] == pytest.approx(
            step["rows"] * 16 / step["seconds_per_step"], rel=1e-3)
    assert report["replicas_over_one_device"] == pytest.approx(
        steps["2_replicas_xla"]["seconds_per_step"] / steps["one_device_xla"]["seconds_per_step"],
        rel=1e-2)
    assert report["update"]["variables"] == len(kt.build_transformer(
        kt.TransformerConfig.tiny(300)).trainable_weights)
    update = report["update"]["seconds"]
    assert 0 < update < steps["one_device"]["seconds_per_step"]  # the step holds an update
    assert 0 < report["update"]["uncompiled_seconds"] < steps["one_device"]["seconds_per_step"]
    card = report["on_one_card"]
    assert card["added_seconds"] == pytest.approx(
        steps["2_replicas_xla"]["seconds_per_step"]
        - 2 * steps["one_device_16_rows_xla"]["seconds_per_step"], abs=2e-5)
    projection = report["projection"]
    assert projection["xla"] is True
    # A ring over 8 GPUs moves 2 x 7/8 of the gradient bytes over each link.
    ring = 1.75 * 4 * parameters / 450e9
    one_gpu = steps["one_device_xla"]["seconds_per_step"]
    for name, rows, step in (("batch_split", 4, steps["one_device_4_rows_xla"]),
                             ("batch_per_gpu", 32, steps["one_device_xla"])):
        part = projection[name]
        assert part["rows_per_gpu"] == rows
        assert part["gpu_step_seconds"] == step["seconds_per_step"]
        assert part["ring_allreduce_seconds"] == pytest.approx(ring, rel=1e-2)
        assert part["step_seconds"] == pytest.approx(
            step["seconds_per_step"] + update + ring, abs=2e-5)
        assert part["target_tokens_per_second"] == pytest.approx(
            8 * rows * 16 / part["step_seconds"], rel=1e-3)
        assert part["speedup_over_one_gpu"] == pytest.approx(
            8 * rows * one_gpu / (32 * part["step_seconds"]), abs=0.01)
