"""`training.loop.evaluate`, the number every learning curve, `--keep-best` and the final
test accuracy come from, against a NumPy recomputation."""

import numpy as np

from training import loop, tasks


def _reference(logits, labels):
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_softmax[np.arange(len(labels)), labels].mean()
    accuracy = (logits.argmax(axis=1) == labels).mean()
    return loss, accuracy


def test_evaluate_is_the_mean_over_every_example_in_short_last_batches_too():
    task = tasks.get_task("digits")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 17, size=(23, 8, 8)).astype("float64")  # 23 = 8 + 8 + 7
    labels = rng.integers(0, 10, size=23)
    weights = rng.normal(size=(64, 10))

    def predict(x):  # a fixed linear classifier of the task's own inputs
        return x[:, :, 0] @ weights

    seen = []
    loss, accuracy = loop.evaluate(
        lambda x: seen.append(len(x)) or predict(x), task, images, labels, 8, 0
    )
    assert seen == [8, 8, 7]  # every example once, in batches of at most 8
    logits = (images.reshape(23, 64) / 16.0) @ weights
    expected_loss, expected_accuracy = _reference(logits, labels)
    assert 0.0 < expected_accuracy < 1.0  # the check below can tell hits from misses
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    assert accuracy == expected_accuracy


class _Writer:
    def __init__(self):
        self.scalars = []

    def scalar(self, name, value, step):
        self.scalars.append((name, value, step))


def test_diagnostics_probe_the_first_examples_and_write_log_and_keep_each_value():
    from training.models import build_model

    task = tasks.get_task("noise_padded_mnist", timesteps=32)
    model = build_model(task.spec, "antisymmetric", units=4, epsilon=0.1, gamma=0.1, seed=0)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 28, 28, 1)).astype("uint8")
    labels = rng.integers(0, 10, size=5)
    diagnostics = loop.Diagnostics(model, task, images, labels, every=3, probe_size=2)
    assert diagnostics.latest == {} and diagnostics.callback.every_n_steps == 3
    probe = diagnostics.callback.probe_x
    assert probe.shape == (2, 32, 28)  # the first two examples, rows then noise
    np.testing.assert_allclose(probe[:, :28], images[:2, :, :, 0] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(diagnostics.callback.probe_y, labels[:2])
    again = loop.Diagnostics(model, task, images, labels, every=3, probe_size=2)
    np.testing.assert_array_equal(again.callback.probe_x, probe)  # the noise is fixed too

    writer, lines = _Writer(), []
    diagnostics(5, writer, lines.append)
    latest = diagnostics.latest
    assert writer.scalars == [(name, value, 5) for name, value in latest.items()]
    # W - Wᵀ - γI: every eigenvalue's real part is -γ.
    np.testing.assert_allclose(latest["stability/antisymmetric/m_eig_real_max"], -0.1, rtol=1e-6)
    mean = latest["stability/antisymmetric/e2e_eig_abs_mean"]
    margin = latest["stability/antisymmetric/euler_margin"]
    assert lines == [
        f"step 5 diagnostics antisymmetric/e2e_eig_abs_mean={mean:.4g} "
        f"antisymmetric/euler_margin={margin:.4g}"
    ]
