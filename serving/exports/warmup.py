"""TensorFlow Serving's warmup requests: written with an export, replayed when a version loads.

TensorFlow Serving replays the records of `assets.extra/tf_serving_warmup_requests`
(a TFRecord file of `PredictionLog` protos) through a version before it
marks it AVAILABLE, so the first user request does not pay for tracing and
graph initialization. `serving.export` writes one representative request per
signature (a batch of one: zeros, the full sequence, a `length` of all its
steps, zero states); the local server replays them the same way (`replay`).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from serving.codes import error_text
from serving.names import DEFAULT_SIGNATURE, LENGTH_INPUT

#: Where TensorFlow Serving looks for warmup requests in a version folder.
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
#: The most records TensorFlow Serving replays: a file with more fails the load.
MAX_WARMUP_RECORDS = 1000


class WarmupRecordsError(ValueError):
    """A warmup file a version cannot be warmed up from (too many records, or one that
    is no predict request, or names a signature the version lacks)."""

    error_code = 3  # tf.errors.INVALID_ARGUMENT, as TensorFlow Serving answers these


class WarmupRequestFailed(Exception):
    """A warmup request the version's signature refused; its text is one line, the one of
    TensorFlow's error that says what is wrong (a failed assertion's).

    Attributes:
        index: The request's record number in the warmup file.
        signature: The signature it called.
        error: What the signature raised (TensorFlow's error, with its code).
    """

    def __init__(self, index: int, signature: str, error: BaseException):
        super().__init__(
            f"warmup request {index} (signature {signature!r}) failed: {error_text(error)}"
        )
        self.index, self.signature, self.error = index, signature, error


def representative_inputs(function: Any) -> dict[str, np.ndarray]:
    """Zeros for each input of a signature, a batch of one; an integer `length` input is
    the number of steps of the other inputs (every step valid)."""
    specs = function.structured_input_signature[1]
    arrays: dict[str, np.ndarray] = {}
    steps = 1
    for name, spec in sorted(specs.items()):
        if name == LENGTH_INPUT:
            continue
        shape = [1, *(1 if dim is None else dim for dim in spec.shape[1:])]
        if len(shape) == 3:
            steps = shape[1]
        arrays[name] = np.zeros(shape, spec.dtype.as_numpy_dtype)
    if LENGTH_INPUT in specs:
        arrays[LENGTH_INPUT] = np.full([1], steps, specs[LENGTH_INPUT].dtype.as_numpy_dtype)
    return arrays


def write(version_dir: str, signatures: dict[str, Any]) -> str:
    """Writes one `PredictionLog` per signature to `version_dir/WARMUP_FILE`; its path."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    path = os.path.join(version_dir, WARMUP_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as records:
        for name, function in sorted(signatures.items()):
            request = predict_pb2.PredictRequest()
            request.model_spec.signature_name = name
            for key, array in representative_inputs(function).items():
                request.inputs[key].CopyFrom(tf.make_tensor_proto(array))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)
            )
            records.write(log.SerializeToString())
    return path


def read(version_dir: str) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The predict requests of a version's warmup file: `(signature, arrays)` each (none
    without the file). Raises `WarmupRecordsError` for a record that is no predict
    request and for a file of more than `MAX_WARMUP_RECORDS` records."""
    path = os.path.join(version_dir, WARMUP_FILE)
    if not os.path.isfile(path):
        return []
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    requests = []
    for index, record in enumerate(tf.data.TFRecordDataset(path).as_numpy_iterator()):
        if index == MAX_WARMUP_RECORDS:
            raise WarmupRecordsError(f"Number of warmup records exceeds the maximum "
                                     f"({MAX_WARMUP_RECORDS:,}) at {path}")  # fmt: skip
        log = prediction_log_pb2.PredictionLog.FromString(record)
        if log.WhichOneof("log_type") != "predict_log":
            raise WarmupRecordsError(f"warmup record {index} of {path} is not a predict request")
        request = log.predict_log.request
        arrays = {key: tf.make_ndarray(proto) for key, proto in request.inputs.items()}
        requests.append((request.model_spec.signature_name or DEFAULT_SIGNATURE, arrays))
    return requests


def replay(version_dir: str, signatures: dict[str, Any]) -> tuple[int, float]:
    """Runs every warmup request of `version_dir` through `signatures`; `(count, seconds)`.

    Raises `WarmupRecordsError` for a file `read` refuses or a request naming a
    signature the version lacks; `WarmupRequestFailed` when a signature refuses its
    request (the version is then not served, as TensorFlow Serving fails a load whose
    warmup fails).
    """
    import tensorflow as tf

    started = time.monotonic()
    requests = read(version_dir)
    for index, (signature, arrays) in enumerate(requests):
        if signature not in signatures:
            raise WarmupRecordsError(
                f"a warmup request names signature {signature!r}, which is absent"
            )
        try:
            signatures[signature](**{key: tf.constant(value) for key, value in arrays.items()})
        except Exception as error:
            raise WarmupRequestFailed(index, signature, error) from error
    return len(requests), time.monotonic() - started
