"""The documentation says what the code does: every flag of every command's `--help`
is documented on that command's page, every flag a documented command uses exists,
links and anchors resolve, code points to pages that exist, the benchmarks' results
table is the one rendered from their kept JSON reports, and the README stays short.

`doc_commands` is shared with tests/test_readme_commands.py, which runs the commands."""

import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

from keras_transformer import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = "README.md"
DOC_PAGES = [README, *sorted(os.path.relpath(path, ROOT)
                             for path in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
LINKED_PAGES = [*DOC_PAGES, "CONTRIBUTING.md", "CHANGELOG.md"]
# The page that documents each command's flags; the top level's (--version) anywhere.
FLAG_PAGES = {
    "train": ["docs/training.md"],
    "export": ["docs/export-and-serving.md"],
    "translate": ["docs/evaluation.md"],
    "evaluate": ["docs/evaluation.md"],
    None: DOC_PAGES,
}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
QUICKSTART_MARKERS = ("<!-- quickstart transcript -->", "<!-- end quickstart transcript -->")


def read(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return f.read()


def code_blocks(page, languages):
    """The text of each fenced block of `page` in one of `languages`, in order."""
    return [text for language, text in re.findall(r"^```(\w*)\n(.*?)^```", read(page),
                                                  re.DOTALL | re.MULTILINE)
            if language in languages]


def shell_commands(block):
    """The commands of a shell block: continuation lines joined, comments dropped."""
    commands = []
    for line in re.split(r"(?<!\\)\n", block):
        line = line.replace("\\\n", " ")
        line = re.sub(r"(^|\s)#.*$", "", line).strip()  # a comment, not a '#' inside a word
        if line:
            commands.append(line)
    return commands


def doc_commands(page, languages=("bash",)):
    """The `keras-transformer` commands of `page`'s blocks, in order, as argument lists
    after `keras-transformer` (e.g. `["train", "--out", "runs/demo"]`), each with the
    file its output is redirected to (`> FILE`), or None."""
    commands = []
    for block in code_blocks(page, languages):
        for command in shell_commands(block):
            start = re.search(r"(^|\s)keras-transformer(\s|$)", command)
            if not start:
                continue
            words = shlex.split(command[start.end():])
            redirect = None
            if ">" in words:
                redirect = words[words.index(">") + 1]
                words = words[:words.index(">")]
            commands.append((words, redirect))
    return commands


def help_text(command):
    """What `keras-transformer [COMMAND] --help` prints."""
    argv = [command, "--help"] if command else ["--help"]
    result = subprocess.run([sys.executable, "-m", "keras_transformer", *argv], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def all_help():
    return {command: help_text(command) for command in (*cli.COMMANDS, None)}


@pytest.fixture(scope="module")
def all_help_flags(all_help):
    """The flags that each command's --help lists."""
    return {command: set(FLAG.findall(text)) - {"--help"} for command, text in all_help.items()}


@pytest.mark.parametrize("command", [*cli.COMMANDS, None], ids=str)
def test_every_flag_of_help_is_documented(command, all_help_flags):
    text = "".join(read(page) for page in FLAG_PAGES[command])
    documented = set(FLAG.findall(text))
    missing = sorted(all_help_flags[command] - documented)
    assert not missing, (f"`keras-transformer {command or ''} --help` lists flags that "
                         f"{', '.join(FLAG_PAGES[command])} never mention: {missing}")


@pytest.mark.parametrize("command", [*cli.COMMANDS, None], ids=str)
def test_help_gives_a_default_only_where_it_says_something(command, all_help):
    """No "(default: None)" after --export, "(default: False)" after --verbose,
    "(default: )" after --tpu, nor a second default after a help that names its
    own ("Default: the export's (a run's: 4). (default: None)")."""
    text = re.sub(r"\s+", " ", all_help[command])
    for noise in ("(default: None)", "(default: False)", "(default: )"):
        assert noise not in text, noise
    # A flag's help runs to the next line that starts with a flag.
    for flag_help in re.split(r"\n  (?=-)", all_help[command]):
        assert not ("Default:" in flag_help and "(default:" in flag_help), flag_help


def test_documented_commands_use_existing_flags(all_help_flags):
    commands = [(page, words) for page in DOC_PAGES
                for words, _ in doc_commands(page, ("bash", "sh"))]
    assert len(commands) >= 20, commands
    for page, words in commands:
        if words[0].startswith("-"):  # the top level: --version, --help
            assert set(words) <= all_help_flags[None] | {"--help"}, (page, words)
            continue
        assert words[0] in cli.COMMANDS, (page, words)
        unknown = {word.split("=")[0] for word in words[1:] if word.startswith("--")}
        unknown -= all_help_flags[words[0]] | {"--help"}
        assert not unknown, f"{page}: keras-transformer {shlex.join(words)}: no {unknown}"


def github_anchor(heading):
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page):
    return {github_anchor(heading)
            for heading in re.findall(r"^#+ (.*)$", read(page), re.MULTILINE)}


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_links_and_anchors_resolve(page):
    text = re.sub(r"^```.*?^```", "", read(page), flags=re.DOTALL | re.MULTILINE)
    text = re.sub(r"`[^`]*`", "", text)  # code, not links
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        linked = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        assert os.path.exists(os.path.join(ROOT, linked)), f"{page}: {target} does not exist"
        if anchor:
            assert anchor in anchors(linked), f"{page}: {target}: no heading #{anchor}"


def test_code_points_to_pages_that_exist():
    pointers = []
    for path in glob.glob(os.path.join(ROOT, "keras_transformer", "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            pointers += [(path, page) for page in re.findall(r"docs/[\w-]+\.md", f.read())]
    assert pointers, "the package points users to no docs page"
    for path, page in pointers:
        assert os.path.exists(os.path.join(ROOT, page)), f"{path} points to {page}"


def test_the_results_table_is_rendered_from_the_kept_reports():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import results_table
    finally:
        sys.path.pop(0)
    assert results_table.main(["--check", os.path.join(ROOT, "docs", "benchmarks.md")]) == 0, \
        "run python benchmarks/results_table.py --write docs/benchmarks.md"


def test_results_table_renders_a_report(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import results_table
    finally:
        sys.path.pop(0)
    assert "No reports" in results_table.table(str(tmp_path))
    (tmp_path / "gpu").mkdir()
    report = {"benchmark": "train_throughput",
              "device": {"type": "GPU", "name": "NVIDIA H100 80GB HBM3"},
              "machine": {"model_name": "Intel Xeon", "cpus": 26, "avx2": True},
              "results": {"ours": {"seconds_per_step": 0.057, "mfu": 0.18, "precision": "bf16"}}}
    (tmp_path / "gpu" / "2026-12-01-train.json").write_text(__import__("json").dumps(report))
    (tmp_path / "gpu" / "2026-12-01-train.command").write_text(
        "python benchmarks/train_throughput.py --model base\n")
    (tmp_path / "gpu" / "notes.txt").write_text("not a report")
    lines = results_table.table(str(tmp_path)).splitlines()
    assert len(lines) == 3, lines
    assert lines[2].startswith("| 2026-12-01 | [train_throughput](")
    assert "gpu: NVIDIA H100 80GB HBM3" in lines[2]
    assert "`python benchmarks/train_throughput.py --model base`" in lines[2]
    assert "results.ours.seconds_per_step = 0.057, results.ours.mfu = 0.18" in lines[2]
    # A CPU held to AVX2 (a stand-in) says so, beside the ratios a decode report leads with.
    (tmp_path / "cpu").mkdir()
    report = {"benchmark": "decode_throughput",
              "machine": {"model_name": "Intel Xeon", "cpus": 2, "avx2": True,
                          "onednn_max_cpu_isa": "AVX2"},
              "graph": {"seconds_per_batch": 4.16, "all_seconds": [4.3, 4.16]},
              "over_ctranslate2": {"graph_over_ctranslate2_float32": 1.0}}
    (tmp_path / "cpu" / "2026-12-02-decode.json").write_text(__import__("json").dumps(report))
    (tmp_path / "cpu" / "2026-12-02-decode.command").write_text("python decode\n")
    line = results_table.table(str(tmp_path)).splitlines()[3]
    assert "cpu: Intel Xeon, 2 CPUs (avx2, held to ONEDNN_MAX_CPU_ISA=AVX2)" in line
    assert ("graph.seconds_per_batch = 4.16, "
            "over_ctranslate2.graph_over_ctranslate2_float32 = 1" in line), line


def test_the_readme_is_short_and_holds_the_quickstart_transcript():
    text = read(README)
    assert 100 <= len(text.splitlines()) <= 200, len(text.splitlines())
    start, end = (text.index(marker) for marker in QUICKSTART_MARKERS)
    transcript = text[start + len(QUICKSTART_MARKERS[0]):end].strip()
    assert transcript.startswith("```\n$ bash scripts/quickstart.sh") and transcript.endswith("```")
    for question in ("## Status", "## Quickstart", "## Train on your own data", "## Results"):
        assert question in text, question
    # It starts with the quickstart: the first section after the opening paragraph.
    assert re.findall(r"^## .*", text, re.M)[0] == "## Quickstart"


@pytest.mark.parametrize("page", DOC_PAGES)
def test_python_examples_compile(page):
    for block in code_blocks(page, ("python",)):
        compile(block, page, "exec")
