import os
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from apputil.quiet import import_keras  # noqa: E402
from tests.limits import TIME_FACTOR, limit  # noqa: E402

# TensorFlow's native start-up lines (oneDNN, CUDA stubs, cuInit on a machine without a
# GPU) would otherwise print outside pytest's capture, in every process that loads this.
keras = import_keras()

from keras_antisym import (  # noqa: E402
    AntisymmetricCell,
    AntisymmetricRNN,
    GatedAntisymmetricCell,
    GatedAntisymmetricRNN,
)

LAYER_KINDS = ["cell", "fused"]


# The real MNIST (60,000 training digits, 5,000 test) and Fashion-MNIST in TFDS's
# format: `shared/` beside the clone (as on the development machines and in CI), or
# KERAS_ANTISYM_TFDS_DIR.
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
    """`keras.layers.RNN(cell)` or the fused layer, with the same arguments.

    `hoist_inputs` reaches the fused layer only (tests pass `features >= 8`,
    hoisting wide inputs as on a GPU, which this CPU would not).
    """
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
        kwargs.pop("hoist_inputs", None)  # the fused layers' own argument
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


def inputs(batch=3, steps=12, features=4, seed=1):
    """Standard-normal float32 sequences `(batch, steps, features)`."""
    return np.random.RandomState(seed).standard_normal((batch, steps, features)).astype("float32")


def check_against_reference(kind, gated, x, go_backwards, unroll, mask=None, training=False):
    """Outputs and last state of `kind` (a random-weight layer) equal the NumPy reference.

    Inputs of at least 8 features take the fused layers' hoisted path; on TensorFlow
    `training` picks the fused layers' loop (Keras' in training, else a LiteRT-friendly one).
    """
    from benchmarks import reference

    args = dict(epsilon=0.3, gamma=0.05)
    layer = make_layer(
        kind,
        gated,
        6,
        return_sequences=True,
        return_state=True,
        go_backwards=go_backwards,
        unroll=unroll,
        hoist_inputs=x.shape[-1] >= 8,
        **args,
    )
    layer(x)
    weights = random_weights(layer)
    outputs, state = layer(x, mask=mask, training=training)
    expected, expected_state = reference.run(
        weights, x, units=6, gated=gated, mask=mask, go_backwards=go_backwards, **args
    )
    # With a mask, Keras' TF loop emits zeros (not the initial state) for leading
    # masked steps; with the default zero initial state both conventions agree.
    np.testing.assert_allclose(np.asarray(outputs), expected, atol=2e-5)
    np.testing.assert_allclose(np.asarray(state), expected_state, atol=2e-5)


#: A value other than the default for every constructor argument of the cells and layers.
NON_DEFAULT_ARGUMENTS = {
    "units": 6,
    "epsilon": 0.1,
    "gamma": 0.001,
    "activation": "relu",
    "recurrent_activation": "hard_sigmoid",
    "use_bias": False,
    "kernel_initializer": "glorot_uniform",
    "recurrent_initializer": "orthogonal",
    "bias_initializer": "ones",
    "kernel_regularizer": "l2",
    "recurrent_regularizer": keras.regularizers.L1(0.01),
    "bias_regularizer": "l1",
    "activity_regularizer": keras.regularizers.L2(0.5),
    "kernel_constraint": "max_norm",
    "recurrent_constraint": "non_neg",
    "bias_constraint": "unit_norm",
    "dropout": 0.1,
    "recurrent_dropout": 0.2,
    "seed": 3,
    "antisymmetric": False,
    "return_sequences": True,
    "return_state": True,
    "go_backwards": True,
    "stateful": True,
    "unroll": True,
    "hoist_inputs": True,
    "fused_kernel": False,
}


def constructor_arguments(cls):
    """The names of `cls`' constructor arguments, in order, without `**kwargs`."""
    import inspect

    parameters = inspect.signature(cls).parameters.values()
    return [p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]


def check_every_argument_round_trips(cls):
    """Each argument, given a non-default value, survives get_config/from_config by value.

    Returns the layer built with those values.
    """
    names = constructor_arguments(cls)
    assert set(names) <= set(NON_DEFAULT_ARGUMENTS), "give the new argument a test value"
    layer = cls(**{name: NON_DEFAULT_ARGUMENTS[name] for name in names})
    default = cls(units=NON_DEFAULT_ARGUMENTS["units"])
    config = layer.get_config()
    clone = cls.from_config(config)
    serialize = keras.saving.serialize_keras_object
    for name in names:
        value = serialize(getattr(layer, name))
        assert serialize(getattr(clone, name)) == value, name
        if name != "units":
            assert value != serialize(getattr(default, name)), f"{name} kept its default"
    assert clone.get_config() == config
    return layer


def pytest_collection_modifyitems(config, items):
    """Each test's time limit (its `timeout` mark, else pyproject's) scaled by the suite's
    time factor (`tests/limits.py`)."""
    if TIME_FACTOR == 1:
        return
    default = float(config.getini("timeout") or 0)
    for item in items:
        mark = item.get_closest_marker("timeout")
        seconds = float(mark.args[0]) if mark is not None and mark.args else default
        if seconds > 0:
            kwargs = dict(mark.kwargs) if mark is not None else {}
            item.add_marker(pytest.mark.timeout(limit(seconds), **kwargs), append=False)
