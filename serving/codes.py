"""Canonical status codes: gRPC's code names, as TensorFlow Serving reports every answer.

The REST API answers with HTTP statuses, the gRPC API with these codes; the
metrics count both under the code (`serving.local.metrics`). An error of the local
server carries its HTTP status and, where TensorFlow Serving's gRPC answer
differs from the HTTP status' own code (an unknown signature is
FAILED_PRECONDITION, answered 400 over REST), the code too.
"""

from __future__ import annotations

from http import HTTPStatus

#: The canonical code of each HTTP status the REST API answers.
STATUS_NAMES = {
    HTTPStatus.OK: "OK",
    HTTPStatus.BAD_REQUEST: "INVALID_ARGUMENT",
    HTTPStatus.NOT_FOUND: "NOT_FOUND",
    HTTPStatus.METHOD_NOT_ALLOWED: "UNIMPLEMENTED",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "RESOURCE_EXHAUSTED",
    HTTPStatus.SERVICE_UNAVAILABLE: "UNAVAILABLE",
    HTTPStatus.INTERNAL_SERVER_ERROR: "INTERNAL",
}


def status_name(status: int) -> str:
    """The canonical code of an HTTP status (`UNKNOWN` for one the API does not use)."""
    return STATUS_NAMES.get(HTTPStatus(status), "UNKNOWN")


# TensorFlow's error codes (tf.errors.OpError.error_code) by number, as TF Serving names them.
_TENSORFLOW_CODES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED",
)  # fmt: skip


def tensorflow_code(error: BaseException) -> str | None:
    """The code name of a TensorFlow error (`tf.errors.OpError.error_code`, read without
    importing TensorFlow); None for any other error, and for OK, which is no failure."""
    code = getattr(error, "error_code", None)
    if isinstance(code, int) and 0 < code < len(_TENSORFLOW_CODES):
        return _TENSORFLOW_CODES[code]
    return None


# Lines of TensorFlow's errors that say nothing about the request.
_NOISE = ("Graph execution error:", "Detected at node", "Detected unsupported operations")


def error_text(error: BaseException) -> str:
    """The line of a TensorFlow error that says what is wrong (an assertion's message)."""
    text = str(getattr(error, "message", None) or error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if "assertion failed" in line.lower() or line.startswith("Input '"):
            return line[:500]
    useful = [line for line in lines if not line.startswith(_NOISE)]
    return (useful or lines or [type(error).__name__])[0][:500]
