"""keras_antisym/diagnostics.py: the `StabilityDiagnostics` callback, on every backend.

TensorFlow is imported only inside the tests that need it: the backend-agnostic tests
(`test_probe_values_and_gradient_norms_in_inference_mode_against_numpy`) also run under
`KERAS_BACKEND=jax` and `KERAS_BACKEND=torch`, where PyTorch's Triton aborts a process
that imported TensorFlow first.
"""

import inspect
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest

import keras_antisym
from benchmarks import reference
from keras_antisym import (
    StabilityDiagnostics,
    diagnostics,
    end_to_end_jacobian,
    end_to_end_jacobian_stats,
    stability,
    stability_margin,
    step_jacobian,
    transition_eigenvalues,
)
from tests.conftest import make_layer, random_weights
from tests.limits import limit

ROOT = Path(__file__).resolve().parents[1]


def test_callback_logs_history_records_and_tensorboard(tmp_path):
    import tensorflow as tf

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


def test_loss_fn_gives_gradient_norms_without_compiling():
    """A custom loop's model is not compiled: `loss_fn` names the loss to differentiate."""
    import tensorflow as tf

    keras.utils.set_random_seed(1)
    x = np.random.RandomState(1).standard_normal((4, 12, 3)).astype("float32")
    y = np.random.RandomState(2).standard_normal((4, 2)).astype("float32")
    model = keras.Sequential([keras.Input((12, 3)), make_layer("fused", False, 6, name="arnn"),
                              keras.layers.Dense(2, name="head")])  # fmt: skip

    def squared_error(y_true, y_pred):
        return keras.ops.mean(keras.ops.square(y_true - y_pred), axis=-1)

    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.reduce_mean(tf.square(y - model(x, training=False)), axis=-1))
    variables = model.get_layer("arnn").trainable_variables
    hand = float(np.sqrt(sum(np.sum(g.numpy() ** 2) for g in tape.gradient(loss, variables))))
    for loss_fn in (squared_error, "mean_squared_error"):
        callback = StabilityDiagnostics(every_n_steps=1, probe_data=(x, y), loss_fn=loss_fn)
        callback.set_model(model)
        callback.on_train_begin()
        values = callback.compute()
        assert values["stability/grad_norm/arnn"] == pytest.approx(hand, rel=1e-5), loss_fn
    restored = StabilityDiagnostics(**callback.get_config())
    assert restored.loss_fn(y, y).shape == (4,)
    assert float(keras.ops.max(restored.loss_fn(y, 0 * y))) > 0
    without = StabilityDiagnostics(every_n_steps=1, probe_data=(x, y))
    without.set_model(model)
    without.on_train_begin()
    assert not any("grad_norm" in key for key in without.compute())  # no loss: none
    with pytest.raises(ValueError, match="argument `loss_fn`, expected None, a loss name"):
        StabilityDiagnostics(loss_fn=3)


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
        timeout=limit(300),
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


def test_every_exported_name_is_importable_and_documented():
    """What `keras_antisym` and `diagnostics` export exists, is documented, and is one object."""
    for module in (keras_antisym, diagnostics, stability):
        for name in module.__all__:
            value = getattr(module, name)
            if name != "__version__":
                assert inspect.getdoc(value), f"{module.__name__}.{name} has no docstring"
    for name in stability.__all__:  # re-exported, not redefined
        assert getattr(diagnostics, name) is getattr(stability, name), name
    for name in keras_antisym.__all__:
        exec(f"from keras_antisym import {name}", {})


def test_invalid_arguments():
    with pytest.raises(ValueError, match="argument `every_n_steps`, expected a positive integer"):
        StabilityDiagnostics(every_n_steps=0)
    with pytest.raises(ValueError, match="argument `every_n_steps`"):
        StabilityDiagnostics(every_n_steps=True)
    with pytest.raises(ValueError, match="argument `probe_steps`, expected None or a positive"):
        StabilityDiagnostics(probe_steps=0)
    for probe_steps in (0, -2, True, 2.5, "4"):
        message = (
            f"argument `probe_steps`, expected None or a positive integer, got {probe_steps!r}."
        )
        with pytest.raises(ValueError, match=re.escape(message)):
            StabilityDiagnostics(probe_steps=probe_steps)
    assert StabilityDiagnostics(probe_steps=1).probe_steps == 1  # the smallest valid
    message = "argument `loss_fn`, expected None, a loss name or a callable(y_true, y_pred), got 3."
    with pytest.raises(ValueError, match=re.escape(message)):
        StabilityDiagnostics(loss_fn=3)


@pytest.mark.parametrize("go_backwards", [False, True])
def test_callback_margin_is_the_last_steps_against_numpy(go_backwards):
    """The logged Euler margin is Proposition 2's at the last step: (h_{T-1}, x_T)."""
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
    # Outside `fit`: `set_model` then `compute()` finds the layers and the probe itself.
    fresh = StabilityDiagnostics(every_n_steps=1, probe_data=x, jacobian=False)
    fresh.set_model(model)
    np.testing.assert_allclose(fresh.compute()["stability/arnn/euler_margin"], expected, rtol=1e-5)


@pytest.mark.parametrize("probe_steps", [4, None])
def test_callback_jacobian_stats_follow_probe_steps_against_numpy(probe_steps):
    """e2e statistics are those of J_T···J_1 over the first `probe_steps` steps (NumPy)."""
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
    assert values["stability/arnn/e2e_eig_abs_std"] == pytest.approx(magnitudes.std(), rel=1e-3)
    m_eig = np.linalg.eigvals(m)
    assert values["stability/arnn/m_eig_real_max"] == pytest.approx(m_eig.real.max(), abs=1e-6)
    assert values["stability/arnn/m_eig_abs_max"] == pytest.approx(np.abs(m_eig).max(), rel=1e-5)


def test_batch_logs_and_tensorboard_scalars_carry_every_computed_value(tmp_path):
    """Each evaluation reaches the batch's `logs` (seen by a later callback) and is written
    as one TensorBoard scalar per name at its global step, with the value in `records`."""
    import tensorflow as tf

    keras.utils.set_random_seed(2)
    rng = np.random.RandomState(2)
    x = rng.standard_normal((16, 6, 3)).astype("float32")
    y = (x[:, 0, 0] > 0).astype("int32")
    model = keras.Sequential(
        [keras.Input((6, 3)), make_layer("fused", False, 4, name="arnn"), keras.layers.Dense(2)]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = StabilityDiagnostics(every_n_steps=2, probe_data=x[:2], log_dir=tmp_path)
    seen = {}

    def record_batch_logs(batch, logs):
        seen[batch] = dict(logs or {})

    later = keras.callbacks.LambdaCallback(on_train_batch_end=record_batch_logs)
    model.fit(x, y, batch_size=4, epochs=1, callbacks=[callback, later], verbose=0)
    assert [r["step"] for r in callback.records] == [2, 4]
    margin = "stability/arnn/euler_margin"
    # Batches 1 and 3 (steps 2 and 4) carry that step's values; batch 0 computed nothing.
    assert margin not in seen[0]
    for batch, record in zip((1, 3), callback.records, strict=True):
        assert seen[batch][margin] == pytest.approx(record[margin])

    written = {}
    for path in (tmp_path / "stability").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                written[(value.tag, event.step)] = float(tf.make_ndarray(value.tensor))
    expected = {
        (name, record["step"]): value
        for record in callback.records
        for name, value in record.items()
        if name != "step"
    }
    assert set(written) == set(expected)
    for key, value in expected.items():
        assert written[key] == pytest.approx(value, rel=1e-6), key


@pytest.mark.parametrize("nested", [True, False], ids=["nested", "top_level"])
def test_without_probe_a_nested_layer_gets_the_margin_at_zero_state_and_input(nested):
    """A layer inside a nested model is found; without a probe its Euler margin is taken
    at `h = 0, x = 0`: `max |1 + ε·λ(diag(tanh'(b))·M)|`, computed here in NumPy (for a
    top-level layer too, whose inputs the callback could extract)."""
    deep = make_layer("fused", False, 5, epsilon=0.5, gamma=0.1, name="deep")
    inner = keras.Sequential([keras.Input((6, 3)), deep], name="inner") if nested else deep
    model = keras.Sequential([keras.Input((6, 3)), inner, keras.layers.Dense(2)])
    weights = random_weights(deep, seed=8, scale=1.0)
    callback = StabilityDiagnostics(every_n_steps=1)
    callback.set_model(model)
    callback.on_train_begin()
    values = callback.compute()
    assert set(values) == {
        "stability/deep/m_eig_real_max",
        "stability/deep/m_eig_abs_max",
        "stability/deep/euler_margin",
    }
    m = reference.transition_matrix(weights[1], 5, 0.1)
    slope = 1.0 - np.tanh(weights[2].astype("float64")) ** 2
    hand = np.max(np.abs(1.0 + 0.5 * np.linalg.eigvals(slope[:, None] * m)))
    assert values["stability/deep/euler_margin"] == pytest.approx(hand, rel=1e-5)
    assert values["stability/deep/m_eig_real_max"] == pytest.approx(-0.1, abs=1e-5)


class Idle(keras.layers.Layer):
    """An identity layer with a trainable weight that no output depends on."""

    def build(self, input_shape):
        self.unused = self.add_weight(shape=(2,), initializer="ones", name="unused")

    def call(self, inputs):
        return inputs


def _numpy_loss(arnn_weights, head_weights, x, y, units, epsilon, gamma):
    """Mean squared error of `Dense(h_T)` against `y`, all in float64 NumPy."""
    _, h_last = reference.run(arnn_weights, x, units=units, epsilon=epsilon, gamma=gamma)
    y_pred = h_last @ head_weights[0] + head_weights[1]
    return np.mean((y - y_pred) ** 2)


def _finite_difference_norms(arnn_weights, head_weights, x, y, delta=1e-6, **kwargs):
    """L2 norms of the loss gradient for the recurrent layer's and the head's weights,
    by central finite differences of `_numpy_loss` in float64."""
    arnn = [w.astype("float64") for w in arnn_weights]
    head = [w.astype("float64") for w in head_weights]
    norms = []
    for group in (arnn, head):
        squares = 0.0
        for w in group:
            for index in np.ndindex(w.shape):
                saved = w[index]
                w[index] = saved + delta
                plus = _numpy_loss(arnn, head, x, y, **kwargs)
                w[index] = saved - delta
                minus = _numpy_loss(arnn, head, x, y, **kwargs)
                w[index] = saved
                squares += ((plus - minus) / (2 * delta)) ** 2
        norms.append(np.sqrt(squares))
    return norms


def _numpy_last_step_values(weights, x, units, epsilon, gamma):
    """Proposition 2's margin at `(h_{T-1}, x_T)` (maximum over the batch) and the
    eigenvalue magnitudes and singular values of `∂h_T/∂h_0`, in NumPy."""
    m = reference.transition_matrix(weights[1], units, gamma)
    margin, magnitudes, singular = 0.0, [], []
    for sequence in x.astype("float64"):
        h, product = np.zeros(units), np.eye(units)
        for t, x_t in enumerate(sequence):
            a = m @ h + weights[0].T @ x_t + weights[2]
            jac = np.diag(1 - np.tanh(a) ** 2) @ m
            if t == len(sequence) - 1:
                margin = max(margin, np.max(np.abs(1 + epsilon * np.linalg.eigvals(jac))))
            product = (np.eye(units) + epsilon * jac) @ product
            h = h + epsilon * np.tanh(a)
        magnitudes.extend(np.abs(np.linalg.eigvals(product)))
        singular.extend(np.linalg.svd(product, compute_uv=False))
    return margin, np.array(magnitudes), np.array(singular)


def test_probe_values_and_gradient_norms_in_inference_mode_against_numpy():
    """Backend-agnostic (run it under KERAS_BACKEND=jax and torch too): with a compiled
    loss name, the gradient norms are those of the loss in inference mode (no noise, no
    dropout), per layer, against finite differences of the NumPy reference; the layer's
    probe inputs skip the noise too; a weight the loss ignores has a zero norm."""
    units, epsilon, gamma = 3, 0.4, 0.05
    rng = np.random.RandomState(12)
    x = rng.standard_normal((3, 5, 2)).astype("float32")
    y = rng.standard_normal((3, 2)).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((5, 2)),
            keras.layers.GaussianNoise(1.0, name="noise"),
            make_layer("fused", False, units, epsilon=epsilon, gamma=gamma, name="arnn"),
            keras.layers.Dropout(0.5, name="drop"),
            keras.layers.Dense(2, name="head"),
            Idle(name="idle"),
        ]
    )
    model.compile("sgd", "mean_squared_error")  # a loss name, resolved by the callback
    arnn_weights = random_weights(model.get_layer("arnn"), seed=12, scale=0.8)
    head_weights = random_weights(model.get_layer("head"), seed=13, scale=0.8)
    callback = StabilityDiagnostics(every_n_steps=1, probe_data=(x, y))
    callback.set_model(model)
    callback.on_train_begin()
    values = callback.compute()
    kwargs = dict(units=units, epsilon=epsilon, gamma=gamma)
    arnn_norm, head_norm = _finite_difference_norms(arnn_weights, head_weights, x, y, **kwargs)
    assert values["stability/grad_norm/arnn"] == pytest.approx(arnn_norm, rel=1e-4)
    assert values["stability/grad_norm/head"] == pytest.approx(head_norm, rel=1e-4)
    assert values.get("stability/grad_norm/idle", 0.0) == 0.0  # no gradient: zero, or none
    assert not any(key.endswith(("/noise", "/drop")) for key in values)  # no weights
    margin, magnitudes, singular = _numpy_last_step_values(arnn_weights, x, **kwargs)
    assert values["stability/arnn/euler_margin"] == pytest.approx(margin, rel=1e-5)
    assert values["stability/arnn/e2e_eig_abs_mean"] == pytest.approx(magnitudes.mean(), rel=1e-5)
    assert values["stability/arnn/e2e_sv_max"] == pytest.approx(singular.max(), rel=1e-5)


def test_fit_twice_with_log_dir_and_once_without(tmp_path):
    """The TensorBoard writer is closed at train end and a new one opened by the next
    `fit`: both runs' scalars are written; a callback without `log_dir` writes nothing,
    and an epoch that ends before any evaluation adds nothing to the history."""
    import tensorflow as tf

    log_dir = tmp_path / "logs"
    rng = np.random.RandomState(4)
    x = rng.standard_normal((8, 4, 2)).astype("float32")
    y = rng.standard_normal((8, 1)).astype("float32")
    model = keras.Sequential(
        [keras.Input((4, 2)), make_layer("fused", False, 3, name="arnn"), keras.layers.Dense(1)]
    )
    model.compile("sgd", "mean_squared_error")
    callback = StabilityDiagnostics(every_n_steps=2, probe_data=x[:2], log_dir=log_dir)
    for _ in range(2):
        model.fit(x, y, batch_size=2, epochs=1, callbacks=[callback], verbose=0)
    margin = "stability/arnn/euler_margin"
    written = {}
    for path in (log_dir / "stability").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == margin:
                    written[event.step] = float(tf.make_ndarray(value.tensor))
    assert len(callback.records) == 4  # 4 batches per fit, every 2
    assert written == pytest.approx({r["step"]: r[margin] for r in callback.records}, rel=1e-6)
    # Without log_dir; the first epoch ends before any evaluation (at the 5th batch).
    quiet = StabilityDiagnostics(every_n_steps=5, probe_data=x[:2])
    history = model.fit(x, y, batch_size=2, epochs=2, callbacks=[quiet], verbose=0).history
    assert [r["step"] for r in quiet.records] == [5]
    assert history[margin] == pytest.approx([quiet.records[-1][margin]])  # epoch 2's only
    assert quiet.log_dir is None and sorted(os.listdir(log_dir)) == ["stability"]


def test_default_schedule_is_every_100_batches():
    """`every_n_steps` defaults to 100: evaluations at the 100th and 200th batches only."""
    model = keras.Sequential([keras.Input((4, 2)), make_layer("fused", False, 3, name="arnn")])
    callback = StabilityDiagnostics()
    callback.set_model(model)
    callback.on_train_begin()
    logged = []
    for batch in range(250):
        logs = {}
        callback.on_train_batch_end(batch, logs)
        if logs:
            logged.append(batch + 1)
    assert logged == [100, 200] and [r["step"] for r in callback.records] == [100, 200]


def test_recurrent_layers_of_objects_without_layers_and_loss():
    """Neither a layer nor a bare object has `layers` or `loss`: no recurrent layers, no
    loss (a loss name resolves to the Keras loss; a non-callable loss gives none)."""
    assert diagnostics._recurrent_layers(keras.layers.Dense(2)) == []
    assert diagnostics._recurrent_layers(object()) == []
    assert diagnostics._loss_function(object()) is None
    named = type("Compiled", (), {"loss": "mean_squared_error"})()
    resolved = diagnostics._loss_function(named)
    y_true, y_pred = np.array([[1.0, 2.0]]), np.array([[0.0, 4.0]])
    assert float(keras.ops.convert_to_numpy(resolved(y_true, y_pred))[0]) == pytest.approx(2.5)
    assert diagnostics._loss_function(type("Multi", (), {"loss": {"out": "mse"}})()) is None


def test_a_model_compiled_with_several_losses_logs_no_gradient_norms():
    """Gradient norms use the compiled loss only when it is a single one (a dict of losses
    per output gives none), or `loss_fn`."""
    rng = np.random.RandomState(5)
    x = rng.standard_normal((2, 4, 2)).astype("float32")
    y = rng.standard_normal((2, 1)).astype("float32")
    inputs = keras.Input((4, 2))
    outputs = keras.layers.Dense(1, name="out")(make_layer("fused", False, 3, name="arnn")(inputs))
    model = keras.Model(inputs, {"out": outputs})
    model.compile("sgd", {"out": "mean_squared_error"})
    callback = StabilityDiagnostics(every_n_steps=1, probe_data=(x, {"out": y}))
    callback.set_model(model)
    callback.on_train_begin()
    values = callback.compute()
    assert "stability/arnn/euler_margin" in values
    assert not any("grad_norm" in key for key in values)


def test_probe_of_a_two_input_model_reaches_the_recurrent_layer():
    """With several model inputs the probe is the list of inputs: the recurrent layer's
    own inputs (their concatenation here) give the margin and Jacobian (NumPy)."""
    units, epsilon, gamma = 4, 0.3, 0.05
    rng = np.random.RandomState(6)
    first = rng.standard_normal((2, 6, 2)).astype("float32")
    second = rng.standard_normal((2, 6, 1)).astype("float32")
    inputs = [keras.Input((6, 2)), keras.Input((6, 1))]
    layer = make_layer("fused", False, units, epsilon=epsilon, gamma=gamma, name="arnn")
    model = keras.Model(inputs, layer(keras.layers.Concatenate()(inputs)))
    weights = random_weights(layer, seed=6, scale=0.8)
    # `(x, y)` with `x` the list of inputs (a bare list would read as `(x, y)`).
    callback = StabilityDiagnostics(every_n_steps=1, probe_data=([first, second], None))
    callback.set_model(model)
    callback.on_train_begin()
    values = callback.compute()
    x = np.concatenate([first, second], axis=-1)
    margin, magnitudes, singular = _numpy_last_step_values(
        weights, x, units=units, epsilon=epsilon, gamma=gamma
    )
    assert values["stability/arnn/euler_margin"] == pytest.approx(margin, rel=1e-5)
    assert values["stability/arnn/e2e_eig_abs_mean"] == pytest.approx(magnitudes.mean(), rel=1e-5)
    assert values["stability/arnn/e2e_sv_min"] == pytest.approx(singular.min(), rel=1e-4)


def test_single_input_probe_computes_without_warnings():
    """A single-input model is probed with its one input: Keras warns of no mismatched
    input structure, and the values are the NumPy reference's."""
    units, epsilon, gamma = 3, 0.3, 0.05
    x = np.random.RandomState(8).standard_normal((2, 5, 2)).astype("float32")
    layer = make_layer("fused", False, units, epsilon=epsilon, gamma=gamma, name="arnn")
    model = keras.Sequential([keras.Input((5, 2)), layer])
    weights = random_weights(layer, seed=8, scale=0.8)
    callback = StabilityDiagnostics(every_n_steps=1, probe_data=x)
    callback.set_model(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        callback.on_train_begin()
        values = callback.compute()
    margin, _, _ = _numpy_last_step_values(weights, x, units=units, epsilon=epsilon, gamma=gamma)
    assert values["stability/arnn/euler_margin"] == pytest.approx(margin, rel=1e-5)


class Subclassed(keras.Model):
    """A subclassed model: no symbolic inputs to extract the recurrent layer's inputs."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.arnn = make_layer("fused", False, 3, epsilon=0.4, gamma=0.05, name="arnn")
        self.head = keras.layers.Dense(2, name="head")

    def call(self, inputs):
        return self.head(self.arnn(inputs))


def test_a_subclassed_model_still_gets_matrix_stats_and_gradient_norms():
    """A subclassed model has no symbolic inputs: its layers still get the statistics of
    `M` and, on the probe, the gradient norms (against NumPy finite differences)."""
    rng = np.random.RandomState(9)
    x = rng.standard_normal((3, 5, 2)).astype("float32")
    y = rng.standard_normal((3, 2)).astype("float32")
    model = Subclassed()
    model(x)
    arnn_weights = random_weights(model.arnn, seed=9, scale=0.8)
    head_weights = random_weights(model.head, seed=10, scale=0.8)
    callback = StabilityDiagnostics(every_n_steps=1, probe_data=(x, y), loss_fn="mse")
    callback.set_model(model)
    callback.on_train_begin()
    values = callback.compute()
    m = reference.transition_matrix(arnn_weights[1], 3, 0.05)
    assert values["stability/arnn/m_eig_real_max"] == pytest.approx(-0.05, abs=1e-6)
    assert values["stability/arnn/m_eig_abs_max"] == pytest.approx(
        np.abs(np.linalg.eigvals(m)).max(), rel=1e-5
    )
    assert np.isfinite(values["stability/arnn/euler_margin"])
    arnn_norm, head_norm = _finite_difference_norms(
        arnn_weights, head_weights, x, y, units=3, epsilon=0.4, gamma=0.05
    )
    assert values["stability/grad_norm/arnn"] == pytest.approx(arnn_norm, rel=1e-4)
    assert values["stability/grad_norm/head"] == pytest.approx(head_norm, rel=1e-4)
