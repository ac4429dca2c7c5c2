import os

# The commands' environment, set before TensorFlow is imported: its C++ start-up
# logs quiet, and its oneDNN kernels on, so that a test's translations rank near
# ties as the commands' do on an AVX2-only CPU too (cli.common.COMMAND_ENVIRONMENT).
from keras_transformer.cli.common import use_command_environment  # noqa: E402

use_command_environment()
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

# With CI_NO_SKIPS=1 (CI), a skip other than for missing hardware fails the session.
pytest_plugins = ["tests.skip_check"]

import contextlib  # noqa: E402

import pytest  # noqa: E402

from tests.seeding import reseed  # noqa: E402

# Every test's seed (`_float32_policy_and_seed`), and TensorFlow's for the process.
SEED = 1234


@contextlib.contextmanager
def _no_library_start_up_lines():
    """File descriptor 2 to /dev/null while TensorFlow starts: its C++ code writes
    lines there that TF_CPP_MIN_LOG_LEVEL does not hold back (absl's "All log
    messages before absl::InitializeLog()", oneDNN's, CUDA's), once in each pytest
    process. A failed import still raises, and says why, after."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


with _no_library_start_up_lines():
    import keras  # noqa: E402
    import tensorflow as tf  # noqa: E402

    # Under pytest-xdist, each worker's TensorFlow takes its share of the cores,
    # not all of them: two workers on 2 cores, each with thread pools as wide as
    # the machine, ran the fast tests in 11.5 minutes on a 2-core Zen 4, against
    # 8.9 with a thread each (2026-12-07). Set before the first op; the
    # subprocesses tests start (train, export) still take every core.
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if _workers > 1:
        _share = max(1, len(os.sched_getaffinity(0)) // _workers)
        tf.config.threading.set_intra_op_parallelism_threads(_share)
        tf.config.threading.set_inter_op_parallelism_threads(_share)

    tf.constant(0)  # the first op: CUDA's start-up lines, on a machine without a GPU
    tf.random.set_seed(SEED)  # once: it clears TensorFlow's kernel cache (`seeding.reseed`)

# The numeric tests compare float32 results to 1e-5 and tighter; on GPUs from
# NVIDIA's Ampere on, TensorFlow multiplies float32 matrices in TF32 (10-bit
# mantissas, about 1e-3 relative error) unless told not to.
tf.config.experimental.enable_tensor_float_32_execution(False)


def pytest_addoption(parser):
    parser.addoption(
        "--alone-tests", choices=("with", "skip", "only"), default="with",
        help="the tests marked `alone` (they need the machine to themselves): run them with "
             "the others (default), leave them out (scripts/test.sh, beside its workers), "
             "or run only them (scripts/test.sh, after)")


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups
def pytest_collection_modifyitems(config, items):
    """Under `--dist loadgroup` (scripts/test.sh), a module's fast tests go to one
    worker: their module-scoped translators and runs (seconds of tracing each) are
    then built once, not once per worker. Slow tests are spread one by one: they
    take minutes each and build their own."""
    for item in items:
        if item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    for item in items:
        if "quickstart" in getattr(item, "fixturenames", ()) and \
                item.get_closest_marker("alone") is None:
            raise pytest.UsageError(f"{item.nodeid} uses the quickstart fixture, which trains "
                                    "for 8 minutes of wall clock: mark it `alone`")
    choice = config.getoption("--alone-tests")
    if choice == "with":
        return
    keep = [item for item in items
            if (item.get_closest_marker("alone") is not None) == (choice == "only")]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


@pytest.fixture(autouse=True)
def _float32_policy_and_seed():
    """Each test starts under float32 with fixed seeds, whatever the last one set
    (`seeding.reseed`: the functions earlier tests traced stay optimized).

    The environment is put back after each test too: a command run in-process
    (`cli.main`) sets variables for TensorFlow (`cli.common.start_decoding`'s
    TF_ENABLE_ONEDNN_OPTS, the XLA cache's flags) that this process read long
    before, but that the subprocesses of the worker's later tests would inherit
    (test_readme_commands and test_legacy_fixture run translate in-process): on an
    AVX2-only EPYC a train subprocess would run oneDNN's kernels where this process
    runs TensorFlow's own, the likely cause of test_main_job_end_to_end's BLEU on a
    6-step model's near ties differing there (0.39 against 0.42, 2026-12-03).
    """
    environment = dict(os.environ)
    keras.config.set_dtype_policy("float32")
    reseed(SEED)
    yield
    keras.config.set_dtype_policy("float32")
    if os.environ != environment:
        os.environ.clear()
        os.environ.update(environment)


@pytest.fixture(scope="session")
def tokenizer():
    """A 400-id vocabulary learned from the bundled corpus (tests/translation_fixtures.py)."""
    from tests.translation_fixtures import make_tokenizer

    return make_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    """A tiny Transformer with random weights, for the tokenizer's vocabulary."""
    from tests.translation_fixtures import make_model

    return make_model(tokenizer.vocab_size)


@pytest.fixture(scope="module")
def translator(model, tokenizer):
    """The serving and export tests' Translator (beams 1 and 4)."""
    from tests.translation_fixtures import make_translator

    return make_translator(model, tokenizer)


@pytest.fixture(scope="session")
def quickstart(tmp_path_factory):
    """scripts/quickstart.sh, run once per session exactly as README.md tells a new
    user to run it (8 minutes of training, then export, translate and sacreBLEU):
    `result` (its CompletedProcess), `run` and `export` (its directories). The tests
    that use it are marked `alone` and share one run: theirs is a better-trained
    model than any a test could afford to train for itself."""
    import subprocess
    import types

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    directory = tmp_path_factory.mktemp("quickstart")
    run, export = str(directory / "run"), str(directory / "export")
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith(("TF_", "KERAS_"))}  # as a new user's shell
    environment.update(RUN_DIR=run, EXPORT_DIR=export)
    result = subprocess.run(["bash", os.path.join(root, "scripts", "quickstart.sh")],
                            capture_output=True, text=True, env=environment, timeout=1800)
    return types.SimpleNamespace(result=result, run=run, export=export)


@pytest.fixture
def xla_on_cpu(monkeypatch):
    """The CPU's XLA path, on a machine with a GPU too: the test's ops on the
    CPU, and `layers.matmul` told there is no accelerator."""
    from keras_transformer.layers import matmul

    monkeypatch.setattr(matmul, "_has_accelerator", lambda: False)
    with tf.device("/CPU:0"):
        yield
