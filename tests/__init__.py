import os


def python_path(root):
    """PYTHONPATH for a subprocess that imports the checkout at `root`: `root`
    first, then the paths this process was given (packages put on PYTHONPATH
    rather than installed, as on the GPU machine of shared/gpu/README.md)."""
    return os.pathsep.join(path for path in (root, os.environ.get("PYTHONPATH")) if path)


def made_once(tmp_path_factory, name, make):
    """A directory that `make(directory)` fills once per test session, however many
    pytest-xdist workers ask for it (scripts/test.sh runs one per core): the first
    to ask makes it under a lock, in the workers' shared temporary directory, and
    the others wait for it and reuse it. Things on disk only (a wheel's virtual
    environment, a trained run), not objects of one process."""
    import fcntl
    import shutil

    top = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        top = top.parent  # the session's, above each worker's own
    directory, done = top / name, top / f"{name}.done"
    with open(top / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)  # a worker that failed to make it
            directory.mkdir()
            make(directory)
            done.touch()
    return directory
