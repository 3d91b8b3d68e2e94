"""Learning-rate schedules: the rate at each step, the trainers apply it, resuming mid-schedule."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml

from tests.limits import limit
from tests.recording import RecordingWriter
from training import train
from training.backends.distributions import JaxBackend
from training.backends.strategies import TensorFlowBackend
from training.backends.trainer_keras import KerasTrainer
from training.config import RunConfig
from training.run import schedules
from training.tasks import catalog as tasks
from training.tasks.optimizers import make_optimizer

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--task", "digits", "--units", "8", "--batch-size", "32", "--strategy", "default"]


def _rate(config):
    """What the optimizer of a run of `config` is given as its learning rate."""
    return schedules.learning_rate(config.optimizer, config.loop.steps)


def _rates(config, steps):
    """The rate the optimizer of `config` applies at each (1-based) step of `steps`."""
    optimizer = make_optimizer("adam", _rate(config.validate().resolved()))
    optimizer.build([keras.Variable(np.zeros(2, "float32"))])
    rates = {}
    for step in steps:
        optimizer.iterations.assign(step - 1)  # step s is taken after s - 1 updates
        rates[step] = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    return rates


def _cosine(peak, floor, progress):
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


@pytest.mark.parametrize(
    "settings, expected",
    [
        # Warm-up over 4 steps to 0.1, cosine to 5% of it at step 12, held there after.
        (dict(lr_schedule="cosine", learning_rate=0.1, warmup_steps=4, lr_floor=0.05, steps=12),
         {1: 0.025, 2: 0.05, 3: 0.075, 4: 0.1, 6: _cosine(0.1, 0.05, 2 / 8),
          8: 0.1 * (0.05 + 0.95 * 0.5), 12: 0.005, 13: 0.005, 40: 0.005}),
        # No warm-up, floor 0: the decay starts at step 0; an explicit length beats --steps.
        (dict(lr_schedule="cosine", learning_rate=1.0, lr_decay_steps=4, steps=100),
         {1: 0.5 * (1 + math.cos(math.pi / 4)), 2: 0.5, 3: 0.5 * (1 - math.cos(math.pi / 4)),
          4: 0.0, 50: 0.0}),
        # Step decay: halved after step 3 and after step 6, after a 2-step warm-up.
        (dict(lr_schedule="step", learning_rate=0.1, warmup_steps=2, lr_boundaries="3,6",
              lr_decay_factor=0.5),
         {1: 0.05, 2: 0.1, 3: 0.1, 4: 0.05, 6: 0.05, 7: 0.025, 1000: 0.025}),
        (dict(lr_schedule="constant", learning_rate=0.2, warmup_steps=5),
         {1: 0.04, 4: 0.16, 5: 0.2, 6: 0.2, 500: 0.2}),
        (dict(learning_rate=0.01), {1: 0.01, 1000: 0.01}),  # today's default
    ],
    ids=["cosine-warmup-floor", "cosine-length", "step-warmup", "constant-warmup", "constant"],
)  # fmt: skip
def test_each_schedule_gives_the_hand_computed_rate_at_each_step(settings, expected):
    rates = _rates(RunConfig.of(**settings), expected)
    for step, rate in expected.items():
        assert rates[step] == pytest.approx(rate, rel=1e-6, abs=1e-9), step


def test_constant_without_warmup_keeps_an_assignable_rate_variable():
    config = RunConfig.of(learning_rate=0.03).validate()
    assert _rate(config) == 0.03 and not config.optimizer.schedule.varies
    warm = RunConfig.of(learning_rate=0.03, warmup_steps=2).validate()
    assert isinstance(_rate(warm), schedules.RunSchedule)


def test_a_trial_s_rate_replaces_the_configured_rate():
    """A tuner trial's sampled rate: the constant rate, or the schedule's peak (reached at
    the end of the warm-up, step 2); the schedule's length is the trial's."""
    from training.search.hypermodels import trial_config

    trial = trial_config(RunConfig.of(learning_rate=0.03).validate(), {"learning_rate": 0.2})
    assert _rate(trial) == 0.2
    warm = RunConfig.of(learning_rate=0.03, warmup_steps=2).validate()
    assert float(_rate(trial_config(warm, {"learning_rate": 0.2}))(2)) == pytest.approx(0.2)
    assert float(_rate(warm)(2)) == pytest.approx(0.03)
    cosine = RunConfig.of(lr_schedule="cosine", learning_rate=0.5, steps=1000).validate()
    assert float(schedules.learning_rate(cosine.optimizer, 10)(10)) == pytest.approx(0.0)


def test_a_schedule_survives_keras_serialization():
    config = RunConfig.of(lr_schedule="step", lr_boundaries="3,6", warmup_steps=2).validate()
    schedule = _rate(config)
    clone = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    for iterations in (0, 1, 3, 6, 9):
        assert float(clone(iterations)) == float(schedule(iterations))


@pytest.mark.parametrize("trainer_class", ["default", "keras"])
def test_the_trainers_step_at_the_scheduled_rate(trainer_class):
    """One SGD step at step 7 of a cosine schedule moves the weights as a constant optimizer
    at the hand-computed rate of step 7 does (and not as one at the peak)."""
    task = tasks.get_task("digits")
    inputs, targets = task.examples("train")
    config = RunConfig.of(lr_schedule="cosine", learning_rate=0.5, warmup_steps=2, lr_floor=0.1,
                       steps=12, optimizer="sgd", momentum=0.0).validate()  # fmt: skip
    rate_at_7 = _cosine(0.5, 0.1, 5 / 10)

    def weights_after_step_7(rate):
        def build():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((64, 1)), keras.layers.SimpleRNN(4),
                                      keras.layers.Dense(10)])  # fmt: skip
            return model, make_optimizer("sgd", rate, momentum=0.0)

        kwargs = dict(batch_size=16, seed=0)
        if trainer_class == "keras":  # the JAX and PyTorch trainer, here on TensorFlow
            trainer = KerasTrainer(task, build, inputs, targets, backend=JaxBackend(), **kwargs)
        else:
            trainer = TensorFlowBackend().make_trainer(task, build, inputs, targets, **kwargs)
        trainer.optimizer.iterations.assign(6)
        before = trainer.model.get_weights()
        trainer.step()
        assert int(keras.ops.convert_to_numpy(trainer.optimizer.iterations)) == 7
        return before, trainer.model.get_weights()

    start, scheduled = weights_after_step_7(_rate(config))
    _, constant = weights_after_step_7(rate_at_7)
    _, peak = weights_after_step_7(0.5)
    for a, b in zip(scheduled, constant, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    moved = [np.max(np.abs(p - s)) for p, s in zip(peak, scheduled, strict=True)]
    assert max(moved) > 1e-4  # the peak rate would have moved them elsewhere
    assert any(not np.array_equal(a, b) for a, b in zip(start, scheduled, strict=True))


@pytest.mark.parametrize("trainer_class", ["default", "keras"])
def test_tensorboard_gets_the_rate_each_logged_step_applies(trainer_class):
    """`train/learning_rate` at every log step: the hand-computed rate of that step."""
    from training.run import loop

    task = tasks.get_task("digits")
    inputs, targets = task.examples("train")
    config = RunConfig.of(lr_schedule="cosine", learning_rate=0.5, warmup_steps=2, lr_floor=0.1,
                       steps=12, log_every=3, checkpoint_every=100, optimizer="sgd",
                       momentum=0.0).validate()  # fmt: skip

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((64, 1)), keras.layers.SimpleRNN(4),
                                  keras.layers.Dense(10)])  # fmt: skip
        return model, make_optimizer("sgd", _rate(config), momentum=0.0)

    kwargs = dict(batch_size=16, seed=0)
    if trainer_class == "keras":
        trainer = KerasTrainer(task, build, inputs, targets, backend=JaxBackend(), **kwargs)
    else:
        trainer = TensorFlowBackend().make_trainer(task, build, inputs, targets, **kwargs)
    writer = RecordingWriter()
    loop.Run(config, trainer, writer=writer, log=lambda line: None).train()
    logged = dict(writer.series("train/learning_rate"))
    # Step s is the (s - 2)-th of the 10 cosine steps after the 2-step warm-up.
    expected = {s: _cosine(0.5, 0.1, (s - 2) / 10) for s in (3, 6, 9, 12)}
    assert logged == pytest.approx(expected, rel=1e-6)


def _env():
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "",
            "KERAS_BACKEND": "tensorflow"}  # fmt: skip


# Trains in a child and SIGKILLs itself right after the optimizer's update number KILL_AT:
# a kill at a known step, between two checkpoints.
_KILLED_CHILD = """
import os, signal, sys
from training import train
from training.backends.trainer_tf import TFTrainer

KILL_AT = int(sys.argv[1])
original = TFTrainer.step

def step(self):
    result = original(self)
    if int(self.optimizer.iterations.numpy()) == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    return result

TFTrainer.step = step
sys.exit(train.main(sys.argv[2:]))
"""


def test_a_run_killed_mid_schedule_resumes_to_bit_identical_weights(tmp_path, capsys):
    common = [*TINY, "--steps", "24", "--checkpoint-every", "8", "--log-every", "8",
              "--lr-schedule", "cosine", "--warmup-steps", "6", "--lr-floor", "0.1",
              "--learning-rate", "0.05"]  # fmt: skip
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_CHILD, "13", *common, "--output-dir", str(killed)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=limit(180),
    )  # fmt: skip
    assert child.returncode == -9, child.stderr[-2000:]  # SIGKILL at step 13, mid-decay
    assert not (killed / "metrics.json").exists()
    state = (killed / "checkpoints" / "checkpoint").read_text()
    assert 'model_checkpoint_path: "ckpt-8"' in state  # steps 9-13 were lost with the process
    for out in (killed, whole):  # in this process: the same backend, no start-up
        assert train.main([*common, "--output-dir", str(out)]) == 0
    assert f"resumed from {killed / 'checkpoints' / 'ckpt-8'} at step 8" in capsys.readouterr().out
    resumed_metrics = json.loads((killed / "metrics.json").read_text())
    assert resumed_metrics["resumed_from_step"] == 8 and resumed_metrics["steps"] == 24
    # Every variable, the optimizer's included, equals the uninterrupted run's bit for bit.
    a, b = (
        tf.train.load_checkpoint(str(out / "checkpoints" / "ckpt-24")) for out in (killed, whole)
    )
    names = a.get_variable_to_shape_map()
    assert names == b.get_variable_to_shape_map()
    assert any("optimizer" in name for name in names) and any("iter" in name for name in names)
    for name in names:
        if name != "_CHECKPOINTABLE_OBJECT_GRAPH":
            assert np.array_equal(a.get_tensor(name), b.get_tensor(name)), name
    whole_metrics = json.loads((whole / "metrics.json").read_text())
    assert resumed_metrics["weights_sha256"] == whole_metrics["weights_sha256"]
    record = yaml.safe_load((killed / "config.yaml").read_text())
    assert record["lr_schedule"] == "cosine" and record["lr_decay_steps"] == 24


def test_more_steps_do_not_stretch_a_cosine_and_a_new_peak_applies_on_resume(tmp_path, capsys):
    out = tmp_path / "run"
    common = [*TINY, "--lr-schedule", "cosine", "--warmup-steps", "2", "--checkpoint-every",
              "2", "--log-every", "2", "--output-dir", str(out)]  # fmt: skip
    assert train.main([*common, "--steps", "4"]) == 0
    capsys.readouterr()
    # More steps would change the decay's length: refused, saying how to go on with it.
    assert train.main([*common, "--steps", "6"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "argument `--lr-decay-steps`, expected 4 as in" in err[0], err
    assert "give --lr-decay-steps 4 to go on with the same schedule" in err[0]
    assert train.main([*common, "--steps", "6", "--lr-decay-steps", "4"]) == 0
    # A new peak under a schedule: the schedule is rebuilt with it (no variable to assign).
    argv = [*common, "--steps", "8", "--lr-decay-steps", "4", "--learning-rate", "0.002",
            "--change-on-resume", "learning_rate"]  # fmt: skip
    assert train.main(argv) == 0
    assert "resuming with learning_rate 0.002 (was 0.01)" in capsys.readouterr().out
    record = yaml.safe_load((out / "config.yaml").read_text())
    assert record["resume_changes"] == [{"step": 6, "learning_rate": 0.002}]
    assert json.loads((out / "metrics.json").read_text())["steps"] == 8


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lr-schedule", "linear"],
         "argument `--lr-schedule`, expected one of constant, cosine, step, got 'linear'."),
        (["--warmup-steps", "-5"],
         "argument `--warmup-steps`, expected a non-negative integer, got -5."),
        (["--lr-schedule", "step", "--lr-boundaries", "300,200"],
         "argument `--lr-boundaries`, expected increasing step numbers after --warmup-steps "
         "(0), comma-separated (e.g. 3000,5000), got '300,200'."),
        (["--lr-schedule", "step", "--lr-boundaries", "100,100"], "got '100,100'."),
        (["--lr-schedule", "step", "--warmup-steps", "50", "--lr-boundaries", "40,80"],
         "after --warmup-steps (50)"),
        (["--lr-schedule", "step", "--lr-boundaries", "1,x"], "got '1,x'."),
        (["--lr-schedule", "step"],
         "argument `--lr-boundaries`, expected comma-separated steps with --lr-schedule step"),
        (["--lr-boundaries", "100"],
         "argument `--lr-boundaries`, expected none (the default) unless --lr-schedule step, "
         "got '100'."),
        (["--lr-floor", "0.05"],
         "argument `--lr-floor`, expected 0 (the default) unless --lr-schedule cosine, got 0.05."),
        (["--lr-decay-factor", "0.5"],
         "argument `--lr-decay-factor`, expected 0.1 (the default) unless --lr-schedule step, "
         "got 0.5."),
        (["--lr-schedule", "cosine", "--lr-decay-factor", "0.2"],
         "argument `--lr-decay-factor`, expected 0.1 (the default) unless --lr-schedule step, "
         "got 0.2."),
        (["--lr-schedule", "cosine", "--lr-floor", "1.5"], "argument `--lr-floor`"),
        (["--lr-schedule", "cosine", "--warmup-steps", "10", "--lr-decay-steps", "0"],
         "argument `--lr-decay-steps`, expected a positive integer, got 0."),
        (["--lr-schedule", "step", "--lr-boundaries", "5", "--lr-decay-factor", "0"],
         "argument `--lr-decay-factor`, expected a float in (0, 1), got 0.0."),
    ],
)  # fmt: skip
def test_bad_schedule_values_are_one_line_usage_errors(tmp_path, capsys, args, message):
    assert train.main([*args, "--steps", "1", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("python -m training.train: error: Received")
    assert message in err[0], err
    assert not os.listdir(tmp_path)  # refused before anything was written


def test_bad_schedule_values_in_a_config_file_are_refused_too(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("lr_schedule: step\nlr_boundaries: [100, 200]\n")
    argv = ["--config", str(config), "--steps", "1", "--output-dir", str(tmp_path / "o")]
    assert train.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert "argument `--lr-boundaries`, expected a string (or null), got [100, 200]." in err[0]


def test_the_schedule_class_alone_follows_its_docstring():
    """`RunSchedule` built directly (it is registered for Keras serialization): a cosine
    decays to 0 by default, and the warm-up ends at step W whatever the decay says."""

    def rate(schedule, step):
        return float(keras.ops.convert_to_numpy(schedule(step - 1)))

    cosine = schedules.RunSchedule("cosine", 1.0, decay_steps=4)
    assert [rate(cosine, s) for s in (2, 4, 9)] == pytest.approx([0.5, 0.0, 0.0], abs=1e-7)
    # A boundary inside the warm-up (which RunConfig refuses): from step W on, the step
    # decay's rate, already halved at the boundary after step 2.
    early = schedules.RunSchedule("step", 1.0, warmup_steps=3, boundaries=(2,), factor=0.5)
    assert [rate(early, s) for s in (1, 2, 3, 4)] == pytest.approx([1 / 3, 2 / 3, 0.5, 0.5])


@pytest.mark.parametrize(
    "name, cls, momentum",
    [("sgd", keras.optimizers.SGD, 0.5), ("adagrad", keras.optimizers.Adagrad, None),
     ("adam", keras.optimizers.Adam, None)],
)  # fmt: skip
def test_each_optimizer_name_makes_its_keras_optimizer_with_the_rate_and_clipping(
    name, cls, momentum
):
    optimizer = make_optimizer(name, 0.25, momentum=0.5, clipnorm=2.0)
    assert type(optimizer) is cls
    assert float(optimizer.learning_rate) == 0.25
    assert optimizer.clipnorm == 2.0
    if momentum is not None:
        assert optimizer.momentum == momentum
    plain = make_optimizer(name, 0.5)
    assert plain.clipnorm is None and float(plain.learning_rate) == 0.5
    assert make_optimizer(name, 0.5, clipnorm=0.0).clipnorm is None  # 0: no clipping
    if name == "sgd":
        assert plain.momentum == 0.9  # the default: the paper's
    # float16 gradients underflow without loss scaling; bfloat16's exponent is float32's.
    for policy, wrapped in (("mixed_float16", True), ("mixed_bfloat16", False)):
        made = make_optimizer(name, 0.25, clipnorm=2.0, dtype_policy=policy)
        assert isinstance(made, keras.optimizers.LossScaleOptimizer) is wrapped
        inner = made.inner_optimizer if wrapped else made
        assert type(inner) is cls and inner.clipnorm == 2.0
        assert float(inner.learning_rate) == 0.25


def test_an_unknown_optimizer_name_is_refused_with_the_known_ones():
    from apputil.errors import UsageError

    with pytest.raises(UsageError) as refused:
        make_optimizer("rmsprop", 0.1)
    assert str(refused.value) == (
        "Received an invalid value for argument `--optimizer`, expected one of sgd, adagrad, "
        "adam, got 'rmsprop'."
    )


def test_a_run_shorter_than_its_warmup_is_extended_as_its_refusal_advises(tmp_path, capsys):
    """The paper configs warm up over 100 steps; a shorter first run is accepted, and so is
    the extension its refusal advises: one rule for the decay's length, given or not."""
    out = tmp_path / "run"
    common = [*TINY, "--lr-schedule", "cosine", "--warmup-steps", "5", "--lr-floor", "0.25",
              "--learning-rate", "0.1", "--checkpoint-every", "3", "--log-every", "3",
              "--output-dir", str(out)]  # fmt: skip
    assert train.main([*common, "--steps", "3"]) == 0
    capsys.readouterr()
    assert train.main([*common, "--steps", "9"]) == 2
    (err,) = capsys.readouterr().err.splitlines()
    advice = re.search(r"give (--lr-decay-steps \d+) to go on", err)
    assert advice is not None and advice.group(1) == "--lr-decay-steps 3", err
    assert train.main([*common, "--steps", "9", *advice.group(1).split()]) == 0
    assert json.loads((out / "metrics.json").read_text())["steps"] == 9
    record = yaml.safe_load((out / "config.yaml").read_text())
    assert record["lr_decay_steps"] == 3 and record["warmup_steps"] == 5
    # The extended run's rate: the warm-up 0.1·s/5 through step 5, then the floor, 0.025.
    rates = _rates(RunConfig.of(lr_schedule="cosine", learning_rate=0.1, warmup_steps=5,
                                lr_floor=0.25, lr_decay_steps=3, steps=9), range(1, 10))
    expected = {1: 0.02, 4: 0.08, 5: 0.1, 6: 0.025, 9: 0.025}
    for step, rate in expected.items():
        assert rates[step] == pytest.approx(rate, rel=1e-6), step
