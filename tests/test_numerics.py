"""Both cells, through `keras.layers.RNN` and the fused layers, against NumPy."""

import keras
import numpy as np
import pytest

from tests import reference
from tests.conftest import LAYER_KINDS, make_layer, random_weights

ATOL = 2e-5


def _inputs(batch=3, steps=12, features=4, seed=1):
    return np.random.RandomState(seed).standard_normal((batch, steps, features)).astype("float32")


def _ragged_mask(batch=3, steps=12):
    mask = np.ones((batch, steps), dtype=bool)
    mask[0, 9:] = False  # right padding
    mask[1, :3] = False  # left padding
    mask[2, [4, 5, 8]] = False  # holes
    return mask


def _check_against_reference(kind, gated, x, go_backwards, unroll, mask=None):
    """Outputs and last state of `kind` (a random-weight layer) equal the NumPy reference."""
    args = dict(epsilon=0.3, gamma=0.05)
    layer = make_layer(
        kind,
        gated,
        6,
        return_sequences=True,
        return_state=True,
        go_backwards=go_backwards,
        unroll=unroll,
        **args,
    )
    layer(x)
    weights = random_weights(layer)
    outputs, state = layer(x, mask=mask)
    expected, expected_state = reference.run(
        weights, x, units=6, gated=gated, mask=mask, go_backwards=go_backwards, **args
    )
    # With a mask, Keras' TF loop emits zeros (not the initial state) for leading
    # masked steps; with the default zero initial state both conventions agree.
    np.testing.assert_allclose(np.asarray(outputs), expected, atol=ATOL)
    np.testing.assert_allclose(np.asarray(state), expected_state, atol=ATOL)


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("unroll", [False, True])
@pytest.mark.parametrize("features", [3, 9])  # 9: the fused layers hoist V·x
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.usefixtures("hoist_wide_inputs")
def test_matches_numpy_reference(kind, gated, go_backwards, unroll, features, masked):
    mask = _ragged_mask() if masked else None
    _check_against_reference(kind, gated, _inputs(features=features), go_backwards, unroll, mask)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("steps", [1, 7, 11])  # odd: the fused loop's one-step iterations
@pytest.mark.parametrize("go_backwards", [False, True])
def test_odd_lengths_match_numpy_reference(gated, steps, go_backwards):
    _check_against_reference("fused", gated, _inputs(steps=steps), go_backwards, unroll=False)


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_masking_layer_and_last_output(kind):
    x = _inputs()
    x[0, 7:] = 0.0  # padded with the mask value
    model = keras.Sequential(
        [
            keras.Input((12, 4)),
            keras.layers.Masking(0.0),
            make_layer(kind, True, 5, epsilon=0.5, gamma=0.1),
        ]
    )
    weights = random_weights(model.layers[-1], seed=4)
    _, expected_state = reference.run(
        weights, x, units=5, gated=True, epsilon=0.5, gamma=0.1, mask=np.any(x != 0.0, axis=-1)
    )
    np.testing.assert_allclose(np.asarray(model(x)), expected_state, atol=ATOL)
    # The padded sample equals the same sample cut to its 7 real steps.
    short = make_layer(kind, True, 5, epsilon=0.5, gamma=0.1)
    short(x[:1, :7])
    short.set_weights(weights)
    np.testing.assert_allclose(np.asarray(model(x))[0], np.asarray(short(x[:1, :7]))[0], atol=ATOL)


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("gated", [False, True])
def test_ablation_model_matches_reference(kind, gated):
    x = _inputs()
    args = dict(epsilon=0.1, gamma=0.2)
    layer = make_layer(kind, gated, 4, return_sequences=True, antisymmetric=False, **args)
    layer(x)
    weights = random_weights(layer, seed=5)
    assert weights[1].shape == (4, 4)
    expected, _ = reference.run(weights, x, units=4, gated=gated, antisymmetric=False, **args)
    np.testing.assert_allclose(np.asarray(layer(x)), expected, atol=ATOL)


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("features", [4, 9])  # 9: the fused layers hoist V·x
@pytest.mark.usefixtures("hoist_wide_inputs")
def test_initial_state_and_no_bias(kind, gated, features):
    x = _inputs(features=features)
    h0 = np.random.RandomState(7).standard_normal((3, 5)).astype("float32")
    layer = make_layer(
        kind, gated, 5, epsilon=0.4, gamma=0.3, use_bias=False, return_sequences=True
    )
    layer(x)
    weights = random_weights(layer, seed=8)
    assert len(weights) == 2
    expected, _ = reference.run(weights, x, units=5, epsilon=0.4, gamma=0.3, gated=gated, h0=h0)
    np.testing.assert_allclose(np.asarray(layer(x, initial_state=[h0])), expected, atol=ATOL)


def test_hand_computed_single_step():
    # units=2, m=1: W = [[0, 2], [0, 0]] so W - Wᵀ - γI = [[-γ, 2], [-2, -γ]].
    layer = keras.layers.RNN(
        __import__("keras_antisym").AntisymmetricCell(2, epsilon=0.5, gamma=0.25),
        return_sequences=True,
    )
    x = np.array([[[1.0], [0.0]]], dtype="float32")
    layer(x)
    layer.set_weights(
        [
            np.array([[1.0, -1.0]], "float32"),
            np.array([2.0], "float32"),
            np.array([0.0, 0.5], "float32"),
        ]
    )
    out = np.asarray(layer(x))[0]
    h1 = 0.5 * np.tanh(np.array([1.0, -0.5]))
    m = np.array([[-0.25, 2.0], [-2.0, -0.25]])
    h2 = h1 + 0.5 * np.tanh(m @ h1 + np.array([0.0, 0.5]))
    np.testing.assert_allclose(out, np.stack([h1, h2]), atol=1e-6)


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("steps", [5, 6])  # 6: the fused loop's two-step iterations
def test_inputs_without_features(kind, gated, steps):
    # No input features: V·x = 0 and the state is driven by the bias alone.
    x = np.zeros((2, steps, 0), "float32")
    layer = make_layer(kind, gated, 4, epsilon=0.3, gamma=0.1, return_sequences=True)
    layer(x)
    weights = random_weights(layer, seed=3)
    expected, _ = reference.run(weights, x, units=4, epsilon=0.3, gamma=0.1, gated=gated)
    assert np.abs(expected).max() > 0.1
    np.testing.assert_allclose(np.asarray(layer(x)), expected, atol=ATOL)
