"""The JAX and PyTorch backends: `keras.distribution` data parallelism on JAX (over every
device of every process of a `training.backends.cluster.Cluster`), one device on PyTorch."""

from __future__ import annotations

import os
from typing import Any

from training.backends.backend import Backend
from training.backends.cluster import Cluster, Processes
from training.backends.launch_config import LaunchConfig
from training.backends.strategies import check_strategy
from training.errors import StrategyError


class JaxBackend(Backend):
    """Trains with `training.backends.trainer_keras.KerasTrainer` under a
    `keras.distribution.DataParallel` (None: one device).

    Args:
        strategy: The distribution (None: one device).
        launch: The `training.backends.launch_config.LaunchConfig` it was made from.
        cluster: The processes this one trains with (default: this one alone).
    """

    name = "jax"
    STRATEGIES = ("auto", "default", "data_parallel")

    @classmethod
    def make(cls, launch: LaunchConfig, cluster: Cluster | None = None) -> JaxBackend:
        """The backend of `launch`: the CPU split into `cpu_devices` devices, the processes
        joined into `cluster` (the coordinator, count and index of `launch`, else of the
        environment; one without a coordinator), then the strategy: "auto" picks
        DataParallel when JAX sees several devices (all processes')."""
        import keras

        name = launch.strategy
        check_strategy(name, cls.STRATEGIES, cls.name)
        split_host_devices(launch.cpu_devices)
        cluster = cluster if cluster is not None else Cluster()
        processes = Processes.resolve(launch.coordinator, launch.num_processes, launch.process_id)
        cluster.join(processes, launch.connect_timeout, launch.heartbeat_timeout)
        cluster.watch_peers()
        distribution = None
        if name != "default":
            devices = keras.distribution.list_devices()
            if name == "data_parallel" or len(devices) > 1:
                distribution = keras.distribution.DataParallel(devices=devices)
        return cls(distribution, launch, cluster)

    def __init__(
        self, strategy: Any = None, launch: LaunchConfig | None = None,
        cluster: Cluster | None = None,
    ):  # fmt: skip
        import jax

        super().__init__(strategy, launch)
        self.cluster = cluster if cluster is not None else Cluster()
        if strategy is not None:
            self.strategy_name = type(strategy).__name__
            self.replicas = len(strategy.device_mesh.devices.flat)
        index = jax.process_index()
        self.chief = index == 0
        self.label = "chief" if self.chief else f"worker{index}"
        self.distributed = jax.process_count() > 1

    def devices(self) -> list[tuple[str, str]]:
        import jax

        return [(d.device_kind, d.platform) for d in jax.devices() if d.platform != "cpu"]

    def make_trainer(self, task, build, inputs, targets, **kwargs) -> Any:
        from training.backends.trainer_keras import KerasTrainer

        return KerasTrainer(task, build, inputs, targets, backend=self, **kwargs)

    def process_rows(self, batch_size: int) -> slice | None:
        """The rows of each global batch that this process feeds (None: all of them).

        They are the rows the data-parallel layout puts on this process's devices,
        so that the processes' rows together are the global batch, in order.
        """
        if self.strategy is None or not self.cluster.multi_process:
            return None
        layout = self.strategy.get_data_layout((batch_size, 1)).backend_layout
        indices = layout.addressable_devices_indices_map((batch_size, 1)).values()
        starts = sorted({rows.start or 0 for rows, _ in indices})
        stops = sorted({batch_size if rows.stop is None else rows.stop for rows, _ in indices})
        if any(b != a for a, b in zip(stops, starts[1:], strict=False)):
            raise StrategyError(
                "this process's devices hold rows of the batch that are not contiguous"
            )
        return slice(starts[0], stops[-1])


class TorchBackend(Backend):
    """Trains with `training.backends.trainer_keras.KerasTrainer` on one device."""

    name = "torch"
    STRATEGIES = ("auto", "default")

    @classmethod
    def make(cls, launch: LaunchConfig) -> TorchBackend:
        """The backend of `launch` (its strategy: "auto" or "default", one device)."""
        check_strategy(launch.strategy, cls.STRATEGIES, cls.name)
        return cls(None, launch)

    def __init__(self, strategy: Any = None, launch: LaunchConfig | None = None):
        super().__init__(None, launch)
        self.cluster = Cluster()

    def devices(self) -> list[tuple[str, str]]:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return [(torch.cuda.get_device_name(i), "gpu") for i in range(count)]

    def make_trainer(self, task, build, inputs, targets, **kwargs) -> Any:
        from training.backends.trainer_keras import KerasTrainer

        return KerasTrainer(task, build, inputs, targets, backend=self, **kwargs)

    def process_rows(self, batch_size: int) -> slice | None:
        return None


def split_host_devices(devices: int) -> None:
    """Splits the host CPU into `devices` JAX devices (before JAX starts): DataParallel
    (and tests) can then run several replicas on one CPU."""
    if devices < 2:
        return
    flag = f"--xla_force_host_platform_device_count={devices}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
