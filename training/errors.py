"""The failures of a run that a user causes and can fix, as exception classes.

The commands (`training.train`, `training.tune`, `training.data`,
`training.reproduce`) print these as one line and exit with the status given
in `EXPECTED`; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import signal

from apputil.cli import EXIT_FAILURE, EXIT_USAGE, Status
from apputil.errors import UsageError


class ConfigFileError(UsageError):
    """A `--config` or `--space` YAML file that cannot be read as options."""


class DataError(ValueError):
    """A data set cannot be found or loaded."""


class StrategyError(RuntimeError):
    """A distribution strategy cannot be set up on this machine."""


class DivergenceError(RuntimeError):
    """The training loss became NaN or infinite."""


class SearchError(RuntimeError):
    """A search ended without a completed trial."""


class ProcessLostError(RuntimeError):
    """A process of a multi-process run stopped (killed, crashed or unreachable)."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, no permission); the last one is kept."""

    def __init__(self, path: str, reason: str):
        super().__init__(
            f"cannot write checkpoint {path} ({reason}); the last complete checkpoint is kept: "
            f"free space and run the same command to resume"
        )


class RunLockedError(RuntimeError):
    """Another process is training in the same output folder."""


class Interrupted(Exception):
    """SIGTERM or SIGINT stopped a run after checkpointing the step in progress."""

    def __init__(self, signal_number: int, step: int):
        self.signal_number, self.step = signal_number, step
        name = signal.Signals(signal_number).name
        super().__init__(
            f"stopped by {name} at step {step}, checkpointed; run the same command to resume"
        )


class RunStopped(BaseException):  # noqa: N818  (a request to stop, as KeyboardInterrupt)
    """SIGTERM or SIGINT stopped a run outside a training step (starting, or finishing).

    A `BaseException`, as `KeyboardInterrupt` is: it is raised wherever the
    signal arrives, and code that turns any `Exception` into its own error (a
    data set that cannot be read) must not swallow it.
    """

    def __init__(self, signal_number: int):
        self.signal_number = signal_number
        name = signal.Signals(signal_number).name
        super().__init__(
            f"stopped by {name} outside a training step; run the same command to resume"
        )


class SearchInterrupted(BaseException):  # noqa: N818  (a request to stop, as KeyboardInterrupt)
    """SIGTERM or SIGINT stopped a search; its finished trials are kept.

    A `BaseException`, as `KeyboardInterrupt` is: keras-tuner records any
    `Exception` of a trial as a failed trial and goes on with the next one.
    """

    def __init__(self, signal_number: int, where: str):
        self.signal_number = signal_number
        name = signal.Signals(signal_number).name
        super().__init__(
            f"stopped by {name} {where}; run the same command to continue the search (its "
            f"finished trials are kept)"
        )


class SuiteInterrupted(BaseException):  # noqa: N818  (a request to stop, as KeyboardInterrupt)
    """SIGTERM or SIGINT stopped the reproduction suite; each run in progress was stopped
    by the same signal, which makes it checkpoint its step."""

    def __init__(self, signal_number: int):
        self.signal_number = signal_number
        name = signal.Signals(signal_number).name
        super().__init__(
            f"stopped by {name}; the runs in progress checkpointed their step: run the same "
            f"command to resume"
        )


#: Exception class -> exit status (or a function of the exception); the first match wins.
EXPECTED: dict[type[BaseException], Status] = {
    UsageError: EXIT_USAGE,
    DataError: EXIT_USAGE,
    StrategyError: EXIT_USAGE,
    DivergenceError: EXIT_USAGE,
    SearchError: EXIT_USAGE,
    RunLockedError: EXIT_USAGE,
    # Stopped by a signal: 128 + its number, as a shell reports a process killed by it.
    Interrupted: lambda error: 128 + error.signal_number,
    RunStopped: lambda error: 128 + error.signal_number,
    SearchInterrupted: lambda error: 128 + error.signal_number,
    SuiteInterrupted: lambda error: 128 + error.signal_number,
    ProcessLostError: EXIT_FAILURE,
    OSError: EXIT_FAILURE,
}
