"""Time limits of the suite, scaled by one factor for slower or busier machines.

A limit here is how long a test waits before it calls something hung (a subprocess, a
server's answer, a thread), never the duration a behaviour is about (a deadline the test
sets to see it pass). `KERAS_ANTISYM_TEST_TIME_FACTOR` (default 1) multiplies every such
limit, the per-test `pytest.mark.timeout`s and pyproject's default among them
(`tests/conftest.py`): `KERAS_ANTISYM_TEST_TIME_FACTOR=3` on a machine three times slower.
"""

import math
import os

FACTOR_VARIABLE = "KERAS_ANTISYM_TEST_TIME_FACTOR"


def _factor() -> float:
    text = os.environ.get(FACTOR_VARIABLE, "1")
    try:
        factor = float(text)
    except ValueError:
        factor = math.nan
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(
            f"Received an invalid value for argument `{FACTOR_VARIABLE}`, expected a positive "
            f"number, got {text!r}."
        )
    return factor


TIME_FACTOR = _factor()


def limit(seconds: float) -> float:
    """`seconds` of waiting for something to end, on this machine."""
    return seconds * TIME_FACTOR
