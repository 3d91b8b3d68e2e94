"""A run's learning rate as a function of the optimizer's step (`--lr-schedule`).

The optimizer evaluates its schedule at `optimizer.iterations` on every step,
so a resumed run, whose iterations come back with its checkpoint, goes on
with the rate the uninterrupted run would have had. Steps are numbered from 1
as the training log numbers them: step `s` is the update taken when the
optimizer has taken `s - 1`, and its rate is

* warm-up (any schedule, `warmup_steps` W > 0): `peak · s / W` while `s < W`;
* `constant`: `peak`;
* `cosine` (Keras' `CosineDecay`, warm-up included): from `peak` at step W
  down a half cosine to `peak · floor` at step L (`lr_decay_steps`, the run's
  `steps` by default), and `peak · floor` after it; with L ≤ W, the warm-up and
  then `peak · floor` from step W + 1;
* `step` (Keras' `PiecewiseConstantDecay`): `peak · factor^k` once `s` is past
  k of the boundaries.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from training.config import OptimizerConfig


@keras.saving.register_keras_serializable(package="training")
class RunSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """One of `training.config.LR_SCHEDULES` at the 1-based step `iterations + 1`.

    Args:
        kind: "constant", "cosine" or "step".
        peak: The learning rate after the warm-up (`--learning-rate`).
        warmup_steps: Steps of linear warm-up from 0 (0: none).
        decay_steps: cosine: the step at which the rate reaches its floor.
        floor: cosine: the last rate as a fraction of `peak` (Keras' `alpha`).
        boundaries: step: the steps after which the rate is multiplied by `factor`.
        factor: step: the factor at each boundary.
    """

    def __init__(self, kind, peak, warmup_steps=0, decay_steps=None, floor=0.0, boundaries=(),
                 factor=0.1):  # fmt: skip
        self.kind, self.peak, self.warmup_steps = kind, float(peak), int(warmup_steps)
        self.decay_steps, self.floor = decay_steps, float(floor)
        self.boundaries, self.factor = tuple(int(b) for b in boundaries), float(factor)
        schedules = keras.optimizers.schedules
        self._inner: Any = None
        if kind == "cosine":
            warmup = self.warmup_steps
            # A warm-up as long as the run leaves nothing to decay: the run ends warming up.
            length = max(int(decay_steps) - warmup, 1)
            self._inner = schedules.CosineDecay(
                0.0 if warmup else self.peak, length, alpha=self.floor,
                warmup_target=self.peak if warmup else None, warmup_steps=warmup,
            )  # fmt: skip
        elif kind == "step":
            values = [self.peak * self.factor**k for k in range(len(self.boundaries) + 1)]
            self._inner = schedules.PiecewiseConstantDecay(list(self.boundaries), values)
        elif kind != "constant":
            raise ValueError(f"unknown schedule {kind!r}")

    def __call__(self, iterations):
        step = ops.add(iterations, 1)  # the step being taken, numbered from 1
        if self.kind == "cosine":  # CosineDecay warms up itself, the same way
            return ops.cast(self._inner(step), "float32")
        rate = ops.cast(self.peak if self._inner is None else self._inner(step), "float32")
        if not self.warmup_steps:
            return rate
        fraction = ops.divide(ops.cast(step, "float32"), float(self.warmup_steps))
        return ops.where(step < self.warmup_steps, ops.multiply(self.peak, fraction), rate)

    def get_config(self):
        return {
            "kind": self.kind, "peak": self.peak, "warmup_steps": self.warmup_steps,
            "decay_steps": self.decay_steps, "floor": self.floor,
            "boundaries": list(self.boundaries), "factor": self.factor,
        }  # fmt: skip


def learning_rate(optimizer: OptimizerConfig, steps: int):
    """What the optimizer of `optimizer` is given as its learning rate.

    A float for `constant` without warm-up (today's optimizer: its rate is a
    variable, which `--change-on-resume learning_rate` assigns); a `RunSchedule`
    otherwise.

    Args:
        optimizer: The validated `OptimizerConfig` of a run (a tuner trial's
            has the trial's rate).
        steps: The run's length, the cosine's `decay_steps` unless
            the schedule's `decay_steps` is set.
    """
    peak, schedule = optimizer.learning_rate, optimizer.schedule
    if not schedule.varies:
        return peak
    return RunSchedule(
        schedule.name, peak, warmup_steps=schedule.warmup_steps,
        decay_steps=schedule.decay_steps or steps, floor=schedule.floor,
        boundaries=schedule.boundary_steps(), factor=schedule.decay_factor,
    )  # fmt: skip
