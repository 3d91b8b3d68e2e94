"""The failures of a run that a user causes and can fix, as exception classes.

The commands (`training.train`, `training.tune`, `training.data`,
`training.reproduce`) print these as one line and exit with the status given
in `EXPECTED`; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

from apputil.cli import EXIT_FAILURE, EXIT_USAGE
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


#: Exception class -> exit status; the first matching class wins.
EXPECTED: dict[type[BaseException], int] = {
    UsageError: EXIT_USAGE,
    DataError: EXIT_USAGE,
    StrategyError: EXIT_USAGE,
    DivergenceError: EXIT_USAGE,
    SearchError: EXIT_USAGE,
    OSError: EXIT_FAILURE,
}
