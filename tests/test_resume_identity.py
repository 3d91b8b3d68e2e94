"""Resuming a run: every identity setting is kept, only the changeable ones change on request.

A run's `config.yaml` holds the record `training.run.experiment` writes for it
(`_run_record`: the `RunConfig`, the task's shape, where it ran); a rerun in
the same folder builds its own record and `_restore` checks it against the
file (`check_resumable`) before any checkpoint is read. These tests go through
those same functions, in-process, with a stand-in for the trainer (no model is
built and nothing trains), once for each field that `identity_fields()` names:
a field added later is covered without editing this file, and one without a
valid other value fails here until it gets one in `ALTERNATIVES` (and, if it
matters only with other settings, those in `BASE_FOR`).
"""

import math
import os
import re
import types
import typing

import numpy as np
import pytest
import yaml

from apputil.errors import UsageError
from training import options
from training.backends.strategies import TensorFlowBackend
from training.config import RESUME_CHANGEABLE, RunConfig, identity_fields, option_types, run_keys
from training.run import experiment
from training.run.rundir import RunDir
from training.tasks import catalog as tasks

HERE = os.path.dirname(os.path.abspath(__file__))

# The run on disk: an MNIST task (it takes a dataset), an explicit sequence length
# and a small model; every other field at its default.
BASE = RunConfig.of(task="noise_padded_mnist", timesteps=100, units=16, batch_size=8).validate()

# Fields that matter only with other settings: the run on disk has those (BASE with these).
BASE_FOR = {
    "lr_floor": {"lr_schedule": "cosine"},
    "lr_decay_steps": {"lr_schedule": "cosine"},
    "lr_boundaries": {"lr_schedule": "step", "lr_boundaries": "100"},
    "lr_decay_factor": {"lr_schedule": "step", "lr_boundaries": "100"},
    "keep_best": {"validation_fraction": 0.1, "eval_every": 10},
}
# Other values for the fields the generic rules of `_candidates` get wrong.
ALTERNATIVES = {
    # An MNIST task without a dataset reads "mnist": naming it is the same run.
    "dataset": "fashion_mnist",
    "lr_schedule": "cosine",
    "lr_boundaries": "100,200",
    # `validate` wants an existing folder.
    "data_dir": HERE,
    # `validate` wants names among RESUME_CHANGEABLE.
    "change_on_resume": RESUME_CHANGEABLE[0],
}
FIELDS = run_keys()
HINTS = option_types()
NON_IDENTITY = tuple(name for name in FIELDS if name not in identity_fields())
STEP = 10  # the step of the checkpoint the stand-in trainer "restores"


def _flag(name):
    return "--" + name.replace("_", "-")


def _get(config, name):
    """The value of the flat key `name` in `config`."""
    return config.to_dict()[name]


def _task(config):
    task = config.task
    return tasks.get_task(task.name, timesteps=task.timesteps, dataset=task.dataset)


def _candidates(name, value):
    """Other values of field `name` (now `value`) by its type, most plausible first."""
    if name in options.CHOICES:
        return [choice for choice in options.CHOICES[name] if choice != value]
    arms = [arm for arm in typing.get_args(HINTS[name]) if arm is not type(None)]
    kind = arms[0] if arms else HINTS[name]
    if kind is bool:
        return [not value]
    if kind is int:
        return [1, 2, 100, 1000] if value is None else [value + 1, value - 1, value * 2]
    if kind is float:
        if value is None or value == 0:
            return [0.5, 1.0, 2.0]
        return [value * 2, value + 0.5, value / 2]
    return []  # a free string: no generic rule, `ALTERNATIVES` must give one


def _valid(config):
    """Whether a run could start with `config`: its checks and its task's accept it."""
    try:
        config.validate()
        _task(config)
    except ValueError:
        return False
    return True


def _effective(config, name):
    """The value of `name` a run of `config` trains with (defaults resolved)."""
    config = config.resolved()
    task = _task(config)
    if name == "timesteps":
        return task.spec.timesteps
    if name == "dataset":
        return task.spec.params.get("dataset")
    return _get(config, name)


def _base(name):
    """The run on disk for the tests of field `name`."""
    return BASE.replace(**BASE_FOR.get(name, {})).validate()


def _alternative(name):
    """`_base(name)` with field `name` alone changed to another valid value that takes effect."""
    base = _base(name)
    given = name in ALTERNATIVES
    candidates = [ALTERNATIVES[name]] if given else _candidates(name, _get(base, name))
    for value in candidates:
        config = base.replace(**{name: value})
        if _valid(config) and _effective(config, name) != _effective(base, name):
            return config
    pytest.fail(
        f"no valid other value for RunConfig.{name} (tried {candidates!r}): give one in "
        f"ALTERNATIVES (and the settings it needs in BASE_FOR)"
    )


class StandInTrainer:
    """What `_run_record` and `_restore` read of a trainer; `restore` finds a checkpoint."""

    strategy_name = "OneDeviceStrategy"
    replicas = 1
    chief = True

    def __init__(self, config, checkpoint=None):
        self.optimizer = types.SimpleNamespace(
            learning_rate=config.optimizer.learning_rate, clipnorm=config.optimizer.clipnorm
        )
        self.checkpoint = checkpoint
        self.restored = False

    def restore(self):
        self.restored = True
        return (STEP, self.checkpoint) if self.checkpoint else (0, None)


def _attempt(config, workdir, trainer, log=None):
    """A run of `config` in `workdir` up to its checkpoint's restore, as `train_and_evaluate`
    runs it: the resolved config, its record, `_restore` (which checks and writes it)."""
    config = config.resolved()
    task = _task(config)
    labels = np.zeros(4, "int32")
    examples = (np.zeros((4, 1)), labels)
    splits = types.SimpleNamespace(train=examples, test=examples, validation=examples)
    rundir = RunDir(workdir)
    record = experiment._run_record(config, task, trainer, splits, rundir, "cpu",
                                    TensorFlowBackend())  # fmt: skip
    logs = [] if log is None else log
    return experiment._restore(trainer, config, record, rundir, logs.append)


def _first_run(workdir, config):
    """`workdir` after a run of `config` wrote its `config.yaml` and a checkpoint."""
    os.makedirs(workdir)
    assert _attempt(config, workdir, StandInTrainer(config)) == 0
    os.makedirs(os.path.join(workdir, "checkpoints"))
    with open(os.path.join(workdir, "checkpoints", f"ckpt-{STEP}.index"), "w") as handle:
        handle.write("stand-in")
    return workdir


@pytest.fixture
def workdir(tmp_path):
    """An output folder where a run of `BASE` wrote its `config.yaml` and a checkpoint."""
    return _first_run(str(tmp_path / "run"), BASE)


def _config_yaml(workdir):
    with open(os.path.join(workdir, "config.yaml")) as handle:
        return handle.read()


def _assert_refused(config, workdir, name):
    """`_restore` refuses `config` naming `name`'s flag, reads no checkpoint, rewrites nothing."""
    before = _config_yaml(workdir)
    trainer = StandInTrainer(config, checkpoint="ckpt")
    path = os.path.join(workdir, "config.yaml")
    expected = (
        f"Received an invalid value for argument `{_flag(name)}`, expected "
        f"{yaml.safe_load(before)[name]!r} as in {path} ("
    )
    with pytest.raises(UsageError, match=re.escape(expected)) as raised:
        _attempt(config, workdir, trainer)
    assert str(raised.value).endswith(f", got {_get(config, name)!r}.")
    assert not trainer.restored
    assert _config_yaml(workdir) == before


def test_the_runs_on_disk_are_valid_and_the_tables_name_fields():
    """Each field's run on disk is one a user could start; the tables name only real fields
    and the changeable settings are identity settings."""
    for name in identity_fields():
        assert _valid(_base(name)), name
    assert set(ALTERNATIVES) <= set(FIELDS)
    assert set(BASE_FOR) <= set(identity_fields())
    assert set(RESUME_CHANGEABLE) <= set(identity_fields())


@pytest.mark.parametrize("name", identity_fields())
def test_resume_refuses_a_change_of_each_identity_field(tmp_path, name):
    """Each identity field changed alone to another valid value: the resume is refused with
    a usage error naming that field's flag and the value on disk, before any checkpoint is
    read; `config.yaml` stays as it was."""
    base, config = _base(name), _alternative(name)
    assert [n for n in FIELDS if _get(config, n) != _get(base, n)] == [name]
    workdir = _first_run(str(tmp_path / "run"), base)
    assert yaml.safe_load(_config_yaml(workdir))[name] == _effective(base, name)
    _assert_refused(config, workdir, name)
    # The run on disk itself still resumes.
    assert _attempt(base, workdir, StandInTrainer(base, checkpoint="ckpt")) == STEP


def test_resume_with_the_same_settings_goes_on_from_the_checkpoint(workdir):
    """The same config resumes: the checkpoint's step is returned, nothing is logged as
    changed, and `config.yaml` records the same settings and no resume changes."""
    before = yaml.safe_load(_config_yaml(workdir))
    trainer = StandInTrainer(BASE, checkpoint="ckpt")
    logs = []
    assert _attempt(BASE, workdir, trainer, logs) == STEP
    assert trainer.restored
    assert not any(line.startswith("resuming with") for line in logs)
    after = yaml.safe_load(_config_yaml(workdir))
    assert "resume_changes" not in after
    assert {k: after[k] for k in identity_fields()} == {k: before[k] for k in identity_fields()}


@pytest.mark.parametrize("name", NON_IDENTITY)
def test_resume_accepts_a_change_of_each_other_field(workdir, name):
    """A field outside the run's identity (schedule, periods, data location) changed to
    another valid value: the run goes on from its checkpoint."""
    config = _alternative(name)
    trainer = StandInTrainer(config, checkpoint="ckpt")
    assert _attempt(config, workdir, trainer) == STEP
    assert trainer.restored


@pytest.mark.parametrize("name", RESUME_CHANGEABLE)
def test_change_on_resume_lets_its_fields_change_and_applies_them(tmp_path, name):
    """A changeable field changed with `change_on_resume` naming it: the resume goes on, the
    restored optimizer gets the new value, the change is logged and `config.yaml` records it
    with the step it applies from."""
    base = _base(name)
    workdir = _first_run(str(tmp_path / "run"), base)
    config = _alternative(name).replace(change_on_resume=name)
    old, new = _get(base, name), _get(config, name)
    trainer = StandInTrainer(base, checkpoint="ckpt")  # its optimizer as the checkpoint left it
    logs = []
    assert _attempt(config, workdir, trainer, logs) == STEP
    if name in vars(trainer.optimizer):
        assert getattr(trainer.optimizer, name) == new
    assert f"resuming with {name} {new} (was {old})" in logs
    after = yaml.safe_load(_config_yaml(workdir))
    assert after[name] == new
    assert after["resume_changes"] == [{"step": STEP, name: new}]


@pytest.mark.parametrize("name", RESUME_CHANGEABLE)
def test_change_on_resume_allows_only_the_fields_it_names(tmp_path, name):
    """A changeable field changed while `change_on_resume` names only the others (or none):
    refused, naming that field."""
    workdir = _first_run(str(tmp_path / "run"), _base(name))
    others = [other for other in RESUME_CHANGEABLE if other != name]
    config = _alternative(name).replace(change_on_resume=",".join(others) or None)
    _assert_refused(config, workdir, name)


def test_resume_compares_the_resolved_sequence_length(tmp_path):
    """The record holds the task's own length: a run that left `timesteps` unset resumes with
    that length given, and the other way round; another length is refused."""
    unset = BASE.replace(timesteps=None)
    default_length = _task(unset).spec.timesteps
    given = unset.replace(timesteps=default_length)
    for first, then in ((unset, given), (given, unset)):
        workdir = _first_run(str(tmp_path / f"from-{first.task.timesteps}"), first)
        assert _attempt(then, workdir, StandInTrainer(then, checkpoint="ckpt")) == STEP
    _assert_refused(unset.replace(timesteps=default_length + 1), workdir, "timesteps")


def test_resume_compares_the_resolved_data_set(tmp_path):
    """An MNIST task's data set is recorded resolved: a run that left `dataset` unset resumes
    with `--dataset mnist`, and the other way round, also from a record that holds
    `dataset: null` beside its task parameters; another data set is refused."""
    unset = BASE.replace(dataset=None)
    given = unset.replace(dataset="mnist")
    for first, then in ((unset, given), (given, unset)):
        workdir = _first_run(str(tmp_path / f"from-{first.task.dataset}"), first)
        assert yaml.safe_load(_config_yaml(workdir))["dataset"] == "mnist"
        assert _attempt(then, workdir, StandInTrainer(then, checkpoint="ckpt")) == STEP
    path = os.path.join(workdir, "config.yaml")
    record = yaml.safe_load(_config_yaml(workdir))
    with open(path, "w") as handle:  # as a record that kept the flag's unset value
        handle.write(yaml.safe_dump({**record, "dataset": None}))
    assert _attempt(given, workdir, StandInTrainer(given, checkpoint="ckpt")) == STEP
    _assert_refused(unset.replace(dataset="fashion_mnist"), workdir, "dataset")


def test_resume_refuses_another_backend(workdir):
    """A run written on another Keras backend is refused, naming `KERAS_BACKEND`, before any
    checkpoint is read."""
    path = os.path.join(workdir, "config.yaml")
    record = yaml.safe_load(_config_yaml(workdir))
    other = "jax" if record["backend"] != "jax" else "torch"
    with open(path, "w") as handle:
        handle.write(yaml.safe_dump({**record, "backend": other}))
    trainer = StandInTrainer(BASE, checkpoint="ckpt")
    with pytest.raises(UsageError, match=f"`KERAS_BACKEND`, expected '{other}'"):
        _attempt(BASE, workdir, trainer)
    assert not trainer.restored


def test_generic_alternatives_follow_each_type():
    """The rules that derive other values: a boolean flips, numbers move, choices change."""
    assert _candidates("download", False) == [True]
    assert _candidates("units", 64)[0] == 65
    assert math.isclose(_candidates("epsilon", 0.1)[0], 0.2)
    assert _candidates("validation_fraction", 0.0)[0] == 0.5
    assert "adam" not in _candidates("optimizer", "adam")
    assert set(_candidates("optimizer", "adam")) == set(options.CHOICES["optimizer"]) - {"adam"}
    assert _candidates("tpu", None) == []


def test_a_run_that_restores_no_checkpoint_records_no_earlier_changes(tmp_path):
    """A resumed run recorded a change; then no checkpoint is readable (all torn): the run
    starts over at step 0, and its record lists no change it did not make."""
    name = RESUME_CHANGEABLE[0]
    base = _base(name)
    workdir = _first_run(str(tmp_path / "run"), base)
    config = _alternative(name).replace(change_on_resume=name)
    assert _attempt(config, workdir, StandInTrainer(base, checkpoint="ckpt")) == STEP
    changes = [{"step": STEP, name: _get(config, name)}]
    assert yaml.safe_load(_config_yaml(workdir))["resume_changes"] == changes
    assert _attempt(config, workdir, StandInTrainer(config)) == 0
    assert "resume_changes" not in yaml.safe_load(_config_yaml(workdir))
    # Restored again, the record keeps the changes it has on disk (none now).
    assert _attempt(config, workdir, StandInTrainer(config, checkpoint="ckpt")) == STEP
    assert "resume_changes" not in yaml.safe_load(_config_yaml(workdir))
