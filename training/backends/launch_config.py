"""`LaunchConfig`: how the processes and devices of a command are set up.

Not part of a run (`training.config.RunConfig`): `training.train` and `training.tune`
read it from their flags (the "distribution" group) and make the backend a run trains
on from it (`training.backends.select.start`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

from apputil.errors import check
from training.sections import Section, check_types, option

__all__ = ["LaunchConfig"]


@dataclasses.dataclass(frozen=True)
class LaunchConfig(Section):
    """How the processes and devices of a command are set up; not part of any run.

    `training.train` and `training.tune` read it to split the CPU, join the
    JAX processes and make the backend (`training.backends`) a run trains on.
    """

    strategy: str = option("auto", group="distribution")
    tpu: str | None = option(None, "TPU name or address for --strategy tpu", group="distribution")
    cpu_devices: int = option(
        0, "split the CPU into this many logical devices (mirrored training on CPU)",
        group="distribution",
    )  # fmt: skip
    coordinator: str | None = option(
        None, "JAX on several processes: HOST:PORT of process 0's coordinator, the same on "
        "every process, or auto on a TPU pod slice, Slurm or MPI (default: the first of "
        "KERAS_DISTRIBUTION_JOB_ADDRESSES)", group="distribution", metavar="HOST:PORT",
    )  # fmt: skip
    num_processes: int | None = option(
        None, "JAX: how many processes train together (default: "
        "KERAS_DISTRIBUTION_NUM_PROCESSES)", group="distribution", metavar="N",
    )  # fmt: skip
    process_id: int | None = option(
        None, "JAX: this process, 0 to N-1; process 0 runs the coordinator and writes the "
        "outputs (default: KERAS_DISTRIBUTION_PROCESS_ID)", group="distribution", metavar="I",
    )  # fmt: skip
    connect_timeout: int = option(
        120, "JAX: seconds a process waits for all the others to connect", group="distribution",
        metavar="S",
    )  # fmt: skip
    heartbeat_timeout: int = option(
        30, "JAX: seconds without a heartbeat after which a process counts as lost and the "
        "others stop", group="distribution", metavar="S",
    )  # fmt: skip

    @classmethod
    def from_namespace(cls, namespace: argparse.Namespace) -> LaunchConfig:
        """The fields present in an argparse namespace (the rest default)."""
        return cls.from_flat(vars(namespace))

    def validate(self, argument: Callable[[str], str] = str) -> LaunchConfig:
        """Checks every field's type and range; returns `self` or raises `UsageError`."""
        check_types(self, argument=argument)
        check(
            self.cpu_devices >= 0,
            argument("cpu_devices"),
            "a non-negative integer",
            self.cpu_devices,
        )
        for name in ("connect_timeout", "heartbeat_timeout"):
            value = getattr(self, name)
            check(value > 0, argument(name), "a positive integer", value)
        check(
            self.num_processes is None or self.num_processes > 0,
            argument("num_processes"),
            "a positive integer",
            self.num_processes,
        )
        check(
            self.process_id is None or 0 <= self.process_id < (self.num_processes or 2**31),
            argument("process_id"),
            f"an integer in [0, {self.num_processes or 'N'})",
            self.process_id,
        )
        check(
            self.coordinator is None or _is_address(self.coordinator),
            argument("coordinator"),
            "HOST:PORT (a port in 1..65535) or auto",
            self.coordinator,
        )
        return self


def _is_address(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return text == "auto" or (bool(host) and port.isdigit() and 0 < int(port) < 65536)
