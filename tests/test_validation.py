"""Bad arguments and bad inputs fail early with a message naming what is wrong."""

import math

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_antisym import (
    AntisymmetricCell,
    AntisymmetricRNN,
    FanInNormal,
    GatedAntisymmetricCell,
    GatedAntisymmetricRNN,
)

CONSTRUCTORS = [AntisymmetricCell, GatedAntisymmetricCell, AntisymmetricRNN, GatedAntisymmetricRNN]


@pytest.mark.parametrize("constructor", CONSTRUCTORS)
@pytest.mark.parametrize(
    "kwargs, argument, expected",
    [
        ({"units": 0}, "units", "a positive integer"),
        ({"units": -3}, "units", "a positive integer"),
        ({"units": 4.0}, "units", "a positive integer"),
        ({"units": "8"}, "units", "a positive integer"),
        ({"units": True}, "units", "a positive integer"),
        ({"epsilon": 0}, "epsilon", "a positive float"),
        ({"epsilon": -0.1}, "epsilon", "a positive float"),
        ({"epsilon": float("nan")}, "epsilon", "a positive float"),
        ({"epsilon": "0.1"}, "epsilon", "a positive float"),
        ({"gamma": -0.01}, "gamma", "a non-negative float"),
        ({"gamma": float("inf")}, "gamma", "a non-negative float"),
        ({"dropout": 1.0}, "dropout", "a float in [0, 1)"),
        ({"dropout": -0.1}, "dropout", "a float in [0, 1)"),
        ({"recurrent_dropout": 1.5}, "recurrent_dropout", "a float in [0, 1)"),
        ({"antisymmetric": "yes"}, "antisymmetric", "a boolean"),
    ],
)
def test_invalid_arguments(constructor, kwargs, argument, expected):
    kwargs = {"units": 4, **kwargs}
    with pytest.raises(ValueError) as info:
        constructor(**kwargs)
    message = str(info.value)
    assert f"Received an invalid value for argument `{argument}`" in message
    assert f"expected {expected}" in message
    assert f"got {kwargs[argument]!r}"[:8] in message


def test_valid_edge_values_are_accepted():
    AntisymmetricCell(np.int64(3), gamma=0, dropout=0.0)
    AntisymmetricRNN(1, epsilon=1e-9, recurrent_dropout=0.999)


def test_invalid_sigma():
    with pytest.raises(ValueError, match="argument `sigma`, expected a non-negative float"):
        FanInNormal(-1.0)


@pytest.mark.parametrize("shape", [(4, 3), (2, 4, 3, 1), (5,)])
def test_cell_in_rnn_rejects_wrong_rank(shape):
    layer = keras.layers.RNN(AntisymmetricCell(4))
    with pytest.raises(ValueError, match=r"sequences of shape \(batch, timesteps, features\)"):
        layer(np.zeros(shape, "float32"))


@pytest.mark.parametrize("layer_class", [AntisymmetricRNN, GatedAntisymmetricRNN])
@pytest.mark.parametrize("shape", [(4, 3), (2, 4, 3, 1)])
def test_fused_layer_rejects_wrong_rank(layer_class, shape):
    with pytest.raises(ValueError, match="expected ndim=3"):
        layer_class(4)(np.zeros(shape, "float32"))


def test_cell_rejects_wrong_rank_step():
    with pytest.raises(ValueError, match="expects step inputs of shape"):
        AntisymmetricCell(4)(np.zeros((2, 3, 4), "float32"), [np.zeros((2, 4), "float32")])


def test_unknown_feature_dimension():
    with pytest.raises(ValueError, match="known number of features"):
        AntisymmetricRNN(4)(keras.Input((None, None)))


def test_fan_in_normal_accepts_numpy_scalars():
    init = FanInNormal(np.float32(2.0), seed=1)
    values = np.asarray(init((400, 300)))
    assert init.sigma == 2.0 and abs(values.std() - 2.0 / np.sqrt(400)) < 0.01


# Property-based: any value either constructs (and is kept) or fails naming the argument.
_ANY_VALUE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-10, max_value=10),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
)


def _is_real(value):
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


_RULES = {
    "epsilon": lambda v: _is_real(v) and v > 0,
    "gamma": lambda v: _is_real(v) and v >= 0,
    "dropout": lambda v: _is_real(v) and 0 <= v < 1,
    "recurrent_dropout": lambda v: _is_real(v) and 0 <= v < 1,
    "units": lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
}


@settings(max_examples=40, deadline=None)
@given(
    constructor=st.sampled_from(CONSTRUCTORS),
    argument=st.sampled_from(sorted(_RULES)),
    value=_ANY_VALUE,
)
def test_every_value_is_accepted_or_named(constructor, argument, value):
    kwargs = {"units": 4, argument: value}
    if _RULES[argument](value):
        layer = constructor(**kwargs)
        cell = getattr(layer, "cell", layer)
        assert getattr(cell, argument) == value
    else:
        with pytest.raises(
            ValueError, match=f"Received an invalid value for argument `{argument}`"
        ):
            constructor(**kwargs)


@settings(max_examples=40, deadline=None)
@given(argument=st.sampled_from(["learning_rate", "momentum", "units", "steps"]), value=_ANY_VALUE)
def test_run_config_accepts_or_names_the_flag(argument, value):
    from training.config import RunConfig, UsageError

    rules = {
        "learning_rate": lambda v: _is_real(v) and v > 0,
        "momentum": lambda v: _is_real(v) and 0 <= v < 1,
        "units": _RULES["units"],
        "steps": _RULES["units"],
    }
    config = RunConfig(**{argument: value})
    if rules[argument](value):
        assert config.validate() is config
    else:
        with pytest.raises(UsageError, match=f"argument `--{argument.replace('_', '-')}`"):
            config.validate()
