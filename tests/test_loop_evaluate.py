"""`training.run.loop.evaluate`, the number every learning curve, `--keep-best` and the final
test accuracy come from, against a NumPy recomputation."""

import json

import numpy as np

from tests.recording import RecordingWriter
from training.config import RunConfig
from training.run import loop
from training.run.callbacks import Diagnostics, LearningCurve
from training.tasks import catalog as tasks


def _bound(callback, trainer, writer=None, log=lambda line: None, start_step=0):
    """`callback` as a run of `trainer` holds it (what its hooks read: trainer, writer, log)."""
    loop.Run(RunConfig(), trainer, writer=writer, log=log, callbacks=[callback],
             start_step=start_step)  # fmt: skip
    return callback


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


def test_diagnostics_probe_the_first_examples_and_write_log_and_keep_each_value():
    from training.tasks.models import build_model

    task = tasks.get_task("noise_padded_mnist", timesteps=32)
    model = build_model(task.spec, "antisymmetric", units=4, epsilon=0.1, gamma=0.1, seed=0)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 28, 28, 1)).astype("uint8")
    labels = rng.integers(0, 10, size=5)
    writer, lines = RecordingWriter(), []
    trainer = type("Trainer", (), {"model": model})()
    diagnostics = _bound(Diagnostics(task, images, labels, every=3, probe_size=2), trainer,
                         writer, lines.append)  # fmt: skip
    assert diagnostics.latest == {} and diagnostics.callback.every_n_steps == 3
    probe = diagnostics.callback.probe_x
    assert probe.shape == (2, 32, 28)  # the first two examples, rows then noise
    np.testing.assert_allclose(probe[:, :28], images[:2, :, :, 0] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(diagnostics.callback.probe_y, labels[:2])
    again = _bound(Diagnostics(task, images, labels, every=3, probe_size=2), trainer)
    np.testing.assert_array_equal(again.callback.probe_x, probe)  # the noise is fixed too

    diagnostics.on_step_end(5, {})  # not a step of its period: nothing
    assert diagnostics.latest == {} and writer.scalars == [] and lines == []
    diagnostics.on_step_end(6, {})
    latest = diagnostics.latest
    assert writer.scalars == [(name, value, 6) for name, value in latest.items()]
    # W - Wᵀ - γI: every eigenvalue's real part is -γ.
    np.testing.assert_allclose(latest["stability/antisymmetric/m_eig_real_max"], -0.1, rtol=1e-6)
    mean = latest["stability/antisymmetric/e2e_eig_abs_mean"]
    margin = latest["stability/antisymmetric/euler_margin"]
    assert lines == [
        f"step 6 diagnostics antisymmetric/e2e_eig_abs_mean={mean:.4g} "
        f"antisymmetric/euler_margin={margin:.4g}"
    ]
    summary = {}
    diagnostics.on_train_end(summary)
    assert summary == {"diagnostics": latest}


def _record(curve, step, seconds, last=False):
    """A step's end as the run tells the curve (its logs), returned with what it added."""
    logs = {"train_seconds": seconds, "last": last}
    curve.on_step_end(step, logs)
    return logs


class _Linear:
    """A trainer whose predictions are a fixed linear map of the digits' pixels."""

    def __init__(self, weights):
        self.weights = weights

    def predict(self, x):
        return x[:, :, 0] @ self.weights


def test_the_learning_curve_records_evaluations_saves_and_resumes_its_clock(tmp_path):
    task = tasks.get_task("digits")
    rng = np.random.default_rng(1)
    images = rng.integers(0, 17, size=(12, 8, 8)).astype("float64")
    labels = rng.integers(0, 10, size=12)
    weights = rng.normal(size=(64, 10))
    loss, accuracy = _reference((images.reshape(12, 64) / 16.0) @ weights, labels)
    path = tmp_path / "curve.json"
    writer, lines = RecordingWriter(), []
    curve = _bound(LearningCurve(str(path), 5, "validation", (images, labels), task, 8, 0),
                   _Linear(weights), writer, lines.append)  # fmt: skip
    assert _record(curve, 4, 1.0) == {"train_seconds": 1.0, "last": False}  # not due
    for step, seconds in ((5, 1.5), (10, 2.5), (10, 3.0)):  # step 10 evaluated again
        logs = _record(curve, step, seconds)
    assert [(p["step"], p["train_seconds"]) for p in curve.points] == [(5, 1.5), (10, 3.0)]
    assert logs["validation_accuracy"] == accuracy  # what the best weights read
    assert logs["validation_loss"] == curve.points[-1]["validation_loss"]
    np.testing.assert_allclose(curve.points[-1]["validation_loss"], loss, rtol=1e-5)
    assert curve.points[-1]["validation_accuracy"] == accuracy
    assert writer.scalars[-2:] == [
        ("validation/accuracy", accuracy, 10),
        ("validation/loss", curve.points[-1]["validation_loss"], 10),
    ]
    assert lines[-1] == (
        f"step 10 validation_accuracy {accuracy:.4f} validation_loss "
        f"{curve.points[-1]['validation_loss']:.4f}"
    )
    _record(curve, 12, 4.0, last=True)  # the last step: evaluated off the period
    _record(curve, 20, 6.0)
    curve.on_checkpoint(20)
    body = {"split": "validation", "every": 5, "points": curve.points}
    assert path.read_text() == json.dumps(body, indent=1) + "\n"

    resumed = _bound(LearningCurve(str(path), 5, "validation", (images, labels), task, 8, 0),
                     _Linear(weights), start_step=15)  # fmt: skip
    resumed.on_train_begin()  # the checkpoint of step 15: the evaluation of step 20 is dropped
    assert [p["step"] for p in resumed.points] == [5, 10, 12]
    _record(resumed, 20, 0.5)
    assert resumed.points[-1]["train_seconds"] == 4.5  # the clock goes on from step 12's
    summary = {}
    resumed.on_train_end(summary)
    assert summary == {"train_seconds": 4.5}


def test_a_curve_without_points_starts_its_clock_at_zero(tmp_path):
    task = tasks.get_task("digits")
    images, labels = np.zeros((2, 8, 8)), np.zeros(2, "int64")
    for text in (None, '{"split": "test", "every": 5}'):
        path = tmp_path / "curve.json"
        if text is not None:
            path.write_text(text)
        curve = _bound(LearningCurve(str(path), 5, "test", (images, labels), task, 8, 0),
                       _Linear(np.zeros((64, 10))), start_step=10)  # fmt: skip
        curve.on_train_begin()
        assert curve.points == [] and curve.seconds_before == 0.0
        _record(curve, 5, 2.0)
        assert curve.points[0]["train_seconds"] == 2.0
    fresh = _bound(LearningCurve(str(tmp_path / "new.json"), 5, "test", (images, labels), task,
                                 8, 0), _Linear(np.zeros((64, 10))))  # fmt: skip
    _record(fresh, 5, 2.0)
    assert fresh.points[0]["train_seconds"] == 2.0  # without a resume too
    summary = {}
    _bound(LearningCurve(str(tmp_path / "none.json"), 5, "test", None, task, 8, 0),
           None).on_train_end(summary)  # fmt: skip
    assert summary == {}  # no points: the run's own training time stays


def _log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _spec(head, **extra):
    from types import SimpleNamespace

    return SimpleNamespace(head=head, **{"scored_steps": 0, "tolerance": 0.0, **extra})


def test_the_per_example_objectives_of_a_last_step_head_against_numpy():
    from keras import ops

    from training.tasks.objectives import per_example_correct, per_example_loss

    rng = np.random.default_rng(1)
    logits = rng.normal(size=(5, 4)).astype("float16")  # a mixed-precision model's output
    labels = np.array([0, 3, 1, 1, 2])
    spec = _spec("classification")
    loss = ops.convert_to_numpy(per_example_loss(spec, labels.astype("float32"), logits))
    expected = -_log_softmax(logits.astype("float64"))[np.arange(5), labels]
    assert loss.dtype == np.float32 and loss.shape == (5,)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    correct = ops.convert_to_numpy(per_example_correct(_spec("classification"), labels, logits))
    assert correct.dtype == np.float32
    np.testing.assert_array_equal(correct, logits.argmax(axis=-1) == labels)


def test_a_sequence_head_averages_every_step_s_loss_and_scores_its_last_steps():
    from keras import ops

    from training.tasks.objectives import per_example_correct, per_example_loss

    rng = np.random.default_rng(2)
    logits = rng.normal(size=(3, 6, 4)).astype("float32")
    labels = rng.integers(0, 4, size=(3, 6))
    labels[0, -2:] = logits[0, -2:].argmax(axis=-1)  # both scored steps right
    labels[1, -2:] = (logits[1, -2:].argmax(axis=-1) + 1) % 4  # both wrong
    labels[2, -2] = logits[2, -2].argmax()
    labels[2, -1] = (logits[2, -1].argmax() + 1) % 4  # one of the two
    labels[:, 0] = logits[:, 0].argmax(axis=-1)  # unscored steps never count
    spec = _spec("per_step_classification", scored_steps=2)
    loss = ops.convert_to_numpy(per_example_loss(spec, labels, logits))
    nll = -np.take_along_axis(_log_softmax(logits.astype("float64")), labels[..., None], -1)
    np.testing.assert_allclose(loss, nll[..., 0].mean(axis=1), rtol=1e-5)
    correct = ops.convert_to_numpy(per_example_correct(spec, labels, logits))
    np.testing.assert_array_equal(correct, [1.0, 0.0, 0.5])


def test_a_regression_head_is_the_mean_squared_error_and_the_share_within_tolerance():
    from keras import ops

    from training.tasks.objectives import per_example_correct, per_example_loss

    outputs = np.array([[0.5, 1.0], [2.0, -1.0], [0.0, 0.25]], "float16")
    targets = np.array([[0.5, 0.0], [2.5, -1.0], [0.125, 0.0]], "float64")
    spec = _spec("regression", tolerance=0.2)
    loss = ops.convert_to_numpy(per_example_loss(spec, targets, outputs))
    assert loss.dtype == np.float32
    np.testing.assert_allclose(loss, [0.5, 0.125, (0.125**2 + 0.25**2) / 2], rtol=1e-6)
    correct = ops.convert_to_numpy(per_example_correct(spec, targets, outputs))
    # errors: (0, 1), (0.5, 0), (0.125, 0.25): each output under 0.2 counts half
    np.testing.assert_array_equal(correct, [0.5, 0.5, 0.5])
    exact = ops.convert_to_numpy(per_example_correct(_spec("regression", tolerance=0.125),
                                                     targets, outputs))  # fmt: skip
    np.testing.assert_array_equal(exact, [0.5, 0.5, 0.0])  # under, not at, the tolerance


def test_the_objectives_compute_in_float32_whatever_keras_floatx_is():
    import keras
    from keras import ops

    from training.tasks.objectives import per_example_correct, per_example_loss

    logits = np.array([[2.0, 0.0], [0.0, 1.0]], "float64")
    labels = np.array([0, 0])
    floatx = keras.config.floatx()
    keras.config.set_floatx("float64")
    try:
        for spec in (_spec("classification"), _spec("regression", tolerance=0.5)):
            for objective in (per_example_loss, per_example_correct):
                value = objective(spec, labels if spec.head == "classification" else logits, logits)
                assert ops.convert_to_numpy(value).dtype == np.float32, (spec.head, objective)
    finally:
        keras.config.set_floatx(floatx)
