"""Canonical status codes: gRPC's code names, as TensorFlow Serving reports every answer.

The REST API answers with HTTP statuses, the gRPC API with these codes; the
metrics count both under the code (`serving.metrics`). An error of the local
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
