"""`RunConfig`'s own methods: its sections, building from flat keys and flags, the recorded
(resolved) form, the schedule's boundaries, the names a resumed run may change, types as YAML
gives them."""

import argparse
import dataclasses

import pytest

from training.backends.launch_config import LaunchConfig
from training.config import (
    RESUME_CHANGEABLE,
    ModelConfig,
    RunConfig,
    UsageError,
    check_batch_size,
    identity_fields,
)
from training.sections import flag


def test_from_namespace_takes_the_fields_it_knows_then_the_overrides():
    namespace = argparse.Namespace(
        units=8, epsilon=0.5, output_dir="runs/x", verbose=True, strategy="mirrored"
    )
    config = RunConfig.from_namespace(namespace, epsilon=0.25, steps=9)
    assert (config.model.units, config.model.epsilon, config.loop.steps) == (8, 0.25, 9)
    assert config.replace(units=16) == dataclasses.replace(
        config, model=dataclasses.replace(config.model, units=16)
    )
    assert config.to_dict() == {**RunConfig().to_dict(), "units": 8, "epsilon": 0.25, "steps": 9}
    assert "strategy" not in config.to_dict()  # a launch setting: not part of the run
    assert LaunchConfig.from_namespace(namespace).strategy == "mirrored"


def test_sections_hold_their_fields_and_flat_keys_name_them():
    config = RunConfig.of(task="adding", model="gated", optimizer="sgd", units=4, steps=3)
    assert (config.task.name, config.model.name, config.optimizer.name) == ("adding", "gated",
                                                                         "sgd")  # fmt: skip
    assert config.model == ModelConfig(name="gated", units=4)
    assert config.loop.steps == 3
    flat = config.to_dict()
    assert (flat["task"], flat["model"], flat["optimizer"]) == ("adding", "gated", "sgd")
    assert RunConfig.of(**flat) == config  # flat keys go both ways
    with pytest.raises(TypeError, match="RunConfig has no option strategy"):
        RunConfig.of(strategy="mirrored")


def test_the_schedule_is_the_optimizer_s_part_and_keeps_the_recorded_flat_keys():
    # What every recorded config.yaml holds of the schedule: the flat keys, as the flags.
    recorded = {"lr_schedule": "cosine", "warmup_steps": 5, "lr_floor": 0.25,
                "lr_decay_steps": 40, "lr_boundaries": None, "lr_decay_factor": 0.1}  # fmt: skip
    config = RunConfig.of(**recorded)
    schedule = config.optimizer.schedule
    assert (schedule.name, schedule.warmup_steps, schedule.floor, schedule.decay_steps) == (
        "cosine", 5, 0.25, 40)  # fmt: skip
    assert {key: config.to_dict()[key] for key in recorded} == recorded
    assert RunConfig.of(**config.to_dict()) == config
    assert set(recorded) <= set(identity_fields())
    assert config.replace(lr_floor=0.5).optimizer.schedule.floor == 0.5


@pytest.mark.parametrize(
    "fields, decay_steps",
    [({"lr_schedule": "cosine", "steps": 40}, 40),  # the run's length, fixed
     ({"lr_schedule": "cosine", "steps": 40, "lr_decay_steps": 25}, 25),  # given: kept
     ({"lr_schedule": "step", "steps": 40, "lr_boundaries": "10"}, None),
     ({"steps": 40}, None)],
)  # fmt: skip
def test_resolved_fixes_only_a_cosine_without_its_length(fields, decay_steps):
    config = RunConfig.of(**fields)
    resolved = config.resolved()
    assert resolved.optimizer.schedule.decay_steps == decay_steps
    assert resolved.replace(lr_decay_steps=config.optimizer.schedule.decay_steps) == config


@pytest.mark.parametrize(
    "fields, scheduled",
    [({}, False), ({"warmup_steps": 1}, True), ({"lr_schedule": "cosine"}, True),
     ({"lr_schedule": "step", "lr_boundaries": "5"}, True)],
)  # fmt: skip
def test_a_schedule_varies_when_the_rate_changes_over_the_run(fields, scheduled):
    assert RunConfig.of(**fields).optimizer.schedule.varies is scheduled


@pytest.mark.parametrize(
    "warmup, text, steps",
    [(0, None, ()), (0, "5", (5,)), (0, "3000,5000", (3000, 5000)), (2, "3, 4,10", (3, 4, 10))],
)
def test_boundaries_are_the_steps_given(warmup, text, steps):
    config = RunConfig.of(lr_schedule="step" if text else "constant", lr_boundaries=text,
                       warmup_steps=warmup)  # fmt: skip
    assert config.optimizer.schedule.boundary_steps() == steps


@pytest.mark.parametrize(
    "warmup, text",
    [(0, "5,5"), (0, "5,3"), (0, "0,4"), (4, "4,9"), (0, "a,b"), (0, "5,"), (0, "")],
)
def test_boundaries_must_increase_after_the_warm_up(warmup, text):
    config = RunConfig.of(lr_schedule="step", lr_boundaries=text, warmup_steps=warmup)
    with pytest.raises(UsageError) as caught:
        config.optimizer.schedule.boundary_steps(flag)
    assert str(caught.value) == (
        "Received an invalid value for argument `--lr-boundaries`, expected increasing step "
        f"numbers after --warmup-steps ({warmup}), comma-separated (e.g. 3000,5000), "
        f"got {text!r}."
    )


@pytest.mark.parametrize(
    "text, names",
    [(None, ()), ("", ()), ("learning_rate", ("learning_rate",)),
     (" learning-rate , clipnorm,", ("learning_rate", "clipnorm"))],
)  # fmt: skip
def test_resume_changes_read_flag_or_field_spelling(text, names):
    config = RunConfig.of(change_on_resume=text)
    assert config.loop.resume_changes() == names
    assert config.validate() is config


def test_a_resume_change_outside_the_changeable_ones_is_refused():
    with pytest.raises(UsageError) as caught:
        RunConfig.of(change_on_resume="learning_rate,units").validate(flag)
    assert str(caught.value) == (
        "Received an invalid value for argument `--change-on-resume`, expected names among "
        f"{', '.join(RESUME_CHANGEABLE)}, got 'learning_rate,units'."
    )
    assert RESUME_CHANGEABLE == ("learning_rate", "clipnorm")


@pytest.mark.parametrize(
    "field, value, accepted",
    [("epsilon", 1, True), ("epsilon", True, False), ("units", 8.0, False),
     ("units", False, False), ("clipnorm", None, True), ("clipnorm", 2, True),
     ("dataset", "fashion_mnist", True), ("dataset", 1, False), ("jit_compile", "false", False),
     ("jit_compile", 0, False), ("seed", 1.5, False)],
)  # fmt: skip
def test_types_as_a_yaml_file_gives_them(field, value, accepted):
    """An int is a float (`epsilon: 1`); a bool is neither an int nor a float."""
    config = RunConfig.of(**{field: value})
    if accepted:
        assert config.validate() is config
        return
    with pytest.raises(UsageError, match=f"argument `{flag(field)}`, expected "):
        config.validate(flag)
    with pytest.raises(UsageError, match=f"argument `{field}`, expected "):
        config.validate()  # from Python: the key as the caller wrote it


def test_identity_fields_are_what_shapes_a_checkpoint():
    fields = identity_fields()
    for name in ("task", "dataset", "timesteps", "seed", "model", "units", "epsilon", "gamma",
                 "sigma_w", "dtype_policy", "optimizer", "learning_rate", "batch_size",
                 "lr_schedule", "keep_best", "validation_fraction"):  # fmt: skip
        assert name in fields
    for name in ("steps", "log_every", "checkpoint_every", "eval_every", "data_dir",
                 "strategy", "jit_compile", "diagnostics", "change_on_resume"):  # fmt: skip
        assert name not in fields
    assert flag("sigma_w") == "--sigma-w" and flag("units") == "--units"


@pytest.mark.parametrize("batch, replicas", [(8, 1), (8, 4), (6, 3)])
def test_a_batch_that_splits_evenly_over_the_replicas(batch, replicas):
    assert check_batch_size(batch, replicas) is None


@pytest.mark.parametrize("batch, replicas", [(7, 2), (4, 8), (9, 4)])
def test_a_batch_that_does_not_split_is_refused(batch, replicas):
    with pytest.raises(UsageError) as caught:
        check_batch_size(batch, replicas)
    assert str(caught.value) == (
        "Received an invalid value for argument `--batch-size`, expected a multiple of the "
        f"{replicas} replicas, got {batch}."
    )


def test_a_python_caller_reads_its_keys_and_the_command_line_its_flags():
    """The same refusal, worded for who made the config: `RunConfig.of(...)` names the keys
    given (also inside the expected range), the commands name their flags."""
    config = RunConfig.of(lr_schedule="step", warmup_steps=4, lr_boundaries="3")
    with pytest.raises(UsageError) as from_python:
        config.validate()
    assert str(from_python.value) == (
        "Received an invalid value for argument `lr_boundaries`, expected increasing step "
        "numbers after warmup_steps (4), comma-separated (e.g. 3000,5000), got '3'."
    )
    with pytest.raises(UsageError) as from_flags:
        config.validate(flag)
    assert str(from_flags.value) == (
        "Received an invalid value for argument `--lr-boundaries`, expected increasing step "
        "numbers after --warmup-steps (4), comma-separated (e.g. 3000,5000), got '3'."
    )


def _run(**fields):
    return RunConfig.of(**fields)


def _launch(**fields):
    return LaunchConfig.from_flat(fields)


@pytest.mark.parametrize(
    ("make", "key", "value", "expected"),
    [(_run, "lr_floor", "0.1", "a number"), (_run, "lr_schedule", 3, "a string"),
     (_run, "lr_decay_steps", 2.5, "an integer (or null)"), (_run, "model", True, "a string"),
     (_run, "jit_compile", "false", "a boolean"),
     # The launch settings are checked like a run's.
     (_launch, "cpu_devices", "2", "an integer"), (_launch, "strategy", 1, "a string"),
     (_launch, "connect_timeout", None, "an integer")],
)  # fmt: skip
def test_a_wrong_type_is_named_as_the_caller_names_it_at_every_depth(make, key, value, expected):
    """A field whose key is not its name (`lr_floor` is the schedule's `floor`, nested in the
    optimizer's section) is named by its key, by the caller's `argument`, at every depth:
    the command line reads its flags, a Python caller its keys."""
    config = make(**{key: value})
    with pytest.raises(UsageError) as refused:
        config.validate(flag)
    assert f"argument `{flag(key)}`, expected {expected}, got " in str(refused.value)
    with pytest.raises(UsageError) as refused:
        config.validate()
    assert f"argument `{key}`, expected {expected}, got " in str(refused.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"keep_best": True, "eval_every": 5},
      "Received an invalid value for argument `{keep_best}`, expected a validation split to "
      "select on: {validation_fraction} above 0 (the test split is read only at the end), "
      "got {keep_best} with {validation_fraction} 0.0."),
     ({"keep_best": True, "validation_fraction": 0.1},
      "Received an invalid value for argument `{eval_every}`, expected a positive integer "
      "with {keep_best} (the evaluations it selects from), got 0.")],
)  # fmt: skip
def test_keep_best_needs_a_validation_split_and_evaluations_in_either_naming(fields, message):
    """`keep_best` selects on the validation split's evaluations: without either it is
    refused, naming the settings as the caller writes them (flags or keys)."""
    for argument in (flag, str):
        names = {key: argument(key) for key in ("keep_best", "eval_every",
                                                  "validation_fraction")}  # fmt: skip
        with pytest.raises(UsageError) as refused:
            RunConfig.of(**fields).validate(argument)
        assert str(refused.value) == message.format(**names)
    assert RunConfig.of(keep_best=True, eval_every=5, validation_fraction=0.1).validate()
