"""TensorFlow and Keras imported without their native start-up lines.

TensorFlow's C++ runtime prints absl INFO and ERROR lines (oneDNN, CUDA stubs,
`cuInit` on a machine without a GPU) while it is imported and while it first
lists devices, before `TF_CPP_MIN_LOG_LEVEL` can apply. A command's `main`
calls these before its first heavy import; library modules do not, so that
importing them has no effect on the process.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Closes the process's native stderr (file descriptor 2) for the block.

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


_DEVICES_LISTED: list[bool] = []


def import_tensorflow() -> ModuleType:
    """Imports TensorFlow and lists its GPUs, with native stderr closed meanwhile.

    Listing the devices initializes CUDA (`cuInit`), which prints an ERROR line
    on a machine without a GPU: it is done here, once, even when TensorFlow was
    imported already (by Keras on its TensorFlow backend).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tensorflow = sys.modules.get("tensorflow")
    if tensorflow is not None and _DEVICES_LISTED:
        return tensorflow
    with native_stderr_silenced():
        if tensorflow is None:
            tensorflow = importlib.import_module("tensorflow")
        tensorflow.config.list_physical_devices("GPU")
    _DEVICES_LISTED.append(True)
    return tensorflow


def import_keras() -> ModuleType:
    """Imports Keras (with its backend), then TensorFlow where it is installed.

    TensorBoard and TFDS import TensorFlow on every backend. Keras comes first:
    on PyTorch it loads Triton, which aborts the process if TensorFlow came first.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with native_stderr_silenced():
        keras = importlib.import_module("keras")
    with contextlib.suppress(ImportError):  # JAX and PyTorch run without TensorFlow
        import_tensorflow()
    return keras
