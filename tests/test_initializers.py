"""keras_antisym/initializers.py: the paper's `N(0, σ²/fan_in)` initialization."""

import keras
import numpy as np
import pytest

from keras_antisym import AntisymmetricRNN, FanInNormal


def _close_to(values, std):
    """The sample std of `values` is `std` within 5 of its standard errors (1/sqrt(2N))."""
    return abs(values.std() - std) <= 5 * std / np.sqrt(2 * values.size)


def test_paper_initialization_statistics():
    n, m = 256, 3
    layer = AntisymmetricRNN(n)  # unseeded: any draw must pass
    layer(np.zeros((1, 1, m), "float32"))
    kernel, rec, bias = layer.get_weights()
    assert _close_to(kernel, np.sqrt(1 / m))
    assert _close_to(rec, np.sqrt(1 / n))
    assert abs(rec.mean()) < 5 * np.sqrt(1 / n) / np.sqrt(rec.size) and np.all(bias == 0)
    for sigma_w in (0, 4, 16):
        layer = AntisymmetricRNN(n, recurrent_initializer=FanInNormal(sigma_w, seed=1))
        layer(np.zeros((1, 1, m), "float32"))
        assert _close_to(layer.get_weights()[1], sigma_w / np.sqrt(n))


@pytest.mark.parametrize("sigma", [-1.0, "2"])
def test_invalid_sigma(sigma):
    """Keras' whole message: the argument, what it expects, and the value given."""
    with pytest.raises(ValueError) as info:
        FanInNormal(sigma)
    assert str(info.value) == (
        "Received an invalid value for argument `sigma`, expected a non-negative float, "
        f"got {sigma!r}."
    )


def test_fan_in_normal_accepts_numpy_scalars():
    init = FanInNormal(np.float32(2.0), seed=1)
    values = np.asarray(init((400, 300)))
    assert init.sigma == 2.0 and abs(values.std() - 2.0 / np.sqrt(400)) < 0.01


def test_seeding_and_config_round_trip():
    init = FanInNormal(3.0, seed=5)
    clone = keras.initializers.deserialize(keras.initializers.serialize(init))
    assert isinstance(clone, FanInNormal) and clone.get_config() == {"sigma": 3.0, "seed": 5}
    np.testing.assert_array_equal(np.asarray(clone((6, 2))), np.asarray(init((6, 2))))
    with pytest.raises(ValueError) as info:
        init(())
    assert str(info.value) == (
        "Received an invalid value for argument `shape`, expected at least one dimension, got ()."
    )


def test_fan_in_of_one_keeps_sigma_and_every_sigma_keeps_the_dtype():
    # N(0, σ²/fan_in) with fan_in = 1 (one input feature): standard deviation σ itself.
    values = np.asarray(FanInNormal(3.0, seed=2)((1, 40000)))
    assert abs(values.std() - 3.0) < 0.05 and abs(values.mean()) < 0.05
    # σ = 0 gives zeros, in the dtype asked for, like any other σ.
    for sigma in (0.0, 1.0):
        for dtype in ("float16", "float64"):
            drawn = FanInNormal(sigma, seed=3)((4, 5), dtype=dtype)
            assert keras.backend.standardize_dtype(drawn.dtype) == dtype
    assert not np.asarray(FanInNormal(0.0)((4, 5), dtype="float64")).any()


def test_default_sigma_is_the_papers_input_scale_and_non_numbers_are_refused():
    # FanInNormal() is the paper's input-to-hidden N(0, 1/m).
    init = FanInNormal(seed=4)
    assert init.sigma == 1.0 and init.get_config()["sigma"] == 1.0
    values = np.asarray(init((100, 400)))
    assert abs(values.std() - 0.1) < 0.005
    for bad in ("1.0", None, [1.0], 1 + 0j, True, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="argument `sigma`, expected a non-negative float"):
            FanInNormal(bad)
