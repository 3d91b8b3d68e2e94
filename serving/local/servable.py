"""One loaded SavedModel version (`Servable`), and what a failed load reports.

`serving.local.repository` loads the versions a policy asks for with `Servable`
and keeps `error_status` of each version that failed, as TensorFlow Serving's
model status does.
"""

from __future__ import annotations

import logging
import os
from http import HTTPStatus
from typing import Any

from apputil.quiet import import_tensorflow
from serving.codes import error_text, tensorflow_code
from serving.exports.warmup import WarmupRequestFailed
from serving.exports.warmup import replay as replay_warmup
from serving.local.payload import RequestError
from serving.names import unknown_signature

log = logging.getLogger(__name__)

# The longest error message a status or a log line repeats of a failed load.
_MAX_MESSAGE = 500


class Servable:
    """One loaded SavedModel version: its signatures and its metadata JSON.

    Args:
        path: The version folder (holding `saved_model.pb`).
        version: Integer version number.
        warmup: Replay the version's warmup requests (`serving.exports.warmup`) before it
            is served; a request it refuses fails the load, as in TensorFlow Serving.
    """

    def __init__(self, path: str, version: int, warmup: bool = True):
        # Heavy, and needed only here: routing and HTTP run without TensorFlow.
        tf = import_tensorflow()
        from google.protobuf import json_format
        from tensorflow.core.protobuf import saved_model_pb2

        self.version = version
        self._module = tf.saved_model.load(path)  # kept alive: signatures reference it
        self.signatures = dict(self._module.signatures)
        proto = saved_model_pb2.SavedModel()
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            proto.ParseFromString(f.read())
        # TensorFlow Serving prints the SignatureDefMap proto with field names kept
        # and default values included; so do we.
        self.signature_def = {
            "signature_def": {
                key: json_format.MessageToDict(
                    value,
                    always_print_fields_with_no_presence=True,
                    preserving_proto_field_name=True,
                )
                for key, value in proto.meta_graphs[0].signature_def.items()
            }
        }
        self.max_rank = max(
            (spec.shape.rank or 0 for fn in self.signatures.values() for spec in _specs(fn)),
            default=0,
        )
        if warmup:
            count, seconds = replay_warmup(path, self.signatures)
            if count:
                log.info("Warmed up version %s with %d requests in %.2f s", version, count,
                         seconds)  # fmt: skip

    def input_specs(self, signature_name: str) -> dict[str, Any]:
        """`{name: tf.TensorSpec}` of a signature's inputs, or a 400 `RequestError`."""
        if signature_name not in self.signatures:
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                unknown_signature(signature_name, self.signatures),
                code="FAILED_PRECONDITION",
            )
        return self.signatures[signature_name].structured_input_signature[1]


def _specs(function):
    return function.structured_input_signature[1].values()


def error_status(error: BaseException) -> tuple[str, str]:
    """`(error_code, error_message)` of a load failure, as TF Serving reports one: of
    TensorFlow's pages of context, the line that says what is wrong (an assertion's)."""
    if isinstance(error, WarmupRequestFailed):
        # A Python-side refusal of the request's inputs is an invalid argument too.
        return tensorflow_code(error.error) or "INVALID_ARGUMENT", str(error)[:_MAX_MESSAGE]
    name = tensorflow_code(error)
    if name is not None:
        text = error_text(error) if str(getattr(error, "message", error)).strip() else ""
    else:
        name = (
            "NOT_FOUND" if isinstance(error, FileNotFoundError)
            else "PERMISSION_DENIED" if isinstance(error, PermissionError)
            else "UNKNOWN"
        )  # fmt: skip
        text = f"{type(error).__name__}: {error}"
    first = (text.strip().splitlines() or [""])[0]
    return name, first[:_MAX_MESSAGE]
