"""Properties from the paper: the transition matrix, Jacobians, parameter counts, init."""

import keras
import numpy as np
import pytest

from keras_antisym import (
    AntisymmetricCell,
    AntisymmetricRNN,
    FanInNormal,
    GatedAntisymmetricCell,
    GatedAntisymmetricRNN,
)
from tests import reference
from tests.conftest import random_weights


@pytest.mark.parametrize("gamma", [0.0, 0.01, 1.0])
def test_transition_matrix_is_antisymmetric_minus_diffusion(gamma):
    layer = AntisymmetricRNN(7, gamma=gamma)
    layer(np.zeros((1, 2, 3), "float32"))
    weights = random_weights(layer)
    m = np.asarray(layer.transition_matrix(), dtype="float64")
    np.testing.assert_allclose(m + m.T, -2 * gamma * np.eye(7), atol=1e-6)
    np.testing.assert_allclose(m, reference.transition_matrix(weights[1], 7, gamma), atol=1e-6)
    eig = np.linalg.eigvals(m + gamma * np.eye(7))
    np.testing.assert_allclose(eig.real, 0.0, atol=1e-5)
    # The diffusion shifts every eigenvalue by -γ: real parts are exactly -γ.
    np.testing.assert_allclose(np.linalg.eigvals(m).real, -gamma, atol=1e-5)


@pytest.mark.parametrize("layer_class", [AntisymmetricRNN, GatedAntisymmetricRNN])
def test_ode_jacobian_has_imaginary_eigenvalues(layer_class):
    """Appendix B: the ODE's Jacobian diag(d)(W − Wᵀ) with d ≥ 0 has imaginary eigenvalues.

    `keras_antisym.ode_jacobian` (γ = 0) against NumPy's diag(d)·M for both
    cells; for the plain cell d = tanh' > 0, so its spectrum is imaginary. (The
    gated cell's d = c·σ'(a_z) + z·tanh'(a_c) can be negative: the paper only
    claims real parts "close to zero" there.)
    """
    from keras_antisym import ode_jacobian

    rng = np.random.RandomState(2)
    layer = layer_class(9, gamma=0.0)
    layer(np.zeros((1, 2, 2), "float32"))
    weights = random_weights(layer, scale=1.0)
    a = reference.transition_matrix(weights[1], 9, 0.0)
    for _ in range(5):
        h, x = rng.standard_normal(9), rng.standard_normal(2)
        jac = np.asarray(ode_jacobian(layer, h, x), dtype="float64")
        projected = weights[0].T @ x + weights[2]
        if layer_class is GatedAntisymmetricRNN:
            z = 1 / (1 + np.exp(-(a @ h + projected[:9])))
            c = np.tanh(a @ h + projected[9:])
            np.testing.assert_allclose(
                jac, np.diag(c * z * (1 - z) + z * (1 - c**2)) @ a, atol=1e-5
            )
            continue
        pre = a @ h + projected
        np.testing.assert_allclose(jac, np.diag(1 - np.tanh(pre) ** 2) @ a, atol=1e-5)
        eig = np.linalg.eigvals(jac)
        assert np.max(np.abs(eig.real)) < 1e-5 * max(1.0, np.max(np.abs(eig)))
        assert np.max(np.abs(eig.imag)) > 1e-3  # not trivially zero


def test_cell_step_jacobian_matches_paper_form():
    """∂h_t/∂h_{t-1} = I + ε·diag(tanh'(a))·M, checked with autodiff (TF)."""
    import tensorflow as tf

    cell = AntisymmetricCell(5, epsilon=0.3, gamma=0.1)
    x = np.random.RandomState(0).standard_normal((1, 2)).astype("float32")
    h = tf.constant(np.random.RandomState(1).standard_normal((1, 5)).astype("float32"))
    cell.build((1, 2))
    weights = [w.numpy() for w in cell.weights]
    with tf.GradientTape() as tape:
        tape.watch(h)
        out, _ = cell(x, [h])
    jac = tape.batch_jacobian(out, h).numpy()[0]
    m = reference.transition_matrix(weights[1], 5, 0.1)
    a = m @ h.numpy()[0] + weights[0].T @ x[0] + weights[2]
    expected = np.eye(5) + 0.3 * np.diag(1 - np.tanh(a) ** 2) @ m
    np.testing.assert_allclose(jac, expected, atol=1e-5)


def _head_count(rnn, features):
    model = keras.Sequential([keras.Input((None, features)), rnn, keras.layers.Dense(10)])
    return model.count_params()


@pytest.mark.parametrize(
    "make, features, expected",
    [
        (lambda: AntisymmetricRNN(128), 1, 9674),
        (lambda: GatedAntisymmetricRNN(128), 1, 9930),
        (lambda: AntisymmetricRNN(256), 3, 36234),
        (lambda: GatedAntisymmetricRNN(256), 3, 37258),
        (lambda: GatedAntisymmetricRNN(196, antisymmetric=False), 3, 41954),
        (lambda: keras.layers.RNN(AntisymmetricCell(128)), 1, 9674),
        (lambda: keras.layers.RNN(GatedAntisymmetricCell(256)), 3, 37258),
        (lambda: keras.layers.LSTM(128), 3, 68874),
    ],
)
def test_paper_parameter_counts(make, features, expected):
    assert _head_count(make(), features) == expected


@pytest.mark.parametrize("units", [1, 2, 10])
def test_weight_shapes(units):
    for antisymmetric, rec_shape in [(True, (units * (units - 1) // 2,)), (False, (units, units))]:
        layer = GatedAntisymmetricRNN(units, antisymmetric=antisymmetric)
        layer(np.zeros((2, 3, 4), "float32"))
        shapes = [tuple(w.shape) for w in layer.weights]
        assert shapes == [(4, 2 * units), rec_shape, (2 * units,)]
        assert [w.name for w in layer.weights] == ["kernel", "recurrent_kernel", "bias"]


def test_paper_initialization_statistics():
    n, m = 256, 3
    layer = AntisymmetricRNN(n)
    layer(np.zeros((1, 1, m), "float32"))
    kernel, rec, bias = layer.get_weights()
    assert abs(kernel.std() - np.sqrt(1 / m)) < 0.05 * np.sqrt(1 / m)
    assert abs(rec.std() - np.sqrt(1 / n)) < 0.05 * np.sqrt(1 / n)
    assert abs(rec.mean()) < 0.01 and np.all(bias == 0)
    for sigma_w in (0, 4, 16):
        layer = AntisymmetricRNN(n, recurrent_initializer=FanInNormal(sigma_w, seed=1))
        layer(np.zeros((1, 1, m), "float32"))
        std = layer.get_weights()[1].std()
        assert abs(std - sigma_w / np.sqrt(n)) <= 0.05 * sigma_w / np.sqrt(n)


def test_recurrent_initializer_sees_the_full_matrix():
    layer = AntisymmetricRNN(
        4,
        recurrent_initializer=keras.initializers.Constant(
            np.arange(16, dtype="float32").reshape(4, 4)
        ),
    )
    layer(np.zeros((1, 1, 1), "float32"))
    np.testing.assert_array_equal(layer.get_weights()[1], [1, 2, 3, 6, 7, 11])
