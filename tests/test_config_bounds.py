"""`RunConfig.validate` and `LaunchConfig.validate` at the edge of every numeric range: the
last accepted value passes, the first refused one fails with the whole message, naming the
flag and the range."""

import dataclasses
import math

import pytest

from training.backends.launch_config import LaunchConfig
from training.config import RunConfig, UsageError, run_keys
from training.sections import check_types, flag

POSITIVE_INTEGER = "a positive integer"
NON_NEGATIVE_INTEGER = "a non-negative integer"

# field: (values it accepts, values it refuses, the expected range as the message says it)
BOUNDS = {
    **{name: ((1,), (0, -1), POSITIVE_INTEGER)
       for name in ("units", "batch_size", "steps", "checkpoint_every", "log_every",
                    "eval_batch_size", "connect_timeout", "heartbeat_timeout")},
    **{name: ((0, 1), (-1,), NON_NEGATIVE_INTEGER)
       for name in ("cpu_devices", "diagnostics", "eval_every")},
    "epsilon": ((1e-12, 1.0), (0.0, -1e-12, math.inf, math.nan), "a positive float"),
    "learning_rate": ((1e-12,), (0.0, math.inf, math.nan), "a positive float"),
    "gamma": ((0.0, 1e3), (-1e-12, math.inf, math.nan), "a non-negative float"),
    "sigma_w": ((0.0,), (-1e-12, math.inf), "a non-negative float"),
    "momentum": ((0.0, 0.999), (1.0, -0.001), "a float in [0, 1)"),
    "clipnorm": ((None, 1e-6), (0.0, -1.0, math.inf), "a positive float"),
    "timesteps": ((None, 1), (0,), POSITIVE_INTEGER),
    "validation_fraction": ((0.0, 0.999), (1.0, -0.001), "a float in [0, 1)"),
    "num_processes": ((None, 1), (0,), POSITIVE_INTEGER),
    # The host is everything before the last colon (an IPv6 address keeps its own).
    "coordinator": ((None, "auto", "h:1", "h:65535", "[::1]:8476", "10.0.0.2:80"),
                    ("h:0", "h:65536", ":80", "h:", "h:x", "h:-1", "h:+1", "host", "AUTO", ""),
                    "HOST:PORT (a port in 1..65535) or auto"),
}  # fmt: skip


def _flag(name):
    return "--" + name.replace("_", "-")


def _validated(**fields):
    """Every setting of the run and the launch of `fields` (flat keys), once both validate."""
    keys = set(run_keys())
    run = RunConfig.of(**{k: v for k, v in fields.items() if k in keys})
    launch = LaunchConfig.from_flat({k: v for k, v in fields.items() if k not in keys})
    assert run.validate(flag) is run and launch.validate(flag) is launch
    return {**run.to_dict(), **launch.flat()}


def _refusal(**fields):
    """The message `_validated(**fields)` refuses them with."""
    with pytest.raises(UsageError) as refused:
        _validated(**fields)
    return str(refused.value)


def _assert_bounds(around, name, accepted, refused, expected):
    for value in accepted:
        assert _validated(**around, **{name: value})[name] == value, (name, value)
    for value in refused:
        assert _refusal(**around, **{name: value}) == (
            f"Received an invalid value for argument `{_flag(name)}`, "
            f"expected {expected}, got {value!r}."
        ), (name, value)


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_each_range_accepts_its_edge_and_refuses_past_it(name):
    _assert_bounds({}, name, *BOUNDS[name])


def test_a_process_id_lies_below_the_number_of_processes():
    assert LaunchConfig(num_processes=3, process_id=2).validate().process_id == 2
    assert LaunchConfig(process_id=7).validate().process_id == 7  # the count comes later
    assert LaunchConfig(num_processes=3, process_id=0).validate().process_id == 0  # the first
    assert LaunchConfig(process_id=0).validate().process_id == 0
    # Without the count, ids stay within a 32-bit signed integer (JAX's process index).
    assert LaunchConfig(process_id=2**31 - 1).validate().process_id == 2**31 - 1
    for processes, process_id, expected in ((3, 3, "[0, 3)"), (3, -1, "[0, 3)"),
                                            (None, -1, "[0, N)"),
                                            (None, 2**31, "[0, N)")):  # fmt: skip
        assert _refusal(num_processes=processes, process_id=process_id) == (
            "Received an invalid value for argument `--process-id`, expected an integer in "
            f"{expected}, got {process_id}."
        )


# The schedule's settings: (the config around the value, field, accepted, refused, range).
SCHEDULE_BOUNDS = [
    ({}, "warmup_steps", (0, 5), (-1,), "a non-negative integer"),
    ({"lr_schedule": "cosine"}, "lr_floor", (0.0, 1.0), (-0.001, 1.001, math.nan),
     "a float in [0, 1] (a fraction of --learning-rate)"),
    ({}, "lr_floor", (0.0,), (0.5,), "0 (the default) unless --lr-schedule cosine"),
    # At or below the warm-up too, as the run's own --steps is (a run and its extension).
    ({"lr_schedule": "cosine", "warmup_steps": 4}, "lr_decay_steps", (None, 1, 4, 5), (0, -1),
     "a positive integer"),
    ({"lr_schedule": "step", "lr_boundaries": "10"}, "lr_decay_factor", (1e-6, 0.999),
     (0.0, 1.0, math.inf), "a float in (0, 1)"),
    ({"lr_schedule": "step"}, "lr_boundaries", ("5", "5,9"), (None,),
     "comma-separated steps with --lr-schedule step"),
    ({"lr_schedule": "cosine"}, "lr_boundaries", (None,), ("5",),
     "none (the default) unless --lr-schedule step"),
    ({}, "lr_decay_steps", (None,), (9,), "none (the default) unless --lr-schedule cosine"),
    ({}, "lr_decay_factor", (0.1,), (0.5, 0.0999), "0.1 (the default) unless --lr-schedule step"),
    ({"lr_schedule": "cosine"}, "lr_decay_factor", (0.1,), (0.2,),
     "0.1 (the default) unless --lr-schedule step"),
]  # fmt: skip


@pytest.mark.parametrize("around, name, accepted, refused, expected", SCHEDULE_BOUNDS)
def test_each_schedule_setting_accepts_its_edge_and_refuses_past_it(
    around, name, accepted, refused, expected
):
    _assert_bounds(around, name, accepted, refused, expected)


# A setting each schedule reads besides the warm-up: (flag, a value not its default, the
# default as the refusal says it, the schedule that reads it).
OWN_SETTINGS = [
    ("lr_floor", 0.5, "0", "cosine"),
    ("lr_decay_steps", 9, "none", "cosine"),
    ("lr_boundaries", "5", "none", "step"),
    ("lr_decay_factor", 0.5, "0.1", "step"),
]


@pytest.mark.parametrize("schedule", ["constant", "cosine", "step"])
@pytest.mark.parametrize("name, value, default, owner", OWN_SETTINGS)
def test_another_schedule_s_setting_is_refused_under_each_schedule(
    schedule, name, value, default, owner
):
    around = {"lr_schedule": schedule}
    if schedule == "step" and name != "lr_boundaries":
        around["lr_boundaries"] = "7"
    if schedule == owner:
        assert _validated(**around, **{name: value})[name] == value
    else:
        assert _refusal(**around, **{name: value}) == (
            f"Received an invalid value for argument `--{name.replace('_', '-')}`, expected "
            f"{default} (the default) unless --lr-schedule {owner}, got {value!r}."
        )


def test_an_unknown_schedule_is_named_with_the_choices():
    assert _refusal(lr_schedule="linear") == (
        "Received an invalid value for argument `--lr-schedule`, expected one of "
        "constant, cosine, step, got 'linear'."
    )


@dataclasses.dataclass
class _Typed:
    flag_name: int | str = 0
    rate: float = 0.5
    rate_or_none: float | None = None


@pytest.mark.parametrize(
    "field, value, expected",
    [("flag_name", 0.5, "an integer or a string"), ("flag_name", True, "an integer or a string"),
     ("rate", "x", "a number"), ("rate_or_none", [1], "a number (or null)")],
)  # fmt: skip
def test_a_value_of_a_wrong_type_names_its_flag_and_every_type_it_may_take(field, value, expected):
    assert check_types(_Typed()) is None
    with pytest.raises(UsageError) as caught:
        check_types(_Typed(**{field: value}))
    flag = "--" + field.replace("_", "-")
    assert str(caught.value) == (
        f"Received an invalid value for argument `{flag}`, expected {expected}, got {value!r}."
    )
    check_types(_Typed(**{field: value}), skip=(field,))  # a skipped field is not checked


def test_a_step_schedule_with_empty_boundaries_is_refused_showing_them():
    assert _refusal(lr_schedule="step", lr_boundaries="") == (
        "Received an invalid value for argument `--lr-boundaries`, expected comma-separated "
        "steps with --lr-schedule step, got ''."
    )


def test_fields_left_out_of_the_type_check_do_not_stop_it_at_the_next_ones():
    @dataclasses.dataclass
    class Settings:
        first: int = 1
        skipped: int = 2
        last: int = 3

    check_types(Settings(skipped="any"), skip=("skipped",))
    with pytest.raises(UsageError, match="argument `--last`, expected an integer, got 'x'"):
        check_types(Settings(skipped="any", last="x"), skip=("skipped",))
    with pytest.raises(UsageError, match="argument `--first`, expected an integer"):
        check_types(Settings(first="x"), skip=("skipped",))


def test_an_unknown_dtype_policy_is_refused_naming_the_three():
    assert _refusal(dtype_policy="float16") == (
        "Received an invalid value for argument `--dtype-policy`, expected one of float32, "
        "mixed_bfloat16, mixed_float16, got 'float16'."
    )


def test_keep_best_needs_evaluations_to_select_from_and_one_is_enough():
    kept = RunConfig.of(keep_best=True, validation_fraction=0.1, eval_every=1).validate()
    assert kept.loop.eval_every == 1
    assert _refusal(keep_best=True, validation_fraction=0.1, eval_every=0) == (
        "Received an invalid value for argument `--eval-every`, expected a positive integer "
        "with --keep-best (the evaluations it selects from), got 0."
    )


def test_a_data_folder_that_does_not_exist_is_refused_unless_downloading(tmp_path):
    missing = str(tmp_path / "tfds")
    assert _refusal(data_dir=missing) == (
        "Received an invalid value for argument `--data-dir`, expected an existing TFDS data "
        f"directory or a folder of .npz files, got '{missing}'."
    )
    assert RunConfig.of(data_dir=missing, download=True).validate().task.data_dir == missing
    assert RunConfig.of(data_dir=str(tmp_path)).validate().task.data_dir == str(tmp_path)
