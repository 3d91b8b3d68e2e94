"""keras_antisym/_validation.py: bad arguments fail early, naming the argument, as Keras does."""

import math

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_antisym import (
    AntisymmetricCell,
    AntisymmetricRNN,
    GatedAntisymmetricCell,
    GatedAntisymmetricRNN,
    _validation,
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
        ({"use_bias": 1}, "use_bias", "a boolean"),
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
    cell = AntisymmetricCell(np.int64(3), gamma=0, dropout=0.0, use_bias=np.bool_(False))
    assert (cell.units, cell.gamma, cell.dropout, cell.use_bias) == (3, 0.0, 0.0, False)
    assert type(cell.units) is int and type(cell.use_bias) is bool
    layer = AntisymmetricRNN(1, epsilon=1e-9, recurrent_dropout=0.999)
    assert (layer.units, layer.epsilon, layer.recurrent_dropout) == (1, 1e-9, 0.999)


@pytest.mark.parametrize("argument", ["hoist_inputs", "fused_kernel"])
@pytest.mark.parametrize("layer_class", [AntisymmetricRNN, GatedAntisymmetricRNN])
@pytest.mark.parametrize("value", ["always", "Auto", 1, None, np.array([True])])
def test_auto_or_boolean_arguments(argument, layer_class, value, monkeypatch):
    """The whole message names the argument; valid values are kept as given."""
    from keras_antisym import kernels

    # `fused_kernel=True` needs a kernel backend: count this one as one.
    monkeypatch.setattr(kernels, "KERNEL_BACKENDS", (keras.backend.backend(),))
    with pytest.raises(ValueError) as info:
        layer_class(4, **{argument: value})
    assert str(info.value) == (
        f'Received an invalid value for argument `{argument}`, expected "auto" or a boolean, '
        f"got {value!r}."
    )
    for valid in ("auto", True, False, np.bool_(True)):
        assert getattr(layer_class(4, **{argument: valid}), argument) == valid


def test_the_one_message_helper():
    error = _validation.invalid("rate", "a float", "x")
    assert isinstance(error, ValueError)
    assert str(error) == "Received an invalid value for argument `rate`, expected a float, got 'x'."
    assert _validation.check_rate("r", 0) == 0.0 and _validation.check_positive_int("n", 2) == 2
    assert _validation.check_auto_or_bool("h", np.bool_(False)) is False


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
def test_run_config_accepts_or_names_the_key_or_the_flag(argument, value):
    from training.config import RunConfig, UsageError
    from training.sections import flag

    rules = {
        "learning_rate": lambda v: _is_real(v) and v > 0,
        "momentum": lambda v: _is_real(v) and 0 <= v < 1,
        "units": _RULES["units"],
        "steps": _RULES["units"],
    }
    config = RunConfig.of(**{argument: value})
    if rules[argument](value):
        assert config.validate() is config and config.validate(flag) is config
    else:
        with pytest.raises(UsageError, match=f"argument `{argument}`"):
            config.validate()
        with pytest.raises(UsageError, match=f"argument `--{argument.replace('_', '-')}`"):
            config.validate(flag)
