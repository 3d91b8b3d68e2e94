"""Training, tuning and paper experiments for keras-antisym (not shipped in the wheel)."""

import contextlib
import importlib
import os
import sys


@contextlib.contextmanager
def native_stderr_silenced():
    """Closes the process's native stderr (file descriptor 2) for the block.

    TensorFlow's C++ runtime prints absl INFO and ERROR lines (oneDNN, CUDA
    stubs, `cuInit` on a machine without a GPU) while it is imported and
    while it first lists devices, before `TF_CPP_MIN_LOG_LEVEL` can apply.
    Python exceptions still surface: they are printed after the block.
    """
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _import_quietly():
    """Imports Keras (with its backend), then TensorFlow where it is installed.

    TensorBoard and TFDS import TensorFlow on every backend. Keras first: on
    PyTorch it loads Triton, which aborts the process if TensorFlow came first.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with native_stderr_silenced():
        importlib.import_module("keras")
    if "tensorflow" in sys.modules:
        return
    try:
        with native_stderr_silenced():
            importlib.import_module("tensorflow")
    except ImportError:
        pass  # JAX and PyTorch train without TensorFlow


_import_quietly()
