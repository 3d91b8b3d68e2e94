"""`start(launch)`: the backend of this process, made once from a `LaunchConfig`.

The one place that looks at `keras.backend.backend()` to pick a
`training.backends.backend.Backend`; commands call it after parsing their
flags and hand the result down.
"""

from __future__ import annotations

from training.backends.backend import Backend
from training.backends.cluster import Cluster
from training.backends.launch_config import LaunchConfig


def start(launch: LaunchConfig | None = None, cluster: Cluster | None = None) -> Backend:
    """The backend of the current Keras backend, set up as `launch` says.

    Splits the CPU (`cpu_devices`), joins the JAX processes into `cluster`
    (the coordinator, count and index of `launch`, else of the environment)
    and makes the strategy (`launch.strategy`).

    Raises:
        StrategyError: a strategy the backend does not have, or processes that
            cannot join.
    """
    import keras

    launch = launch or LaunchConfig()
    backend = keras.backend.backend()
    if backend == "tensorflow":
        from training.backends.strategies import TensorFlowBackend

        return TensorFlowBackend.make(launch)
    from training.backends.distributions import JaxBackend, TorchBackend

    if backend == "jax":
        return JaxBackend.make(launch, cluster)
    return TorchBackend.make(launch)
