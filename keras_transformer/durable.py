"""Files that survive a kill at any moment, and one writer per run directory.

A run lasts days and gets preempted, killed or cut off by a full disk. Each of
its files is written to a temporary name that carries the writer's pid,
fsynced, then renamed (`write_atomically`), so it is whole or absent; what a
killed writer left is removed when the run starts again
(`remove_temporaries`); and `RunLock` keeps a second trainer out of a directory
that one is writing.
"""

import atexit
import datetime
import errno
import fcntl
import os
import re
import shutil
import socket
import sys

LOCK = ".lock"
# A file's or directory's temporary name while it is written: NAME.tmp-PID[.SUFFIX].
TEMPORARY = re.compile(r"\.tmp-(\d+)(?:\.|$)")
# Suffixes that a writer needs on the temporary name too (Keras checks them).
_SUFFIXES = (".weights.h5", ".keras", ".json", ".npy", ".csv")


def write_atomically(path, write):
    """Calls `write(temporary)` and moves the file or directory it wrote to `path`:
    fsynced, then renamed, so that `path` is whole or absent whatever happens.

    The temporary name is `path`'s with `.tmp-<pid>` before its suffix
    (`ckpt-00000010.tmp-123.weights.h5`), so that Keras accepts it and
    `remove_temporaries` recognizes it. A directory replaces nothing: `path`
    must not exist.

    A write that fails with an error of the system's (a full disk, say) leaves
    nothing behind and raises `OSError` with that error's number and words,
    naming `path`: "[Errno 28] No space left on device: 'ckpt-...'", where h5py
    would say "Can't synchronously write data (file write failed: time = ...".
    """
    directory, name = os.path.split(os.path.abspath(path))
    suffix = next((s for s in _SUFFIXES if name.endswith(s)), "")
    temporary = os.path.join(directory, f"{name[:len(name) - len(suffix)]}.tmp-{os.getpid()}"
                                        f"{suffix}")
    try:
        write(temporary)
        _fsync_tree(temporary)
        os.replace(temporary, path)
        _fsync(directory)
    except BaseException as error:
        _close_hdf5_files(temporary)
        if isinstance(error, OSError) and error.errno:
            raise OSError(error.errno, os.strerror(error.errno), path) from error
        raise
    finally:
        if os.path.isdir(temporary):
            shutil.rmtree(temporary, ignore_errors=True)
        elif os.path.exists(temporary):
            os.remove(temporary)


def _close_hdf5_files(path):
    """Closes the h5py files that a failed writer left open on `path`. Keras's
    `save_weights` leaves its file open when a write fails; h5py would flush it
    when the process ends, fail again on the full disk and crash the interpreter
    (a segmentation fault after the traceback). Closing it here fails once more
    (the flush), but closes it."""
    h5py = sys.modules.get("h5py")
    if h5py is None:  # nothing wrote HDF5
        return
    import gc

    for item in gc.get_objects():
        if isinstance(item, h5py.File):
            try:
                if item.id.valid and os.path.abspath(item.filename) == path:
                    item.close()
            except (AttributeError, OSError, RuntimeError, ValueError):
                pass


# The system's errors for a disk that is full, or a quota that is spent.
FULL = (errno.ENOSPC, errno.EDQUOT)


def full_disk_error(error, path=None):
    """`error` (TensorFlow's for a file write: a `ResourceExhaustedError` whose
    message says "{{function_node NAME}} PATH; No space left on device") as the
    system's `OSError`, naming `path`, or by default the file the message names;
    None where it does not say the disk is full (a `ResourceExhaustedError` is
    also how TensorFlow runs out of memory)."""
    message = str(error)
    for number in FULL:
        words = os.strerror(number)
        if words in message:
            named = re.search(r"([^\s{}][^\n{}]*?); " + re.escape(words), message)
            return OSError(number, words, path or (named and named.group(1)))
    return None


def remove_temporaries(run_dir):
    """Removes what killed writers left (`*.tmp-<pid>*`) anywhere in a run
    directory; call it holding the run's lock. Returns the paths removed,
    relative to `run_dir`."""
    removed = []
    for directory, subdirectories, names in os.walk(run_dir):
        for name in sorted(subdirectories + names):
            path = os.path.join(directory, name)
            if TEMPORARY.search(name):
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
                removed.append(os.path.relpath(path, run_dir))
        subdirectories[:] = [d for d in subdirectories if not TEMPORARY.search(d)]
    return sorted(removed)


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path):
    if os.path.isdir(path):
        for name in os.listdir(path):
            _fsync_tree(os.path.join(path, name))
    _fsync(path)


class RunLockedError(ValueError):
    """Another live trainer holds the run directory."""


class RunLock:
    """One writer per run directory: an exclusive `flock` on `RUN/.lock`, held
    until `release` or the end of the process (the system drops it however the
    process ends). The file names the holder's host, pid and start time.

    `acquire` raises `RunLockedError`, naming the holder, while another process
    holds it; a lock file that a process left without holding it any more (it
    was killed) is taken over, with a notice on stderr.
    """

    def __init__(self, run_dir):
        self.path = os.path.join(run_dir, LOCK)
        self._fd = None

    def acquire(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_text(fd) or "another process"
            os.close(fd)
            raise RunLockedError(
                f"{os.path.dirname(self.path)} is in use by {holder}; wait for that trainer "
                "to end, or pass another --out") from None
        previous = _read_text(fd)
        if previous:
            print(f"Taking over {self.path} from {previous}, which is no longer running.",
                  file=sys.stderr, flush=True)
        os.ftruncate(fd, 0)
        since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}".encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self):
        """Empties the lock file (a clean end) and drops the lock."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def lock_for_writing(run_dir):
    """Takes `run_dir`'s `RunLock` until the process ends (unless this process
    holds it already) and removes what killed writers left there; returns the lock."""
    key = os.path.realpath(run_dir)
    if key in _HELD:
        return _HELD[key]
    lock = _HELD[key] = RunLock(run_dir).acquire()
    atexit.register(lock.release)
    removed = remove_temporaries(run_dir)
    if removed:
        print(f"Removed what an interrupted writer left in {run_dir}: {', '.join(removed)}.",
              file=sys.stderr, flush=True)
    return lock


_HELD = {}  # realpath -> the RunLock this process holds until it ends


def _read_text(fd):
    return os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
