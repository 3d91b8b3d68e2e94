"""keras_antisym.diagnostics against NumPy, hand-computed values and finite differences."""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_antisym import (
    AntisymmetricCell,
    GatedAntisymmetricCell,
    StabilityDiagnostics,
    diagnostics,
    eigenvalue_magnitude_stats,
    end_to_end_jacobian,
    end_to_end_jacobian_stats,
    stability_margin,
    step_jacobian,
    transition_eigenvalues,
    transition_matrix,
)
from tests import reference
from tests.conftest import make_layer, random_weights

ROOT = Path(__file__).resolve().parents[1]


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
    cell = AntisymmetricCell(3)
    with pytest.raises(ValueError, match="argument `layer`, expected a built layer"):
        transition_matrix(cell)
    cell.build((None, 2))
    with pytest.raises(ValueError, match="argument `sequences`"):
        end_to_end_jacobian(cell, np.zeros((2, 5, 4)))
    with pytest.raises(ValueError, match="argument `state`"):
        step_jacobian(cell, np.zeros((2, 4)), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="argument `every_n_steps`"):
        StabilityDiagnostics(every_n_steps=0)


def test_callback_logs_history_records_and_tensorboard(tmp_path):
    keras.utils.set_random_seed(0)
    rng = np.random.RandomState(0)
    x = rng.standard_normal((48, 30, 3)).astype("float32")
    y = (x[:, 0, 0] > 0).astype("int32")
    model = keras.Sequential(
        [
            keras.Input((30, 3)),
            keras.layers.Dense(4, name="embed"),
            make_layer("fused", True, 8, epsilon=0.1, gamma=0.01, name="arnn"),
            keras.layers.Dense(2, name="head"),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    probe = (x[:4], y[:4])
    callback = StabilityDiagnostics(every_n_steps=3, probe_data=probe, log_dir=tmp_path)
    history = model.fit(x, y, batch_size=8, epochs=2, callbacks=[callback], verbose=0).history
    assert [r["step"] for r in callback.records] == [3, 6, 9, 12]
    keys = [
        "stability/arnn/euler_margin",
        "stability/arnn/m_eig_real_max",
        "stability/arnn/e2e_eig_abs_mean",
        "stability/grad_norm/embed",
        "stability/grad_norm/arnn",
        "stability/grad_norm/head",
    ]
    for key in keys:
        assert len(history[key]) == 2 and np.all(np.isfinite(history[key])), key
    # The last record (step 12 = last batch) matches a direct computation on the
    # recurrent layer's own inputs (after the Dense embedding).
    last = callback.records[-1]
    layer = model.get_layer("arnn")
    embedded = model.get_layer("embed")(probe[0])
    stats = end_to_end_jacobian_stats(layer, embedded)
    assert last["stability/arnn/e2e_eig_abs_mean"] == pytest.approx(stats["eig_abs_mean"])
    assert last["stability/arnn/m_eig_real_max"] == pytest.approx(-0.01, abs=1e-5)
    # Gradient norm of the head against a hand-written TensorFlow computation.
    with tf.GradientTape() as tape:
        loss = model.loss(probe[1], model(probe[0], training=False))
    grads = tape.gradient(loss, model.get_layer("head").trainable_variables)
    hand = float(np.sqrt(sum(np.sum(g.numpy() ** 2) for g in grads)))
    assert last["stability/grad_norm/head"] == pytest.approx(hand, rel=1e-4)
    events = list((tmp_path / "stability").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    config = callback.get_config()
    assert StabilityDiagnostics(**config).every_n_steps == 3


JAX_SCRIPT = """
import json, sys
import keras, numpy as np
from keras_antisym import diagnostics
from tests.conftest import make_layer, random_weights
out = {"backend": keras.backend.backend()}
rng = np.random.RandomState(0)
x = rng.standard_normal((2, 40, 3)).astype("float32")
for gated in (False, True):
    layer = make_layer("fused", gated, 6, epsilon=0.2, gamma=0.05)
    layer(x)
    random_weights(layer, seed=7)
    h = 0.5 * rng.standard_normal((2, 6)).astype("float32")
    out[f"{gated}"] = {
        "eig": np.sort(diagnostics.transition_eigenvalues(layer).imag).tolist(),
        "step": diagnostics.step_jacobian(layer, h, x[:, 0]).tolist(),
        "margin": diagnostics.stability_margin(layer, h, x[:, 0]).tolist(),
        "e2e": diagnostics.end_to_end_jacobian(layer, x).tolist(),
    }
# The callback mid-epoch: JAX keeps the trained state outside the variables.
model = keras.Sequential([keras.Input((40, 3)), make_layer("fused", False, 6, name="arnn"),
                          keras.layers.Dense(2)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
y = np.array([0, 1])
callback = diagnostics.StabilityDiagnostics(every_n_steps=1, probe_data=(x, y))
model.fit(x, y, batch_size=1, epochs=1, callbacks=[callback], verbose=0)
record = callback.records[-1]
direct = diagnostics.end_to_end_jacobian_stats(model.get_layer("arnn"), x)["eig_abs_mean"]
out["callback"] = [record["stability/arnn/e2e_eig_abs_mean"], direct,
                   record["stability/grad_norm/arnn"]]
json.dump(out, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("backend", ["jax"])
def test_same_numbers_on_other_backend(backend, tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(JAX_SCRIPT)
    env = {**os.environ, "KERAS_BACKEND": backend, "CUDA_VISIBLE_DEVICES": ""}
    env["PYTHONPATH"] = str(ROOT)
    out_path = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, str(script), str(out_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    other = json.loads(out_path.read_text())
    assert other["backend"] == backend
    rng = np.random.RandomState(0)
    x = rng.standard_normal((2, 40, 3)).astype("float32")
    for gated in (False, True):
        layer = make_layer("fused", gated, 6, epsilon=0.2, gamma=0.05)
        layer(x)
        random_weights(layer, seed=7)
        h = 0.5 * rng.standard_normal((2, 6)).astype("float32")
        ours = other[f"{gated}"]
        eig = np.sort(transition_eigenvalues(layer).imag)
        np.testing.assert_allclose(ours["eig"], eig, atol=1e-5)
        np.testing.assert_allclose(ours["step"], step_jacobian(layer, h, x[:, 0]), atol=1e-5)
        np.testing.assert_allclose(ours["margin"], stability_margin(layer, h, x[:, 0]), atol=1e-5)
        np.testing.assert_allclose(ours["e2e"], end_to_end_jacobian(layer, x), atol=1e-4)
    logged, direct, grad_norm = other["callback"]
    assert logged == pytest.approx(direct, rel=1e-6) and grad_norm > 0


def test_module_exports():
    assert set(diagnostics.__all__) <= set(dir(diagnostics))


@pytest.mark.parametrize("go_backwards", [False, True])
def test_callback_margin_is_the_last_steps_against_numpy(go_backwards):
    """The logged Euler margin is Proposition 2's at the last step: (h_{T-1}, x_T)."""
    from tests import reference

    rng = np.random.RandomState(3)
    x = rng.standard_normal((3, 12, 2)).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((12, 2)),
            make_layer(
                "fused", False, 5, epsilon=0.4, gamma=0.05, go_backwards=go_backwards, name="arnn"
            ),
        ]
    )
    weights = [0.7 * rng.standard_normal(w.shape).astype("float32") for w in model.get_weights()]
    model.set_weights(weights)
    callback = StabilityDiagnostics(every_n_steps=1, probe_data=x, jacobian=False)
    callback.set_model(model)
    callback.on_train_begin()
    margin = callback.compute()["stability/arnn/euler_margin"]
    # NumPy: h_{T-1} from the reference, then the step Jacobian at (h_{T-1}, x_T).
    leading, last = (x[:, 1:], x[:, 0]) if go_backwards else (x[:, :-1], x[:, -1])
    _, h_prev = reference.run(
        weights, leading, units=5, epsilon=0.4, gamma=0.05, go_backwards=go_backwards
    )
    m = reference.transition_matrix(weights[1], 5, 0.05)
    expected = 0.0
    for b in range(3):
        a = m @ h_prev[b] + weights[0].T @ last[b] + weights[2]
        jac = np.diag(1 - np.tanh(a) ** 2) @ m
        expected = max(expected, np.max(np.abs(1 + 0.4 * np.linalg.eigvals(jac))))
    np.testing.assert_allclose(margin, expected, rtol=1e-5)


def test_stats_of_a_matrix_with_hand_computed_spectrum():
    # [[3, 4], [0, 1]]: eigenvalues 3 and 1; σ_max·σ_min = |det| = 3, σ_max² + σ_min² = 26.
    stats = eigenvalue_magnitude_stats(np.array([[3.0, 4.0], [0.0, 1.0]]))
    assert (stats["eig_abs_min"], stats["eig_abs_max"]) == pytest.approx((1.0, 3.0))
    assert stats["eig_abs_std"] == pytest.approx(1.0)
    assert stats["sv_max"] * stats["sv_min"] == pytest.approx(3.0)
    assert stats["sv_max"] ** 2 + stats["sv_min"] ** 2 == pytest.approx(26.0)
    assert stats["sv_min"] < 1 < stats["sv_max"]


@pytest.mark.parametrize("probe_steps", [4, None])
def test_callback_jacobian_stats_follow_probe_steps_against_numpy(probe_steps):
    """e2e statistics are those of J_T···J_1 over the first `probe_steps` steps (NumPy)."""
    from tests import reference

    rng = np.random.RandomState(7)
    x = rng.standard_normal((2, 10, 2)).astype("float32")
    model = keras.Sequential(
        [keras.Input((10, 2)), make_layer("fused", False, 4, epsilon=0.3, gamma=0.02, name="arnn")]
    )
    weights = [0.8 * rng.standard_normal(w.shape).astype("float32") for w in model.get_weights()]
    model.set_weights(weights)
    callback = StabilityDiagnostics(every_n_steps=1, probe_data=x, probe_steps=probe_steps)
    callback.set_model(model)
    callback.on_train_begin()
    values = callback.compute()
    steps = probe_steps or 10
    m = reference.transition_matrix(weights[1], 4, 0.02)
    products = []
    for b in range(2):
        h, product = np.zeros(4), np.eye(4)
        for t in range(steps):
            a = m @ h + weights[0].T @ x[b, t] + weights[2]
            product = (np.eye(4) + 0.3 * np.diag(1 - np.tanh(a) ** 2) @ m) @ product
            h = h + 0.3 * np.tanh(a)
        products.append(product)
    singular = np.concatenate([np.linalg.svd(p, compute_uv=False) for p in products])
    magnitudes = np.concatenate([np.abs(np.linalg.eigvals(p)) for p in products])
    assert values["stability/arnn/e2e_sv_min"] == pytest.approx(singular.min(), rel=1e-4)
    assert values["stability/arnn/e2e_sv_max"] == pytest.approx(singular.max(), rel=1e-4)
    assert values["stability/arnn/e2e_eig_abs_mean"] == pytest.approx(magnitudes.mean(), rel=1e-4)
