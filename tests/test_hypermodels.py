"""The tuner's hypermodel trains with every sampled hyperparameter, as the trial records it.

`RNNHyperModel.build(hp)` declares the search space on `hp` and builds the
model; `fit(hp, model)` makes the optimizer and a trainer for it. These tests
fix every hyperparameter of the space to a chosen value (as `hp.Fixed` from a
one-value grid, as an `hp.Choice` or an `hp.Float` that a tuner's oracle has
filled in) and read each one back from what was built: the recurrent layer's
`epsilon` and `gamma`, its recurrent initializer and weights for `sigma_w`,
the trainer's optimizer class and learning rate. `CHECKS` has one check per
hyperparameter of the space: a hyperparameter added to the space fails here
until it has one.
"""

import math

import keras
import keras_tuner
import numpy as np
import pytest

import keras_antisym
from training.backends.strategies import TensorFlowBackend
from training.config import RunConfig
from training.run import loop
from training.search import hypermodels
from training.search import tuner as search
from training.search.space import MODEL_HYPERPARAMETERS, PAPER_GRID, SearchSpace
from training.tasks import catalog as tasks
from training.tune import SearchConfig

UNITS = 32

# The settings every trial shares: values that no assignment below uses, so that a
# hypermodel reading them instead of the trial's hyperparameters fails.
SHARED = RunConfig.of(
    task="digits",
    units=UNITS,
    epsilon=0.11,
    gamma=0.013,
    sigma_w=1.0,
    optimizer="adam",
    learning_rate=0.0017,
    momentum=0.55,
    clipnorm=0.7,
    batch_size=16,
    validation_fraction=0.2,
).validate()

# Assignments of every hyperparameter of the space, none at a default.
ASSIGNMENTS = [
    {"epsilon": 0.37, "gamma": 0.023, "sigma_w": 2.5, "learning_rate": 0.042, "optimizer": "sgd"},
    {"epsilon": 1.0, "gamma": 0.3, "sigma_w": 0.0, "learning_rate": 0.75, "optimizer": "adagrad"},
    {"epsilon": 0.05, "gamma": 0.0, "sigma_w": 16.0, "learning_rate": 0.2, "optimizer": "sgd"},
]

# The recurrent layer of each model: (class, antisymmetric recurrent matrix or None).
MODEL_LAYERS = {
    "antisymmetric": (keras_antisym.AntisymmetricRNN, True),
    "gated": (keras_antisym.GatedAntisymmetricRNN, True),
    "ablation": (keras_antisym.GatedAntisymmetricRNN, False),
    "lstm": (keras.layers.LSTM, None),
}
OPTIMIZER_CLASSES = {
    "sgd": keras.optimizers.SGD,
    "adagrad": keras.optimizers.Adagrad,
    "adam": keras.optimizers.Adam,
}


def _check_epsilon(layer, optimizer, value):
    assert layer.epsilon == pytest.approx(value)
    assert layer.get_config()["epsilon"] == pytest.approx(value)


def _check_gamma(layer, optimizer, value):
    assert layer.gamma == pytest.approx(value)
    assert layer.get_config()["gamma"] == pytest.approx(value)


def _check_sigma_w(layer, optimizer, value):
    """The recurrent initializer draws N(0, sigma_w²/units), and the weights show it."""
    initializer = layer.get_config()["recurrent_initializer"]
    assert initializer["config"]["sigma"] == pytest.approx(value)
    (recurrent,) = [w for w in layer.weights if w.path.endswith("recurrent_kernel")]
    drawn = np.asarray(recurrent.numpy())
    expected = value / math.sqrt(UNITS)
    assert float(drawn.std()) == pytest.approx(expected, rel=0.15, abs=1e-12)


def _check_learning_rate(layer, optimizer, value):
    assert float(optimizer.learning_rate) == pytest.approx(value, rel=1e-6)


def _check_optimizer(layer, optimizer, value):
    assert type(optimizer) is OPTIMIZER_CLASSES[value]


# One check per hyperparameter: (recurrent layer, trainer's optimizer, value) -> asserts.
CHECKS = {
    "epsilon": _check_epsilon,
    "gamma": _check_gamma,
    "sigma_w": _check_sigma_w,
    "learning_rate": _check_learning_rate,
    "optimizer": _check_optimizer,
}


class _TrainerMade(Exception):
    """Stops `fit` once its trainer exists (nothing needs to train)."""


class _RecordingBackend(TensorFlowBackend):
    """The backend of this process, keeping the trainers it makes (and stopping `fit` at
    the first with `stop`)."""

    def __init__(self, stop=False):
        super().__init__()
        self.made, self.stop = [], stop

    def make_trainer(self, *args, **kwargs):
        self.made.append(super().make_trainer(*args, **kwargs))
        if self.stop:
            raise _TrainerMade
        return self.made[-1]


def _space_and_hp(assignment, how, model_name):
    """A `SearchSpace` and `HyperParameters` on which `declare` yields `assignment`'s values
    of `model_name`'s hyperparameters."""
    hp = keras_tuner.HyperParameters()
    if how == "fixed":  # one-value grids: hp.Fixed
        return SearchSpace({name: [value] for name, value in assignment.items()}), hp
    # Several values per grid (hp.Choice, or hp.Float with log_scale), the trial's
    # value filled in as a tuner's oracle does before it calls `build`.
    grids = {}
    for name, value in assignment.items():
        if name == "optimizer":
            grids[name] = [value, "adam"]
        else:
            grids[name] = [value, value + 1.0] if value == 0 else [value / 2, value, value * 2]
    hp.values.update({name: assignment[name] for name in MODEL_HYPERPARAMETERS[model_name]})
    return SearchSpace(grids, log_scale=how == "range"), hp


def _build_and_make_trainer(monkeypatch, model_name, assignment, how, shared=SHARED):
    """`build` then `fit` up to its trainer; returns (hp, model, trainer)."""
    space, hp = _space_and_hp(assignment, how, model_name)
    task = tasks.get_task(shared.task.name)
    config = shared.replace(model=model_name)
    backend = _RecordingBackend(stop=True)
    hypermodel = hypermodels.RNNHyperModel(task, config, space, steps_per_trial=4,
                                           backend=backend, log=print)  # fmt: skip
    model = hypermodel.build(hp)
    with pytest.raises(_TrainerMade):
        hypermodel.fit(hp, model)
    (trainer,) = backend.made
    return hp, model, trainer


def test_every_hyperparameter_of_the_space_has_a_check_and_a_value():
    """`CHECKS` and each assignment cover exactly the space's hyperparameters, and every
    model's hyperparameters are among them."""
    assert set(CHECKS) == set(PAPER_GRID)
    for assignment in ASSIGNMENTS:
        assert set(assignment) == set(PAPER_GRID)
    for names in MODEL_HYPERPARAMETERS.values():
        assert set(names) <= set(CHECKS)


@pytest.mark.parametrize("how", ["fixed", "choice", "range"])
@pytest.mark.parametrize("model_name", sorted(MODEL_HYPERPARAMETERS))
def test_the_built_model_and_its_optimizer_carry_every_sampled_value(monkeypatch, model_name, how):
    """For each assignment: the trial's hyperparameters are the model's, the model `fit`
    trains is the one `build` returned, and each sampled value is found in the recurrent
    layer or the trainer's optimizer; the model and the shared settings (units, momentum,
    clipnorm) come from the run's config."""
    for assignment in ASSIGNMENTS:
        hp, model, trainer = _build_and_make_trainer(monkeypatch, model_name, assignment, how)
        assert set(hp.values) == set(MODEL_HYPERPARAMETERS[model_name])
        assert trainer.model is model
        layer = model.layers[0]
        layer_class, antisymmetric = MODEL_LAYERS[model_name]
        assert type(layer) is layer_class
        assert getattr(layer, "antisymmetric", None) is antisymmetric
        assert layer.units == UNITS
        optimizer = trainer.optimizer
        for name, value in hp.values.items():
            assert value == assignment[name], name
            CHECKS[name](layer, optimizer, value)
        assert optimizer.clipnorm == pytest.approx(SHARED.optimizer.clipnorm)
        if assignment["optimizer"] == "sgd":
            assert float(optimizer.momentum) == pytest.approx(SHARED.optimizer.momentum)


@pytest.mark.parametrize("model_name", ["gated", "lstm"])
def test_retraining_the_best_trial_runs_with_its_hyperparameters(monkeypatch, model_name):
    """`search.retrain` trains a run whose config holds every hyperparameter of the best
    trial (fields named as the hyperparameters) and the shared settings for the rest."""
    runs = []
    monkeypatch.setattr(search, "train_and_evaluate", lambda config, *a, **k: runs.append(config))
    for assignment in ASSIGNMENTS:
        best = {name: assignment[name] for name in MODEL_HYPERPARAMETERS[model_name]}
        run = SHARED.replace(model=model_name)
        config = SearchConfig(run=run, space=SearchSpace(), retrain_steps=7)
        search.retrain(config, best, log=print)
        retrained = runs.pop()
        assert retrained.loop.steps == 7
        # A short retraining checkpoints and logs at its end, a long one every 200 and 50.
        assert (retrained.loop.checkpoint_every, retrained.loop.log_every) == (7, 7)
        for name in PAPER_GRID:
            expected = best.get(name, run.to_dict()[name])
            assert retrained.to_dict()[name] == expected, name
    search.retrain(SearchConfig(run=run, space=SearchSpace(), retrain_steps=1000), best)
    long = runs.pop().loop
    assert (long.steps, long.checkpoint_every, long.log_every) == (1000, 200, 50)


@pytest.mark.parametrize("how", ["fixed", "choice"])
def test_under_a_schedule_the_sampled_learning_rate_is_its_peak(monkeypatch, how):
    """With the run's learning-rate schedule (steps with a decay factor), a trial's optimizer
    follows it from the trial's own learning rate: that rate before the boundary, times the
    factor after it."""
    shared = SHARED.replace(lr_schedule="step", lr_boundaries="100", lr_decay_factor=0.5)
    for assignment in ASSIGNMENTS:
        _, _, trainer = _build_and_make_trainer(
            monkeypatch, "antisymmetric", assignment, how, shared.validate()
        )
        optimizer, value = trainer.optimizer, assignment["learning_rate"]
        assert float(optimizer.learning_rate) == pytest.approx(value, rel=1e-6)
        optimizer.iterations.assign(150)
        assert float(optimizer.learning_rate) == pytest.approx(value * 0.5, rel=1e-6)
        CHECKS["optimizer"](None, optimizer, assignment["optimizer"])


@pytest.mark.parametrize(
    ("change", "argument", "expected", "got"),
    [
        ({"model": "transformer"}, "model", "one of antisymmetric, gated, ablation, lstm",
         "'transformer'"),
        ({"validation_fraction": 0.0}, "validation_fraction", "a float in (0, 1)", "0.0"),
        ({"validation_fraction": 1.0}, "validation_fraction", "a float in (0, 1)", "1.0"),
        ({"validation_fraction": -0.5}, "validation_fraction", "a float in (0, 1)", "-0.5"),
    ],
)  # fmt: skip
def test_a_hypermodel_refuses_a_config_it_cannot_search(change, argument, expected, got):
    """A config from Python (not through `validate`) with a model or split a search cannot use."""
    from apputil.errors import UsageError

    task = tasks.get_task(SHARED.task.name)
    with pytest.raises(UsageError) as refused:
        hypermodels.RNNHyperModel(task, SHARED.replace(**change), SearchSpace())
    assert str(refused.value) == (
        f"Received an invalid value for argument `{argument}`, expected {expected}, got {got}."
    )


@pytest.mark.parametrize("fraction", [0.01, 0.5, 0.99])
def test_a_hypermodel_takes_any_validation_split_inside_zero_and_one(fraction):
    task = tasks.get_task(SHARED.task.name)
    config = SHARED.replace(model="gated", validation_fraction=fraction)
    hypermodel = hypermodels.RNNHyperModel(task, config, SearchSpace(), steps_per_trial=8, rounds=2)
    assert hypermodel.name == "gated_digits" and hypermodel.tunable
    assert (hypermodel.steps_per_trial, hypermodel.rounds) == (8, 2)


class _RecordingTask:
    """A task whose `examples` records its arguments and answers them back."""

    def __init__(self, spec):
        self.spec, self.calls = spec, []

    def examples(self, split, data_dir=None, validation_fraction=0.0):
        self.calls.append((split, data_dir, validation_fraction))
        return (f"{split} inputs", f"{split} targets")


def test_a_hypermodel_reads_the_train_and_validation_splits_of_the_run_once():
    task = _RecordingTask(tasks.get_task("digits").spec)
    config = SHARED.replace(model="antisymmetric", data_dir="some/tfds", validation_fraction=0.3)
    hypermodel = hypermodels.RNNHyperModel(task, config, SearchSpace())
    expected = (("train inputs", "train targets"), ("validation inputs", "validation targets"))
    assert hypermodel.data() == expected
    assert task.calls == [("train", "some/tfds", 0.3), ("validation", "some/tfds", 0.3)]
    assert hypermodel.data() == expected
    assert len(task.calls) == 2  # loaded once for all trials


def test_the_digits_validation_split_is_the_runs_fraction_of_the_training_images():
    """With the real task: the two splits are disjoint and the validation split holds the
    config's fraction of the training images (digits: 1,797 images, 20% held out for test)."""
    task = tasks.get_task("digits")
    hypermodel = hypermodels.RNNHyperModel(task, SHARED.replace(model="gated"), SearchSpace())
    (train_x, train_y), (val_x, val_y) = hypermodel.data()
    total = len(task.examples("train")[1])
    assert len(val_y) == round(SHARED.loop.validation_fraction * total)
    assert len(train_y) + len(val_y) == total
    rows = {tuple(np.asarray(x).ravel()) for x in train_x}
    assert not any(tuple(np.asarray(x).ravel()) in rows for x in val_x)


@pytest.mark.parametrize("model_name", ["antisymmetric", "lstm"])
def test_the_built_model_is_seeded_by_the_run_and_takes_its_dtype_policy(model_name):
    """Every trial starts from the weights the run's seed draws (so trials differ only in
    their hyperparameters), under the run's dtype policy."""
    from training.tasks.models import build_model

    assignment = ASSIGNMENTS[0]
    space, hp = _space_and_hp(assignment, "fixed", model_name)
    task = tasks.get_task("digits")
    config = SHARED.replace(model=model_name, seed=123, dtype_policy="mixed_bfloat16")
    model = hypermodels.RNNHyperModel(task, config, space).build(hp)
    values = {
        name: assignment[name]
        for name in MODEL_HYPERPARAMETERS[model_name]
        if name in ("epsilon", "gamma", "sigma_w")
    }
    reference = build_model(task.spec, model_name, units=UNITS, seed=123,
                            dtype_policy="mixed_bfloat16", **values)  # fmt: skip
    for built, expected in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(built, expected)
    assert model.layers[0].dtype_policy.name == "mixed_bfloat16"
    other = hypermodels.RNNHyperModel(task, config.replace(seed=124), space).build(hp)
    assert not np.array_equal(other.get_weights()[0], model.get_weights()[0])


def _replace_loop(monkeypatch, train, evaluate=lambda *args: (0.5, 0.25)):
    """`fit` with a run's training and `training.run.loop.evaluate` replaced by stand-ins:
    `train(run)`, `evaluate(...)` -> (loss, accuracy)."""
    monkeypatch.setattr(loop.Run, "train", train)
    monkeypatch.setattr(loop, "evaluate", evaluate)


class _Callback:
    def __init__(self):
        self.model, self.ends = None, []

    def set_model(self, model):
        self.model = model

    def on_epoch_end(self, epoch, logs):
        self.ends.append((epoch, logs))


@pytest.mark.parametrize(
    ("fit_kwargs", "start", "stop", "epoch", "steps_per_trial"),
    [
        ({}, 0, 8, 0, 8),  # a whole trial: steps_per_trial steps
        ({"epochs": 2}, 0, 4, 1, 8),  # Hyperband's first rounds: 2 rounds of 8 // 4 steps
        ({"epochs": 3, "initial_epoch": 1}, 2, 6, 2, 8),  # goes on from round 1
        ({"epochs": 2, "initial_epoch": 1}, 1, 2, 1, 3),  # 3 // 4 = 0 steps: rounds of 1
    ],
)
def test_a_trial_trains_its_rounds_steps_and_reports_the_validation_metrics(
    monkeypatch, fit_kwargs, start, stop, epoch, steps_per_trial
):
    """`fit` trains from step `initial_epoch * unit` to `epochs * unit` (unit =
    steps_per_trial // rounds, at least 1), scores the validation split, and reports to
    keras-tuner's callbacks at the last epoch. It logs once, at the end, and checkpoints
    only there (a trial is not resumed)."""
    trained, scored, lines = [], [], []

    def train(run):
        run.log("a line of the run")  # the trial's lines go to the hypermodel's log
        config, trainer = run.config, run.trainer
        iterations = int(trainer.optimizer.iterations.numpy())
        trained.append((run.start_step, config.loop.steps, iterations))
        assert config.loop.log_every == stop - start
        (checkpoints,) = run.callbacks  # a trial is not resumed: one checkpoint, at its end
        assert checkpoints.every == stop

    def evaluate(predict, task, x, y, batch_size, seed):
        scored.append((len(y), batch_size, seed))
        return 0.5, 0.25

    _replace_loop(monkeypatch, train, evaluate)
    space, hp = _space_and_hp(ASSIGNMENTS[0], "fixed", "antisymmetric")
    task = tasks.get_task("digits")
    config = SHARED.replace(model="antisymmetric", eval_batch_size=64, seed=5)
    hypermodel = hypermodels.RNNHyperModel(
        task, config, space, steps_per_trial=steps_per_trial, rounds=4, log=lines.append
    )
    model = hypermodel.build(hp)
    callback = _Callback()
    logs = hypermodel.fit(hp, model, callbacks=[callback], **fit_kwargs)
    assert trained == [(start, stop, start)]
    assert lines == ["a line of the run"]
    (_, (val_x, val_y)) = hypermodel.data()
    assert scored == [(len(val_y), 64, 5)]
    assert logs == {"val_accuracy": 0.25, "val_loss": 0.5}
    assert callback.model is model and callback.ends == [(epoch, logs)]


def test_hyperband_rounds_follow_one_schedule_over_the_whole_trial(monkeypatch):
    """Under a cosine schedule, Hyperband's first two rounds of an 8-step trial (4 steps)
    follow the trial's 8-step cosine: after 4 updates (step 5, numbered from 1 as
    `training.run.schedules` does) the rate is on that curve, not at the floor where a cosine
    over the rounds' 4 steps would have ended."""
    rates = []

    def train(run):
        run.trainer.optimizer.iterations.assign(4)
        rates.append(float(run.trainer.optimizer.learning_rate))

    _replace_loop(monkeypatch, train)
    space, hp = _space_and_hp(ASSIGNMENTS[0], "fixed", "antisymmetric")
    config = SHARED.replace(model="antisymmetric", lr_schedule="cosine", lr_floor=0.1)
    hypermodel = hypermodels.RNNHyperModel(
        tasks.get_task("digits"), config.validate(), space, steps_per_trial=8, rounds=4
    )
    hypermodel.fit(hp, hypermodel.build(hp), epochs=2)
    peak, floor = ASSIGNMENTS[0]["learning_rate"], 0.1
    expected = peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * 5 / 8)))
    assert rates == [pytest.approx(expected, rel=1e-5)]


def test_a_trial_trains_under_the_hypermodels_strategy_and_the_runs_loss_scaling(monkeypatch):
    """The backend given to the hypermodel makes the trial's trainer, and under
    `mixed_float16` the trial's optimizer scales the loss (as a run's does)."""
    backend = _RecordingBackend()
    space, hp = _space_and_hp(ASSIGNMENTS[1], "fixed", "gated")
    config = SHARED.replace(model="gated", dtype_policy="mixed_float16").validate()
    task = tasks.get_task("digits")
    hypermodel = hypermodels.RNNHyperModel(task, config, space, backend=backend)
    model = hypermodel.build(hp)
    optimizers = []
    _replace_loop(monkeypatch, lambda run: optimizers.append(run.trainer.optimizer))
    hypermodel.fit(hp, model)
    assert [trainer.optimizer for trainer in backend.made] == optimizers
    (optimizer,) = optimizers
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    assert type(optimizer.inner_optimizer) is OPTIMIZER_CLASSES[ASSIGNMENTS[1]["optimizer"]]


@pytest.mark.parametrize(
    ("train_raises", "evaluated", "expected", "logged"),
    [
        (True, None, {"val_accuracy": 0.0, "val_loss": math.inf},
         ["trial diverged: the loss is nan at step 3"]),
        (False, (math.nan, 0.3), {"val_accuracy": 0.3, "val_loss": math.inf}, []),
        (False, (math.inf, 0.1), {"val_accuracy": 0.1, "val_loss": math.inf}, []),
    ],
)  # fmt: skip
def test_a_diverged_trial_scores_zero_and_its_metrics_stay_json_safe(
    monkeypatch, train_raises, evaluated, expected, logged
):
    """A trial whose training diverges is logged and scores accuracy 0 and loss inf; a
    non-finite validation loss is reported as inf, which the oracle can rank (a NaN
    compares false with every loss, and is not equal to itself once read back)."""
    import json

    from training.errors import DivergenceError

    def train(run):
        if train_raises:
            raise DivergenceError("the loss is nan at step 3")

    _replace_loop(monkeypatch, train, lambda *args: evaluated)
    lines = []
    space, hp = _space_and_hp(ASSIGNMENTS[0], "fixed", "antisymmetric")
    config = SHARED.replace(model="antisymmetric")
    hypermodel = hypermodels.RNNHyperModel(
        tasks.get_task("digits"), config, space, log=lines.append
    )
    callback = _Callback()
    logs = hypermodel.fit(hp, hypermodel.build(hp), callbacks=[callback])
    assert logs == expected
    assert all(type(value) is float for value in logs.values())
    assert json.loads(json.dumps(logs)) == expected  # as keras-tuner's trial files keep it
    assert lines == logged
    assert callback.ends == [(0, expected)]


def test_by_default_a_trial_is_one_round_of_100_steps(monkeypatch):
    trained = []
    _replace_loop(monkeypatch, lambda run: trained.append((run.start_step, run.config.loop.steps)))
    space, hp = _space_and_hp(ASSIGNMENTS[0], "fixed", "antisymmetric")
    config = SHARED.replace(model="antisymmetric")
    hypermodel = hypermodels.RNNHyperModel(tasks.get_task("digits"), config, space)
    model = hypermodel.build(hp)
    hypermodel.fit(hp, model)
    hypermodel.fit(hp, model, epochs=1)  # Hyperband's one round: the whole trial
    assert trained == [(0, 100), (0, 100)]
