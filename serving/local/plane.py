"""The data plane: what a request asks of the served models, whichever transport carried it.

Both transports decode their wire format (REST's JSON in `serving.local.payload`,
gRPC's TensorProtos in `serving.local.tensors`) and call one `DataPlane`: the
version choice (a version, a label or the served one), the inputs checked against
the signature within one budget of numbers per request, the signature call, and
the metrics of every call. A failure is a `RequestError`, which each transport
answers in its own terms (an HTTP status, a canonical gRPC code).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from serving.local.metrics import ServingMetrics
from serving.local.payload import (
    DEFAULT_MAX_INPUT_ELEMENTS,
    Convert,
    Repository,
    Servable,
    checked_inputs,
    run_signature,
)


class DataPlane:
    """The answers of a repository's models, for every transport.

    Args:
        repository: What answers by model name (`Repository`).
        max_input_elements: The most input numbers one prediction may carry.
        metrics: Where calls are counted and timed (default: a new `ServingMetrics`).
        clock: Seconds of a monotonic clock, for the latencies.
    """

    def __init__(
        self,
        repository: Repository,
        max_input_elements: int = DEFAULT_MAX_INPUT_ELEMENTS,
        metrics: ServingMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.repository = repository
        self.max_input_elements = max_input_elements
        self.metrics = metrics if metrics is not None else ServingMetrics()
        self.clock = clock

    def servable(self, name: str, version: str | None = None, label: str | None = None) -> Any:
        """The servable a request names: a version, a label, or (neither) the served one."""
        return self.repository.get(name, version, label)

    def status(self, name: str, version: str | None = None, label: str | None = None) -> dict:
        """Every version folder of `name` and its state (`GetModelStatus` as JSON)."""
        return self.repository.status(name, version, label)

    def inputs(
        self, servable: Servable, signature_name: str, sent: Mapping[str, Any], convert: Convert
    ) -> dict[str, np.ndarray]:
        """The sent inputs as the signature's checked arrays, within this plane's budget of
        `max_input_elements` numbers (`serving.local.payload.checked_inputs`)."""
        return checked_inputs(servable, signature_name, sent, convert, self.max_input_elements)

    def run(
        self, servable: Servable, signature_name: str, arrays: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """`{output name: array}` of the signature on checked inputs (`inputs`)."""
        return run_signature(servable, signature_name, arrays)

    def record(
        self, name: str, api: str, result: Any, started: float, entrypoint: str = "REST"
    ) -> None:
        """Counts and times one call to `name`'s `api` that ended with `result` (an HTTP
        status or a canonical code), begun at `started` on `clock`."""
        self.metrics.record(name, api, result, self.clock() - started, entrypoint=entrypoint,
                            served=self.repository.serves(name))  # fmt: skip
