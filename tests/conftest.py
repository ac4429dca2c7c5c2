import os

# Quiet TensorFlow's C++ start-up logs; must be set before TensorFlow is imported.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

# With CI_NO_SKIPS=1 (CI), a skip other than for missing hardware fails the session.
pytest_plugins = ["tests.skip_check"]

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

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


def pytest_collection_modifyitems(config, items):
    choice = config.getoption("--alone-tests")
    if choice == "with":
        return
    keep = [item for item in items
            if (item.get_closest_marker("alone") is not None) == (choice == "only")]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


@pytest.fixture(autouse=True)
def _float32_policy_and_seed(request):
    """Each test starts under float32 with fixed seeds, whatever the last one set.

    Modules marked `keeps_graphs` are not reseeded: `keras.utils.set_random_seed`
    clears TensorFlow's kernel cache, after which every test would trace their
    module-scoped translators' graphs again (seconds each). They draw no random
    numbers after their module fixtures.
    """
    keras.config.set_dtype_policy("float32")
    if request.node.get_closest_marker("keeps_graphs") is None:
        keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")


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
    """The serving and export tests' Translator (beams 1, 2 and 4)."""
    from tests.translation_fixtures import make_translator

    return make_translator(model, tokenizer)


@pytest.fixture
def xla_on_cpu(monkeypatch):
    """The CPU's XLA path, on a machine with a GPU too: the test's ops on the
    CPU, and `layers.matmul` told there is no accelerator."""
    from keras_transformer.layers import matmul

    monkeypatch.setattr(matmul, "_has_accelerator", lambda: False)
    with tf.device("/CPU:0"):
        yield
