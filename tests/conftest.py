import os
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from keras_antisym import (  # noqa: E402
    AntisymmetricCell,
    AntisymmetricRNN,
    GatedAntisymmetricCell,
    GatedAntisymmetricRNN,
)

LAYER_KINDS = ["cell", "fused"]


@pytest.fixture
def hoist_wide_inputs(monkeypatch):
    """The fused layers hoist `V·x` for wide inputs as on a GPU (this CPU would not)."""
    import keras_antisym.layers

    monkeypatch.setattr(keras_antisym.layers, "HOIST_INPUTS", True)


# The real MNIST subset and Fashion-MNIST in TFDS's format: `shared/` beside
# the clone (as on the development machines and in CI), or KERAS_ANTISYM_TFDS_DIR.
SHARED_TFDS = Path(
    os.environ.get(
        "KERAS_ANTISYM_TFDS_DIR",
        Path(__file__).resolve().parents[2] / "shared" / "data" / "tfds",
    )
)


@pytest.fixture
def shared_tfds():
    """The shared TFDS folder; tests that read real data skip without it."""
    if not (SHARED_TFDS / "mnist").is_dir():
        pytest.skip(f"no shared TFDS data at {SHARED_TFDS} (set KERAS_ANTISYM_TFDS_DIR)")
    return str(SHARED_TFDS)


def make_layer(kind, gated, units, **kwargs):
    """`keras.layers.RNN(cell)` or the fused layer, with the same arguments."""
    rnn_args = {
        k: kwargs.pop(k)
        for k in (
            "return_sequences",
            "return_state",
            "go_backwards",
            "stateful",
            "unroll",
            "zero_output_for_mask",
            "name",
        )
        if k in kwargs
    }
    if kind == "cell":
        cell_class = GatedAntisymmetricCell if gated else AntisymmetricCell
        return keras.layers.RNN(cell_class(units, **kwargs), **rnn_args)
    layer_class = GatedAntisymmetricRNN if gated else AntisymmetricRNN
    return layer_class(units, **kwargs, **rnn_args)


def random_weights(layer, seed=0, scale=0.5):
    """Non-trivial weights (non-zero bias) drawn with NumPy and set on `layer`."""
    rng = np.random.RandomState(seed)
    weights = [scale * rng.standard_normal(w.shape).astype("float32") for w in layer.get_weights()]
    layer.set_weights(weights)
    return weights


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
