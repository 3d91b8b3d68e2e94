"""What the REST and the gRPC clients share: their error, their argument checks, and the
stream of chunks that carries the recurrent states from answer to request.

`serving.client` (REST, and the command line) and `serving.grpc_client` build on it;
users import every client name from `serving.client`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from apputil.errors import invalid
from serving.codes import status_name
from serving.names import SEQUENCE_INPUT, STREAM_SIGNATURE, check_model_name

DEFAULT_TIMEOUT_SECONDS = 10.0


class ServingError(Exception):
    """A request the server answered with an error (or that never got an answer).

    Attributes:
        status: The HTTP status code (REST), or `None` over gRPC or when no response
            arrived.
        code: The canonical code (`NOT_FOUND`, ...): gRPC's, or the HTTP status'
            (`serving.codes`); `None` when no response arrived.
        message: The server's message, or the transport error.
        url: Where the request went (a URL, or gRPC's `HOST:PORT`).
    """

    def __init__(self, status: int | None, message: str, url: str, code: str | None = None):
        if code is None and status is not None:
            code = status_name(status)
        where = f"HTTP {status} from {url}" if status else f"{code} from {url}" if code else url
        super().__init__(f"{where}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.url = url


class NoStreamSignatureError(ServingError):
    """The served model version has no `stream` signature."""


def _seconds(value: object) -> bool:
    """A finite number that is not a bool (`True` is an `int` in Python)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _check_settings(timeout: object, retries: object, backoff: object) -> None:
    if not _seconds(timeout) or timeout <= 0:  # type: ignore[operator]
        raise invalid("timeout", "a positive number of seconds", timeout)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise invalid("retries", "a non-negative integer", retries)
    if not _seconds(backoff) or backoff < 0:  # type: ignore[operator]
        raise invalid("backoff", "a non-negative number of seconds", backoff)


def as_lists(value: Any) -> Any:
    """Nested NumPy arrays (or anything with `tolist`) as JSON-ready lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: as_lists(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_lists(v) for v in value]
    return value


class StreamingClient:
    """What the REST and gRPC clients share: the stream of chunks with the states carried
    from answer to request. A subclass answers `metadata(version)` as the REST API
    does and `_predict_stream(version, inputs)` with the `stream` signature's outputs."""

    def __init__(self, model: str, timeout: float, retries: int, backoff: float):
        _check_settings(timeout, retries, backoff)
        self.model = check_model_name(model, "model")
        self.timeout, self.retries, self.backoff = timeout, retries, backoff

    def metadata(self, version: int | None = None) -> dict:
        raise NotImplementedError

    def _where(self, version: int) -> str:
        raise NotImplementedError

    def _predict_stream(self, version: int, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        raise NotImplementedError

    def stream_states(self, version: int | None = None) -> tuple[int, dict[str, int]]:
        """`(version, {state input: units})` of the served `stream` signature.

        Raises:
            NoStreamSignatureError: the version has no `stream` signature.
        """
        metadata = self.metadata(version)
        served = int(metadata["model_spec"]["version"])
        signatures = metadata["metadata"]["signature_def"]["signature_def"]
        if STREAM_SIGNATURE not in signatures:
            raise NoStreamSignatureError(
                None,
                f"version {served} of model {self.model!r} has no {STREAM_SIGNATURE!r} "
                "signature (exported with --no-stream, or a model that cannot stream)",
                self._where(served),
            )
        inputs = signatures[STREAM_SIGNATURE]["inputs"]
        states = {
            name: int(info["tensor_shape"]["dim"][-1]["size"])
            for name, info in sorted(inputs.items())
            if name != SEQUENCE_INPUT
        }
        return served, states

    def stream(self, chunks: Iterable[Any], version: int | None = None) -> Iterator[dict]:
        """Send `chunks` one after another to the `stream` signature, carrying the states.

        The version is read once and pinned: a newer version loaded meanwhile
        must not receive states of another model (its removal ends the stream
        with a NOT_FOUND `ServingError`). Each request is independent on the server,
        so the retries of overloaded answers are as safe as for `predict`.

        Args:
            chunks: Arrays or nested lists, each `(t, m)` for one sequence or
                `(batch, t, m)` for a batch (the same batch size throughout).
            version: Optional integer version; the served one when `None`.

        Yields:
            The head's outputs after each chunk (states left out), for one
            sequence without the batch axis: nested lists over REST, arrays over gRPC.
        """
        version, sizes = self.stream_states(version)
        states: dict[str, Any] | None = None
        for chunk in chunks:
            try:
                batch = np.asarray(chunk, "float32")
            except (ValueError, TypeError):  # ragged, or not numbers
                batch = np.zeros(0)
            single = batch.ndim == 2
            if single:
                batch = batch[None]
            if batch.ndim != 3 or 0 in batch.shape:
                raise invalid("chunks", "arrays of shape (t, m) or (batch, t, m)", as_lists(chunk))
            if states is None:
                states = {name: np.zeros((len(batch), size), "float32")
                          for name, size in sizes.items()}  # fmt: skip
            # float32, as the signature takes them.
            arrays = {name: np.asarray(value, "float32") for name, value in states.items()}
            outputs = self._predict_stream(version, {SEQUENCE_INPUT: batch, **arrays})
            states = {name: outputs[name] for name in sizes}
            answer = {name: value for name, value in outputs.items() if name not in sizes}
            yield {name: value[0] for name, value in answer.items()} if single else answer
