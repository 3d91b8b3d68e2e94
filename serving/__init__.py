"""Serving path for keras-antisym models: SavedModel export, REST client, local server.

Production uses the TensorFlow Serving container (`serving/Dockerfile`); the
local server (`python -m serving.server`) answers the same REST subset for
laptops, demos and tests.
"""

import os
import sys


def import_tensorflow_quietly():
    """Imports TensorFlow with the process's native stderr closed meanwhile.

    TensorFlow's C++ runtime prints absl lines (oneDNN, CUDA stubs, `cuInit` on
    a machine without a GPU) while it is imported and first lists devices,
    before `TF_CPP_MIN_LOG_LEVEL` applies. The serving modules call
    this before their `import tensorflow` (`training/` has its own for Keras:
    the local server runs without Keras, so it cannot import `training`).
    Python exceptions are unaffected: they are printed after the import.
    """
    if "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow

        tensorflow.config.list_physical_devices("GPU")  # probing CUDA prints too
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
