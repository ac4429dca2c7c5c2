"""The README's model.fit example runs as written, but shorter."""

import os
import re

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_fit_examples():
    """The README's model.fit examples: the first one, then accumulation's."""
    with open(os.path.join(ROOT, "README.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.DOTALL)
    [first] = [block for block in blocks if "model.fit(batches.dataset()" in block]
    [accumulating] = [block for block in blocks if "accumulate_steps=4)," in block]
    return first, accumulating


def shrink(example, replacements):
    for long, short in replacements:
        assert long in example, f"the README example no longer has {long!r}; update this test"
        example = example.replace(long, short)
    return example


@pytest.mark.slow
def test_readme_fit_examples_train():
    first, accumulating = readme_fit_examples()
    # Only the sizes change: a smaller vocabulary and model, two steps.
    namespace = {}
    exec(compile(shrink(first, [("vocab_size=8000", "vocab_size=600"),
                                ("steps_per_epoch=500, epochs=4", "steps_per_epoch=2, epochs=1")]),
                 "README.md", "exec"), namespace)
    model = namespace["model"]
    assert int(model.optimizer.iterations.numpy()) == 2
    assert np.isfinite(model.get_metrics_result()["loss"])
    # The accumulation example goes on with the first one's corpus and vocabulary.
    exec(compile(shrink(accumulating, [("TransformerConfig.base(", "TransformerConfig.tiny("),
                                       ("tokens_per_batch=6250", "tokens_per_batch=1024"),
                                       ("steps_per_epoch=4 * 1000, epochs=100",
                                        "steps_per_epoch=4 * 2, epochs=1")]),
                 "README.md", "exec"), namespace)
    model = namespace["model"]
    assert int(model.optimizer.iterations.numpy()) == 2  # updates, from 8 batches
    assert np.isfinite(model.get_metrics_result()["loss"])
