"""`Backend`: the Keras backend a command trains on, with its strategy, chosen once.

A command makes one (`training.backends.select.start`) and hands it down:
the run records where it ran and gets its trainer from it, the search gives
its strategy to keras-tuner. Each backend is one class:
`training.backends.strategies.TensorFlowBackend` (`tf.distribute`),
`training.backends.distributions.JaxBackend` (`keras.distribution`, several
processes through a `training.backends.cluster.Cluster`) and
`training.backends.distributions.TorchBackend` (one device).

A trainer has `model`, `optimizer`, `batch_size`, `replicas`,
`strategy_name`, `chief`, `label` and `distributed` (several processes), and:

* `restore()`: loads the last complete checkpoint; returns `(step, path)`
  (`(0, None)` when there is none);
* `step()`: trains on the next batch; returns its `(loss, accuracy)`;
* `save(step)`: writes a checkpoint (atomically: a crash leaves the previous one);
* `predict(x)`: the model's outputs for a NumPy batch (inference mode);
* `save_model(path)`: saves the model as `.keras` (uncompiled).

Every trainer sees the same batches: `training.tasks.catalog.TrainingBatches`,
a pure function of `(seed, step)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from training.backends.launch_config import LaunchConfig

#: Every `--strategy` name; each backend accepts some (`Backend.STRATEGIES`).
STRATEGIES = ("auto", "default", "mirrored", "multi_worker", "tpu", "data_parallel")


class Backend:
    """The backend of this process and the strategy (or distribution) runs train under.

    Args:
        strategy: A `tf.distribute.Strategy` (TensorFlow), a
            `keras.distribution.Distribution` or None (JAX, PyTorch: one device).
        launch: The `training.backends.launch_config.LaunchConfig` it was made from (its
            `strategy` is the name asked for); a run records it as how it ran.

    Attributes:
        name: The Keras backend ("tensorflow", "jax" or "torch").
        strategy_name: The strategy's public class name ("default": one device).
        replicas: How many replicas a global batch is split over.
        chief: Whether this process writes the run's outputs.
        label: "chief", or the worker's name in multi-process lines.
        distributed: Whether several processes train together.
    """

    name = ""
    #: The `--strategy` names this backend accepts.
    STRATEGIES: tuple[str, ...] = ()

    def __init__(self, strategy: Any = None, launch: LaunchConfig | None = None):
        self.strategy, self.launch = strategy, launch or LaunchConfig()

    @property
    def requested(self) -> str:
        """The `--strategy` name this backend was made from."""
        return self.launch.strategy

    strategy_name = "default"
    replicas = 1
    chief = True
    label = "chief"
    distributed = False

    def devices(self) -> list[tuple[str, str]]:
        """`(name, platform)` of each accelerator this process computes on (empty: the CPU)."""
        return []

    def describe_device(self) -> str:
        """One line: the backend, then the machine it computes on, alike for every backend
        ("jax on 1 x NVIDIA H100 80GB HBM3 (gpu)", "torch on cpu"): the report compares runs
        by machine."""
        found = self.devices()
        if not found:
            return f"{self.name} on cpu"
        name, platform = found[0]
        return f"{self.name} on {len(found)} x {name} ({platform})"

    def versions(self) -> dict[str, str]:
        """The versions a run records: the package, Keras, and the backend's framework."""
        import keras

        import keras_antisym

        module = __import__(self.name)
        return {
            "keras_antisym_version": keras_antisym.__version__,
            "keras_version": keras.__version__,
            "backend": self.name,
            f"{self.name}_version": str(module.__version__),
        }

    def make_trainer(
        self,
        task: Any,
        build: Callable[[], tuple[Any, Any]],
        inputs: Any,
        targets: Any,
        *,
        batch_size: int,
        seed: int,
        checkpoint_dir: str | None = None,
        jit_compile: bool = False,
    ) -> Any:
        """A trainer (see the module doc) of the model and optimizer `build()` returns.

        Args:
            task: A `training.tasks.catalog.Task`.
            build: Called with no arguments (under the strategy's scope or the
                distribution) to return `(model, optimizer)`.
            inputs, targets: The training examples.
            batch_size: The global batch size.
            seed: Seed of the batches.
            checkpoint_dir: Where checkpoints live (None: no checkpoints).
            jit_compile: XLA-compile the train step (JAX compiles it always).
        """
        raise NotImplementedError

    def tuner_strategy(self) -> Any:
        """What keras-tuner runs trials under (its `distribution_strategy`; None: its own)."""
        return None
