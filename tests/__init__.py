import os


def python_path(root):
    """PYTHONPATH for a subprocess that imports the checkout at `root`: `root`
    first, then the paths this process was given (packages put on PYTHONPATH
    rather than installed, as on the GPU machine of shared/gpu/README.md)."""
    return os.pathsep.join(path for path in (root, os.environ.get("PYTHONPATH")) if path)
