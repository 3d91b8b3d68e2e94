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
