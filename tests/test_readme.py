"""The README's model.fit example runs as written, but shorter."""

import os
import re

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_fit_example():
    with open(os.path.join(ROOT, "README.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.DOTALL)
    [example] = [block for block in blocks if "model.fit(" in block]
    return example


@pytest.mark.slow
def test_readme_fit_example_trains():
    example = readme_fit_example()
    # Only the sizes change: a smaller vocabulary, two steps.
    for long, short in [("vocab_size=8000", "vocab_size=600"),
                        ("steps_per_epoch=500, epochs=4", "steps_per_epoch=2, epochs=1")]:
        assert long in example, f"the README example no longer has {long!r}; update this test"
        example = example.replace(long, short)
    namespace = {}
    exec(compile(example, "README.md", "exec"), namespace)
    model = namespace["model"]
    assert int(model.optimizer.iterations.numpy()) == 2
    assert np.isfinite(model.get_metrics_result()["loss"])
