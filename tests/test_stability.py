"""keras_antisym/stability.py against NumPy, hand computations, autodiff and finite differences."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from benchmarks import reference
from keras_antisym import (
    AntisymmetricCell,
    AntisymmetricRNN,
    GatedAntisymmetricCell,
    GatedAntisymmetricRNN,
    eigenvalue_magnitude_stats,
    end_to_end_jacobian,
    end_to_end_jacobian_stats,
    ode_jacobian,
    stability_margin,
    step_jacobian,
    transition_eigenvalues,
    transition_matrix,
)
from tests.conftest import make_layer, random_weights


def two_by_two_cell(matrix, gamma, antisymmetric, epsilon=0.1):
    cell = AntisymmetricCell(2, epsilon=epsilon, gamma=gamma, antisymmetric=antisymmetric)
    cell.build((None, 2))
    matrix = np.asarray(matrix, "float32")
    cell.recurrent_kernel.assign(matrix[0, 1:2] if antisymmetric else matrix)
    cell.kernel.assign(np.zeros((2, 2), "float32"))
    return cell


# The paper's 2x2 examples (Section 4) with their stated eigenvalues.
PAPER_MATRICES = [
    ("W+", [[2, -2], [0, 2]], 0.0, False, [2, 2]),
    ("W-", [[-2, 2], [0, -2]], 0.0, False, [-2, -2]),
    ("W0", [[0, -2], [2, 0]], 0.0, True, [-2j, 2j]),
    ("Wdiff", [[0, -2], [2, 0]], 0.15, True, [-0.15 - 2j, -0.15 + 2j]),
]


@pytest.mark.parametrize("name,matrix,gamma,antisymmetric,expected", PAPER_MATRICES)
def test_paper_two_by_two_eigenvalues(name, matrix, gamma, antisymmetric, expected):
    cell = two_by_two_cell(matrix, gamma, antisymmetric)
    expected_matrix = np.asarray(matrix, float) - gamma * np.eye(2)
    np.testing.assert_allclose(transition_matrix(cell), expected_matrix, atol=1e-6)
    eig = transition_eigenvalues(cell)
    np.testing.assert_allclose(np.sort_complex(eig), np.sort_complex(expected), atol=1e-3)


@pytest.mark.parametrize("name,matrix,gamma,antisymmetric,expected", PAPER_MATRICES)
def test_paper_two_by_two_euler_margin(name, matrix, gamma, antisymmetric, expected):
    # At h = 0, x = 0, zero bias: J_f = M, margin = max |1 + ε λ(M)| by hand.
    cell = two_by_two_cell(matrix, gamma, antisymmetric)
    margin = stability_margin(cell, np.zeros(2), np.zeros(2))
    hand = max(abs(1 + 0.1 * complex(lam)) for lam in expected)
    assert margin == pytest.approx(hand, abs=1e-5)
    # Proposition 2: imaginary eigenvalues are Euler-unstable, diffusion fixes it
    # only partly at ε = 0.1 (|0.985 + 0.2i| = 1.005) but less than W0 (1.0198).
    expected_margin = {"W+": 1.2, "W-": 0.8, "W0": 1.04**0.5, "Wdiff": (0.985**2 + 0.04) ** 0.5}
    assert margin == pytest.approx(expected_margin[name], abs=1e-5)


def test_eigenvalues_match_numpy_on_random_cell():
    layer = make_layer("fused", False, 7, gamma=0.3)
    layer(np.zeros((1, 3, 4), "float32"))
    weights = random_weights(layer, seed=3)
    m = reference.transition_matrix(weights[1], 7, 0.3)
    np.testing.assert_allclose(transition_matrix(layer), m, atol=1e-6)
    eig = transition_eigenvalues(layer)
    np.testing.assert_allclose(np.sort(eig.imag), np.sort(np.linalg.eigvals(m).imag), atol=1e-5)
    # Antisymmetric minus γI: every real part is exactly -γ.
    np.testing.assert_allclose(eig.real, -0.3, atol=1e-5)


def test_eigenvalue_magnitude_stats_by_hand():
    mats = np.stack([np.diag([2.0, 0.5]), np.array([[0.0, -1.0], [1.0, 0.0]])])
    stats = eigenvalue_magnitude_stats(mats)
    magnitudes = np.array([2.0, 0.5, 1.0, 1.0])
    assert stats["eig_abs_mean"] == pytest.approx(magnitudes.mean())
    assert stats["eig_abs_std"] == pytest.approx(magnitudes.std())
    assert stats["eig_abs_max"] == pytest.approx(2.0)
    np.testing.assert_allclose(stats["singular_values"], [[2.0, 0.5], [1.0, 1.0]])


def _autodiff_step_jacobian(cell, h, x):
    h = tf.constant(h, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(h)
        h_new, _ = cell(tf.constant(x, tf.float32), [h])
    return tape.batch_jacobian(h_new, h).numpy()


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("activation", ["tanh", "softsign"])
def test_step_jacobian_matches_autodiff(gated, activation):
    rng = np.random.RandomState(1)
    cell_class = GatedAntisymmetricCell if gated else AntisymmetricCell
    cell = cell_class(5, epsilon=0.3, gamma=0.05, activation=activation)
    layer = keras.layers.RNN(cell)
    layer(np.zeros((1, 2, 3), "float32"))
    random_weights(layer, seed=2, scale=0.8)
    h = rng.standard_normal((4, 5)).astype("float32")
    x = rng.standard_normal((4, 3)).astype("float32")
    np.testing.assert_allclose(
        step_jacobian(layer, h, x), _autodiff_step_jacobian(cell, h, x), atol=2e-4
    )
    # Unbatched inputs give one matrix; the margin is its spectral radius.
    single = step_jacobian(cell, h[0], x[0])
    assert single.shape == (5, 5)
    radius = np.max(np.abs(np.linalg.eigvals(single)))
    assert stability_margin(cell, h[0], x[0]) == pytest.approx(radius, rel=1e-6)


def _finite_difference_end_to_end(weights, x, h0, gated, go_backwards, delta=1e-5):
    units = h0.shape[-1]
    jac = np.zeros((x.shape[0], units, units))
    for j in range(units):
        shift = np.zeros(units)
        shift[j] = delta
        kwargs = dict(units=units, epsilon=0.4, gamma=0.05, gated=gated, go_backwards=go_backwards)
        _, plus = reference.run(weights, x.astype("float64"), h0=h0 + shift, **kwargs)
        _, minus = reference.run(weights, x.astype("float64"), h0=h0 - shift, **kwargs)
        jac[:, :, j] = (plus - minus) / (2 * delta)
    return jac


@pytest.mark.parametrize(
    "gated,go_backwards", [(False, False), (True, False), (False, True)], ids=str
)
def test_end_to_end_jacobian_matches_finite_differences(gated, go_backwards):
    rng = np.random.RandomState(4)
    x = rng.standard_normal((3, 25, 2)).astype("float32")
    h0 = 0.3 * rng.standard_normal((3, 4))
    layer = make_layer("fused", gated, 4, epsilon=0.4, gamma=0.05, go_backwards=go_backwards)
    layer(x)
    weights = random_weights(layer, seed=5)
    jac, h_last = end_to_end_jacobian(layer, x, initial_state=h0, return_final_state=True)
    expected = _finite_difference_end_to_end(weights, x, h0, gated, go_backwards)
    np.testing.assert_allclose(jac, expected, atol=1e-4)
    _, states = reference.run(
        weights, x, units=4, epsilon=0.4, gamma=0.05, gated=gated, go_backwards=go_backwards, h0=h0
    )
    np.testing.assert_allclose(h_last, states, atol=1e-5)
    # Also the product of the step Jacobians along the trajectory.
    assert np.abs(jac - np.eye(4)).max() > 0.1


def test_small_gamma_keeps_magnitudes_near_one_and_large_gamma_vanishes():
    x = np.random.RandomState(0).standard_normal((4, 300, 3)).astype("float32")
    means = {}
    for gamma in (0.001, 10.0):
        layer = make_layer("fused", False, 16, epsilon=0.01, gamma=gamma)
        layer(x[:, :2])
        means[gamma] = end_to_end_jacobian_stats(layer, x)["eig_abs_mean"]
    assert 0.85 < means[0.001] < 1.15, means
    assert means[10.0] < 1e-3, means


def test_invalid_arguments():
    with pytest.raises(ValueError, match="Received an invalid value for argument `layer`"):
        transition_matrix(keras.layers.Dense(3))
    message = "argument `layer`, expected an AntisymmetricCell or a layer whose `cell` is one"
    with pytest.raises(ValueError, match=re.escape(f"{message}, got 'Dense'.")):
        transition_matrix(keras.layers.Dense(3))
    cell = AntisymmetricCell(3, name="unbuilt")
    with pytest.raises(ValueError, match="argument `layer`, expected a built layer"):
        transition_matrix(cell)
    message = "argument `layer`, expected a built layer (call it on data first), got 'unbuilt'."
    with pytest.raises(ValueError, match=re.escape(message)):
        transition_matrix(keras.layers.RNN(cell))
    cell.build((None, 2))
    with pytest.raises(ValueError, match="argument `sequences`"):
        end_to_end_jacobian(cell, np.zeros((2, 5, 4)))
    with pytest.raises(ValueError, match="argument `state`"):
        step_jacobian(cell, np.zeros((2, 4)), np.zeros((2, 2)))
    # Each message names the argument, the expected shape (2 input features, 3 units)
    # and the shape received.
    messages = [
        (
            lambda: end_to_end_jacobian(cell, np.zeros((2, 5, 4))),
            "argument `sequences`, expected a tensor of shape (batch, timesteps, 2), "
            "got (2, 5, 4).",
        ),
        (
            lambda: end_to_end_jacobian(cell, np.zeros((2, 5, 2)), initial_state=np.zeros(4)),
            "argument `initial_state`, expected a tensor of shape (features,) or "
            "(batch, features) with 3 features, got (1, 4).",
        ),
        (
            lambda: step_jacobian(cell, np.zeros((2, 3)), np.zeros((2, 5))),
            "argument `inputs`, expected a tensor of shape (features,) or "
            "(batch, features) with 2 features, got (2, 5).",
        ),
        (
            lambda: eigenvalue_magnitude_stats(np.zeros((2, 3))),
            "argument `matrices`, expected square matrices (..., n, n), got (1, 2, 3).",
        ),
    ]
    for call, message in messages:
        with pytest.raises(ValueError, match=re.escape(message)):
            call()


def test_stats_of_a_matrix_with_hand_computed_spectrum():
    # [[3, 4], [0, 1]]: eigenvalues 3 and 1; σ_max·σ_min = |det| = 3, σ_max² + σ_min² = 26.
    stats = eigenvalue_magnitude_stats(np.array([[3.0, 4.0], [0.0, 1.0]]))
    assert (stats["eig_abs_min"], stats["eig_abs_max"]) == pytest.approx((1.0, 3.0))
    assert stats["eig_abs_std"] == pytest.approx(1.0)
    assert stats["sv_max"] * stats["sv_min"] == pytest.approx(3.0)
    assert stats["sv_max"] ** 2 + stats["sv_min"] ** 2 == pytest.approx(26.0)
    assert stats["sv_min"] < 1 < stats["sv_max"]


@pytest.mark.parametrize("layer_class", [AntisymmetricRNN, GatedAntisymmetricRNN])
def test_ode_jacobian_has_imaginary_eigenvalues(layer_class):
    """Appendix B: the ODE's Jacobian diag(d)(W − Wᵀ) with d ≥ 0 has imaginary eigenvalues.

    `keras_antisym.ode_jacobian` (γ = 0) against NumPy's diag(d)·M for both
    cells; for the plain cell d = tanh' > 0, so its spectrum is imaginary. (The
    gated cell's d = c·σ'(a_z) + z·tanh'(a_c) can be negative: the paper only
    claims real parts "close to zero" there.)
    """
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


def test_pooled_statistics_against_numpy():
    """Min, max, mean and std pool eigenvalue magnitudes over the batch; singular values too."""
    mats = np.random.RandomState(0).standard_normal((3, 5, 5))
    stats = eigenvalue_magnitude_stats(mats)
    magnitudes = np.concatenate([np.abs(np.linalg.eigvals(m)) for m in mats])
    singular = np.stack([np.linalg.svd(m, compute_uv=False) for m in mats])
    assert stats["eig_abs_min"] == pytest.approx(magnitudes.min())
    assert stats["eig_abs_max"] == pytest.approx(magnitudes.max())
    assert stats["eig_abs_mean"] == pytest.approx(magnitudes.mean())
    assert stats["eig_abs_std"] == pytest.approx(magnitudes.std())
    assert stats["sv_min"] == pytest.approx(singular.min())
    assert stats["sv_max"] == pytest.approx(singular.max())
    np.testing.assert_allclose(stats["singular_values"], singular)
    # Float32 matrices are decomposed in float64: to float64 accuracy, not float32's.
    single = eigenvalue_magnitude_stats(mats.astype("float32"))
    widened = mats.astype("float32").astype("float64")
    magnitudes = np.abs(np.linalg.eigvals(widened)).ravel()
    assert single["eig_abs_mean"] == pytest.approx(magnitudes.mean(), rel=1e-12)
    assert single["eig_abs_std"] == pytest.approx(magnitudes.std(), rel=1e-12)
    assert single["singular_values"].dtype == np.float64
    np.testing.assert_allclose(
        single["singular_values"], np.linalg.svd(widened, compute_uv=False), rtol=1e-12
    )
    with pytest.raises(ValueError, match="argument `matrices`"):
        eigenvalue_magnitude_stats(np.zeros((2, 3)))


class WobblyCell(AntisymmetricCell):
    """A cell variant unknown to keras_antisym.stability: `f = tanh(a) - sin(a)/2`."""

    def vector_field(self, shared, blocks, return_slope=False):
        (projected,) = blocks
        a = shared + projected
        rate = ops.tanh(a) - 0.5 * ops.sin(a)
        if not return_slope:
            return rate
        return rate, 1.0 - ops.square(ops.tanh(a)) - 0.5 * ops.cos(a)


def test_a_new_cell_variant_needs_no_changes_to_stability():
    rng = np.random.RandomState(5)
    cell = WobblyCell(4, epsilon=0.3, gamma=0.05)
    layer = keras.layers.RNN(cell)
    x = rng.standard_normal((2, 6, 3)).astype("float32")
    layer(x)
    random_weights(layer, seed=6, scale=0.8)
    h = rng.standard_normal((2, 4)).astype("float32")
    np.testing.assert_allclose(
        step_jacobian(layer, h, x[:, 0]), _autodiff_step_jacobian(cell, h, x[:, 0]), atol=1e-5
    )
    h0 = tf.constant(h)
    with tf.GradientTape() as tape:
        tape.watch(h0)
        h_last = layer(x, initial_state=[h0])
    expected = tape.batch_jacobian(h_last, h0).numpy()
    jac, state = end_to_end_jacobian(layer, x, initial_state=h, return_final_state=True)
    np.testing.assert_allclose(jac, expected, atol=1e-5)
    np.testing.assert_allclose(state, h_last.numpy(), atol=1e-6)


@pytest.mark.parametrize("gated", [False, True])
def test_batched_margin_is_the_margin_of_each_state(gated):
    """Batched states give one margin per state, each the unbatched margin (the spectral
    radius of that state's own step Jacobian), not one maximum over the batch."""
    layer = make_layer("fused", gated, 4, epsilon=0.5, gamma=0.05)
    layer(np.zeros((1, 2, 3), "float32"))
    random_weights(layer, seed=11, scale=1.0)
    rng = np.random.RandomState(11)
    states = 2.0 * rng.standard_normal((3, 4)).astype("float32")
    inputs = 2.0 * rng.standard_normal((3, 3)).astype("float32")
    margins = stability_margin(layer, states, inputs)
    assert np.shape(margins) == (3,)
    for margin, h, x in zip(margins, states, inputs, strict=True):
        alone = stability_margin(layer, h, x)
        # A Python float. The slope comes from the layer's float32 step, whose products of
        # batch 3 and batch 1 may round apart (seen: 1.5e-8 relative); the three states'
        # margins differ by 1e-5 and more.
        assert type(alone) is float and margin == pytest.approx(alone, rel=1e-6)
        radius = np.max(np.abs(np.linalg.eigvals(step_jacobian(layer, h, x))))
        assert margin == pytest.approx(radius, rel=1e-6)
    assert len(set(np.round(margins, 6))) == 3  # distinct states, distinct margins


@pytest.mark.parametrize("gated", [False, True])
def test_unbatched_sequence_gives_an_unbatched_jacobian(gated):
    """`sequences` of shape `(timesteps, input_dim)` (and an unbatched `h_0`): the Jacobian
    `(units, units)` and `h_T` `(units,)` of that one sequence, against finite differences
    and the NumPy reference."""
    rng = np.random.RandomState(6)
    x = rng.standard_normal((12, 2)).astype("float32")
    h0 = 0.3 * rng.standard_normal(4)
    layer = make_layer("fused", gated, 4, epsilon=0.4, gamma=0.05)
    layer(x[None])
    weights = random_weights(layer, seed=6)
    jac, h_last = end_to_end_jacobian(layer, x, initial_state=h0, return_final_state=True)
    assert jac.shape == (4, 4) and h_last.shape == (4,)
    expected = _finite_difference_end_to_end(weights, x[None], h0[None], gated, False)[0]
    np.testing.assert_allclose(jac, expected, atol=1e-4)
    _, states = reference.run(
        weights, x[None], units=4, epsilon=0.4, gamma=0.05, gated=gated, h0=h0[None]
    )
    np.testing.assert_allclose(h_last, states[0], atol=1e-5)


def test_jacobian_stats_start_from_the_given_initial_state():
    """`end_to_end_jacobian_stats(..., initial_state=h0)` are the statistics of `∂h_T/∂h_0`
    along the trajectory from `h0` (finite differences of the NumPy reference), which
    differ from those from the zero state."""
    rng = np.random.RandomState(8)
    x = rng.standard_normal((2, 10, 2)).astype("float32")
    h0 = 1.5 * rng.standard_normal((2, 4))
    layer = make_layer("fused", False, 4, epsilon=0.4, gamma=0.05)
    layer(x)
    weights = random_weights(layer, seed=8, scale=1.0)
    stats = end_to_end_jacobian_stats(layer, x, initial_state=h0)
    jac = _finite_difference_end_to_end(weights, x, h0, False, False)
    magnitudes = np.abs(np.linalg.eigvals(jac)).ravel()
    singular = np.linalg.svd(jac, compute_uv=False)
    assert stats["eig_abs_mean"] == pytest.approx(magnitudes.mean(), rel=1e-4)
    assert stats["eig_abs_std"] == pytest.approx(magnitudes.std(), rel=1e-3)
    assert stats["sv_max"] == pytest.approx(singular.max(), rel=1e-4)
    assert stats["sv_min"] == pytest.approx(singular.min(), rel=1e-4)
    # From the zero state the trajectory, hence the Jacobian, differs for these weights.
    from_zero = _finite_difference_end_to_end(weights, x, np.zeros((2, 4)), False, False)
    assert abs(np.linalg.svd(from_zero, compute_uv=False).max() - singular.max()) > 1e-2


class CellHolder(keras.layers.Layer):
    """A layer holding an AntisymmetricCell as `cell`, with no `go_backwards` attribute."""

    def __init__(self, cell, **kwargs):
        super().__init__(**kwargs)
        self.cell = cell


def test_a_cell_or_a_layer_without_go_backwards_reads_forwards():
    """A bare cell, or a layer whose `cell` is one but without `go_backwards`, reads its
    sequences forwards: finite differences and states of the NumPy reference."""
    rng = np.random.RandomState(9)
    x = rng.standard_normal((2, 8, 2)).astype("float32")
    h0 = 0.3 * rng.standard_normal((2, 4))
    cell = AntisymmetricCell(4, epsilon=0.4, gamma=0.05)
    cell.build((None, 2))
    weights = random_weights(cell, seed=9, scale=1.0)
    expected = _finite_difference_end_to_end(weights, x, h0, False, False)
    _, states = reference.run(weights, x, units=4, epsilon=0.4, gamma=0.05, h0=h0)
    for layer in (cell, CellHolder(cell)):
        jac, h_last = end_to_end_jacobian(layer, x, initial_state=h0, return_final_state=True)
        np.testing.assert_allclose(jac, expected, atol=1e-4)
        np.testing.assert_allclose(h_last, states, atol=1e-5)


def test_jacobian_is_accumulated_in_the_weights_dtype():
    """With float16 weights, `∂h_T/∂h_0` and `h_T` are computed in float16 (every entry
    is a float16 number), even from float64 sequences and the default zero `h_0`; they
    still approximate the float64 reference (finite differences)."""
    keras.config.set_dtype_policy("float16")  # the conftest fixture restores float32
    rng = np.random.RandomState(10)
    x = rng.standard_normal((2, 6, 2))  # float64
    layer = make_layer("fused", False, 4, epsilon=0.4, gamma=0.05)
    layer(x.astype("float16"))
    random_weights(layer, seed=10)
    assert layer.cell.kernel.dtype == "float16"
    weights = [w.astype("float64") for w in layer.get_weights()]  # as rounded to float16
    jac, h_last = end_to_end_jacobian(layer, x, return_final_state=True)
    for value in (jac, h_last):
        np.testing.assert_array_equal(value.astype("float16").astype("float64"), value)
    expected = _finite_difference_end_to_end(weights, x, np.zeros((2, 4)), False, False)
    np.testing.assert_allclose(jac, expected, atol=2e-2)
    assert np.abs(jac - np.eye(4)).max() > 0.1
