"""`RunDir`: the folder of one training run, every file in it named here once.

Writers (`training.run.experiment` and the run's callbacks) and readers (the
reproduction report, `training.reproduce`, `serving.demo`, the benchmarks)
take the paths from a `RunDir`, so that a run folder has one layout. Nothing
here imports Keras.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import yaml


@dataclasses.dataclass(frozen=True)
class RunDir:
    """A run's folder and the paths of its files.

    Example:

    >>> run = RunDir("runs/digits-antisymmetric")
    >>> run.metrics
    'runs/digits-antisymmetric/metrics.json'
    """

    path: str

    #: The resolved run config and where and how it ran (YAML): the resume identity.
    CONFIG = "config.yaml"
    #: The final metrics (JSON), written after the last step.
    METRICS = "metrics.json"
    #: The trainer's checkpoints (a folder).
    CHECKPOINTS = "checkpoints"
    #: TensorBoard event files (a folder).
    LOGS = "logs"
    #: The learning curve (JSON), with an evaluation period.
    CURVE = "curve.json"
    #: The weights of the best validation evaluation (`.npz`), with `keep_best`.
    BEST_WEIGHTS = "best.npz"
    #: The trained model (`.keras`), written after the last step.
    MODEL = "model.keras"

    @classmethod
    def default(cls, task: str, model: str) -> RunDir:
        """`runs/<task>-<model>`: where a run goes without an output folder."""
        return cls(os.path.join("runs", f"{task}-{model}"))

    def _join(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def config(self) -> str:
        return self._join(self.CONFIG)

    @property
    def metrics(self) -> str:
        return self._join(self.METRICS)

    @property
    def checkpoints(self) -> str:
        return self._join(self.CHECKPOINTS)

    @property
    def logs(self) -> str:
        return self._join(self.LOGS)

    @property
    def curve(self) -> str:
        return self._join(self.CURVE)

    @property
    def best_weights(self) -> str:
        return self._join(self.BEST_WEIGHTS)

    @property
    def model(self) -> str:
        return self._join(self.MODEL)

    def has_checkpoints(self) -> bool:
        """Whether a checkpoint folder with anything in it exists (a run to resume)."""
        return os.path.isdir(self.checkpoints) and bool(os.listdir(self.checkpoints))

    def read_config(self) -> dict[str, Any]:
        """The recorded `config.yaml` (empty when there is none yet)."""
        return _read(self.config, yaml.safe_load) or {}

    def read_metrics(self) -> dict[str, Any] | None:
        """`metrics.json`, or None when the run has not finished (or the file is unreadable)."""
        try:
            return _read(self.metrics, json.load)
        except ValueError:
            return None

    def read_curve(self) -> dict[str, Any]:
        """`curve.json` (`split`, `every`, `points`); no points when there is none."""
        return _read(self.curve, json.load) or {"points": []}

    def finished(self, steps: int) -> bool:
        """Whether the run's metrics say it trained at least `steps` steps."""
        metrics = self.read_metrics()
        return metrics is not None and metrics.get("steps", 0) >= steps


def _read(path: str, loader: Any) -> Any:
    if not os.path.isfile(path):
        return None
    with open(path) as handle:
        return loader(handle)
