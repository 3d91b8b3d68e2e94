"""The `--strategy` choices.

TensorFlow: one device, mirrored GPUs/CPUs, multi-worker, TPU (`tf.distribute`).
JAX: one device or `keras.distribution.DataParallel` over every device of
every process (multi-host after `keras.distribution.initialize`). PyTorch: one
device. TensorFlow is imported only on its backend.
"""

from __future__ import annotations

import json
import os
from typing import Any

from apputil.errors import invalid
from apputil.quiet import native_stderr_silenced
from training.errors import StrategyError

STRATEGIES = ("auto", "default", "mirrored", "multi_worker", "tpu", "data_parallel")
TF_STRATEGIES = ("auto", "default", "mirrored", "multi_worker", "tpu")
KERAS_STRATEGIES = {"jax": ("auto", "default", "data_parallel"), "torch": ("auto", "default")}


def split_cpu(devices: int) -> None:
    """Splits the host CPU into `devices` logical devices (before the backend starts).

    Lets MirroredStrategy, DataParallel on JAX (and tests) run several
    replicas on one CPU. PyTorch has no such devices.
    """
    import keras

    if not devices or devices < 2:
        return
    if keras.backend.backend() == "jax":
        flag = f"--xla_force_host_platform_device_count={devices}"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
        return
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        with native_stderr_silenced():  # listing devices probes CUDA, which prints
            cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * devices
        )


def _tf_config():
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as error:
        raise StrategyError(f"TF_CONFIG is not valid JSON: {error}") from None


def _workers(config):
    cluster = (config or {}).get("cluster", {})
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def _check_strategy(name, allowed, backend):
    if name not in allowed:
        expected = f"one of {', '.join(allowed)} on the {backend} backend"
        raise invalid("--strategy", expected, name, StrategyError)


def make(name: str, tpu: str | None = None) -> Any:
    """What `--strategy name` means on the current backend.

    A `tf.distribute.Strategy` on TensorFlow (made before any other
    TensorFlow op runs: multi-worker collectives must be configured first), a
    `keras.distribution.Distribution` or None on JAX and PyTorch.
    """
    import keras

    if keras.backend.backend() == "tensorflow":
        return make_strategy(name, tpu=tpu)
    return make_keras_distribution(name)


def make_keras_distribution(name: str) -> Any:
    """The `keras.distribution.Distribution` for `name` on JAX or PyTorch (None: one device).

    "auto" picks DataParallel when JAX sees several devices (all processes'
    after `keras.distribution.initialize`, which runs when JAX's coordinator
    variables are set).
    """
    import keras

    backend = keras.backend.backend()
    _check_strategy(name, KERAS_STRATEGIES[backend], backend)
    if backend != "jax" or name == "default":
        return None
    if os.environ.get("JAX_COORDINATOR_ADDRESS") or os.environ.get(
        "KERAS_DISTRIBUTION_JOB_ADDRESSES"
    ):
        keras.distribution.initialize()
    devices = keras.distribution.list_devices()
    if name == "auto" and len(devices) < 2:
        return None
    return keras.distribution.DataParallel(devices=devices)


def keras_distribution_shape(distribution: Any) -> tuple[str, int]:
    """`(name, replicas)` of a `keras.distribution.Distribution` (None: one device)."""
    if distribution is None:
        return "default", 1
    return type(distribution).__name__, len(distribution.device_mesh.devices.flat)


def make_strategy(name: str, tpu: str | None = None) -> Any:
    """The `tf.distribute.Strategy` called `name` (see `STRATEGIES`).

    "auto" picks a TPU when `tpu` or `TPU_NAME` names one, multi-worker when
    TF_CONFIG describes a cluster of several workers, mirrored over all GPUs
    when there are several (or over the logical CPUs when the CPU was split),
    and the default one-device strategy otherwise.
    """
    import tensorflow as tf

    _check_strategy(name, TF_STRATEGIES, "tensorflow")
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
            raise StrategyError("--strategy multi_worker needs TF_CONFIG with a cluster and task")
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
    import tensorflow as tf

    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "chief"
    return f"{resolver.task_type}{resolver.task_id}"
