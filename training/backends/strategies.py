"""The TensorFlow backend: `tf.distribute` strategies (one device, mirrored GPUs or CPUs,
multi-worker, TPU). TensorFlow is imported only when a strategy is made."""

from __future__ import annotations

import json
import os
from typing import Any

from apputil.errors import invalid
from apputil.quiet import native_stderr_silenced
from training.backends.backend import Backend
from training.backends.launch_config import LaunchConfig
from training.errors import StrategyError

#: The `--strategy` names of the TensorFlow backend.
TF_STRATEGIES = ("auto", "default", "mirrored", "multi_worker", "tpu")


class TensorFlowBackend(Backend):
    """Trains under a `tf.distribute.Strategy` with `training.backends.trainer_tf.TFTrainer`."""

    name = "tensorflow"
    STRATEGIES = TF_STRATEGIES

    @classmethod
    def make(cls, launch: LaunchConfig) -> TensorFlowBackend:
        """The backend of `launch`: the CPU split into `cpu_devices` logical devices first,
        then the strategy (`strategy`, on `tpu`), made before any other TensorFlow op runs
        (multi-worker collectives must be configured first)."""
        split_cpu(launch.cpu_devices)
        return cls(make_strategy(launch.strategy, tpu=launch.tpu), launch)

    def __init__(self, strategy: Any = None, launch: LaunchConfig | None = None):
        import tensorflow as tf

        strategy = strategy if strategy is not None else tf.distribute.get_strategy()
        super().__init__(strategy, launch)
        self.strategy_name = strategy_name(strategy)
        self.replicas = strategy.num_replicas_in_sync
        self.chief = is_chief(strategy)
        self.label = task_label(strategy)
        self.distributed = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)

    def devices(self) -> list[tuple[str, str]]:
        import tensorflow as tf

        with native_stderr_silenced():  # listing devices probes CUDA, which prints
            gpus = tf.config.list_physical_devices("GPU")
            return [
                (tf.config.experimental.get_device_details(gpu).get("device_name", "GPU"), "gpu")
                for gpu in gpus
            ]

    def make_trainer(self, task, build, inputs, targets, **kwargs) -> Any:
        from training.backends.trainer_tf import TFTrainer

        return TFTrainer(task, build, inputs, targets, backend=self, **kwargs)

    def tuner_strategy(self) -> Any:
        """The strategy itself: keras-tuner runs each trial on one worker, so a multi-worker
        cluster is refused."""
        if self.distributed:
            raise invalid(
                "--strategy",
                "a single-worker strategy (keras-tuner runs trials on one worker: default, "
                "mirrored or tpu)",
                f"{self.requested} (a multi-worker cluster)",
            )
        return self.strategy


def split_cpu(devices: int) -> None:
    """Splits the host CPU into `devices` logical devices (before TensorFlow starts).

    Lets MirroredStrategy (and tests) run several replicas on one CPU.
    """
    if devices < 2:
        return
    import tensorflow as tf

    with native_stderr_silenced():  # listing devices probes CUDA, which prints
        cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * devices
    )


def _tf_config() -> dict | None:
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as error:
        raise StrategyError(f"TF_CONFIG is not valid JSON: {error}") from None


def _workers(config: dict | None) -> int:
    cluster = (config or {}).get("cluster", {})
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def check_strategy(name: str, allowed: tuple[str, ...], backend: str) -> None:
    """Raises `StrategyError` unless `--strategy name` is one of `allowed` on `backend`."""
    if name not in allowed:
        expected = f"one of {', '.join(allowed)} on the {backend} backend"
        raise invalid("--strategy", expected, name, StrategyError)


def make_strategy(name: str, tpu: str | None = None) -> Any:
    """The `tf.distribute.Strategy` called `name` (see `TF_STRATEGIES`).

    "auto" picks a TPU when `tpu` or `TPU_NAME` names one, multi-worker when
    TF_CONFIG describes a cluster of several workers, mirrored over all GPUs
    when there are several (or over the logical CPUs when the CPU was split),
    and the default one-device strategy otherwise.
    """
    import tensorflow as tf

    check_strategy(name, TF_STRATEGIES, "tensorflow")
    with native_stderr_silenced():  # TensorFlow's device probing prints absl lines
        if name == "auto":
            if tpu or os.environ.get("TPU_NAME"):
                name = "tpu"
            elif _workers(_tf_config()) > 1:
                name = "multi_worker"
            elif (
                len(tf.config.list_logical_devices("GPU")) > 1
                or len(tf.config.list_logical_devices("CPU")) > 1
            ):
                name = "mirrored"
            else:
                name = "default"
        if name == "default":
            return tf.distribute.get_strategy()
        if name == "mirrored":
            gpus = tf.config.list_logical_devices("GPU")
            if gpus:
                return tf.distribute.MirroredStrategy()
            cpus = [device.name for device in tf.config.list_logical_devices("CPU")]
            # NCCL needs GPUs; on CPUs reduce through one device.
            return tf.distribute.MirroredStrategy(
                devices=cpus, cross_device_ops=tf.distribute.ReductionToOneDevice()
            )
        if name == "multi_worker":
            config = _tf_config()
            if config is None or not config.get("cluster"):
                raise StrategyError(
                    "--strategy multi_worker needs TF_CONFIG with a cluster and task"
                )
            return tf.distribute.MultiWorkerMirroredStrategy()
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "")
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, RuntimeError, tf.errors.OpError) as error:
            raise StrategyError(f"no TPU found ({str(error).splitlines()[0]})") from None
        return tf.distribute.TPUStrategy(resolver)


def strategy_name(strategy: Any) -> str:
    """The public `tf.distribute` name of `strategy` (its class may be private)."""
    import tensorflow as tf

    for public, name in (
        (tf.distribute.MultiWorkerMirroredStrategy, "MultiWorkerMirroredStrategy"),
        (tf.distribute.MirroredStrategy, "MirroredStrategy"),
        (tf.distribute.TPUStrategy, "TPUStrategy"),
    ):
        if isinstance(strategy, public):
            return name
    return "default"


def is_chief(strategy: Any) -> bool:
    """Whether this process writes the run's outputs."""
    import tensorflow as tf

    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    return (
        task_type == "chief"
        or task_type is None
        or (
            task_type == "worker"
            and task_id == 0
            and "chief" not in resolver.cluster_spec().as_dict()
        )
    )


def task_label(strategy: Any) -> str:
    """ "chief", or this worker's task type and index ("worker1")."""
    import tensorflow as tf

    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "chief"
    return f"{resolver.task_type}{resolver.task_id}"
