"""`GrpcClient`: one model of a TensorFlow Serving gRPC endpoint, with TensorFlow Serving's
own protos (loaded without TensorFlow's Python package, `serving.protos`) and grpcio's own
retry policy. Import it from `serving.client`.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from apputil.errors import Literal, invalid
from serving import protos
from serving.client_base import (
    DEFAULT_TIMEOUT_SECONDS,
    ServingError,
    StreamingClient,
)
from serving.local import tensors
from serving.names import DEFAULT_SIGNATURE, STREAM_SIGNATURE, unknown_signature


def _check_target(target: object) -> str:
    """`target` if it is a gRPC `HOST:PORT` (IPv6 in brackets), else a `UsageError`."""
    text = target if isinstance(target, str) else ""
    host, _, port = text.rpartition(":")
    if not (host and port.isdigit() and 0 < int(port) < 65536 and "/" not in text):
        raise invalid("grpc", "HOST:PORT of a gRPC endpoint, e.g. 127.0.0.1:8500", target)
    return text


class GrpcClient(StreamingClient):
    """Calls one model of a TensorFlow Serving gRPC endpoint (`PredictionService`,
    `ModelService`), with TensorFlow Serving's own protos.

    Tensors travel as their bytes (`serving.local.tensors`): a float32 array arrives as
    the same float32 numbers, and nothing is formatted or parsed as text.

    Args:
        target: `HOST:PORT`, e.g. `127.0.0.1:8500`.
        model: The model name.
        timeout: Seconds to wait for each answer (the call's deadline).
        retries: How many times to retry a call refused as RESOURCE_EXHAUSTED
            (too many calls at once) or UNAVAILABLE (not reachable yet, draining),
            at most 4 (grpcio's retry policy: 5 attempts in all); within `timeout`.
        backoff: Seconds of the first retry's back-off (gRPC jitters it), doubled
            after each; at least 10 ms (shorter ones, zero included, wait 10 ms).
    """

    def __init__(
        self,
        target: str,
        model: str,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        retries: int = 3,
        backoff: float = 0.2,
    ):
        super().__init__(model, timeout, retries, backoff)
        self.target = _check_target(target)
        # Heavy, and needed only here: the REST client runs without them.
        import grpc

        self._grpc, self._protos = grpc, protos.load()  # the protos without TensorFlow
        self.channel = grpc.insecure_channel(self.target, options=_retry_options(retries, backoff))
        self._prediction = self._protos.prediction_service_pb2_grpc.PredictionServiceStub(
            self.channel
        )
        self._models = self._protos.model_service_pb2_grpc.ModelServiceStub(self.channel)
        self._input_dtypes: dict[tuple[int | None, str], dict[str, str]] = {}

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()

    def __enter__(self) -> GrpcClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _where(self, version: int) -> str:
        return self.target

    def call(self, method: Any, request: Any) -> Any:
        """`method(request)` within the deadline, retried by the channel's policy; a
        `ServingError` with the canonical code when the server refuses it or cannot be
        reached."""
        try:
            return method(request, timeout=self.timeout)
        except self._grpc.RpcError as error:
            code = error.code()
            raise ServingError(None, error.details() or code.name, self.target,
                               code=code.name) from None  # fmt: skip

    def _spec(self, request: Any, version: int | None, signature_name: str | None = None) -> None:
        request.model_spec.name = self.model
        if version is not None:
            request.model_spec.version.value = int(version)
        if signature_name is not None:
            request.model_spec.signature_name = signature_name

    def status(self, version: int | None = None) -> dict:
        """`ModelService.GetModelStatus`, as the REST API's JSON body."""
        from google.protobuf import json_format

        request = self._protos.get_model_status_pb2.GetModelStatusRequest()
        self._spec(request, version)
        return _as_json(json_format, self.call(self._models.GetModelStatus, request))

    def metadata(self, version: int | None = None) -> dict:
        """`PredictionService.GetModelMetadata` (the signature definitions), as the REST
        API's JSON body."""
        from google.protobuf import json_format

        get_model_metadata_pb2 = self._protos.get_model_metadata_pb2
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        self._spec(request, version)
        response = self.call(self._prediction.GetModelMetadata, request)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signatures)
        spec = _as_json(json_format, response.model_spec)
        spec.setdefault("signature_name", "")
        return {
            "model_spec": spec,
            "metadata": {"signature_def": _as_json(json_format, signatures)},
        }

    def predict(
        self,
        inputs: Any,
        version: int | None = None,
        signature_name: str | None = None,
    ) -> dict:
        """`PredictionService.Predict`: `{"model_spec": ..., "outputs": {name: array}}`.

        Args:
            inputs: `{input name: array}`, or one array for a signature of one input.
                NumPy arrays are sent with their dtype (the signature's must match);
                nested lists take the signature's dtype (read once per version).
            version: Optional integer version; the newest when `None`.
            signature_name: Optional signature; `serving_default` when `None`.
        """
        predict_pb2 = self._protos.predict_pb2
        signature = signature_name or DEFAULT_SIGNATURE
        named = inputs if isinstance(inputs, dict) else None
        if named is None or any(not isinstance(v, np.ndarray) for v in named.values()):
            dtypes = self._dtypes(version, signature)
            if named is None:
                if len(dtypes) != 1:
                    raise invalid("inputs", f"a mapping of the inputs {sorted(dtypes)}",
                                  Literal("one unnamed tensor"))  # fmt: skip
                named = {next(iter(dtypes)): inputs}
            named = {name: value if isinstance(value, np.ndarray)
                     else np.asarray(value, dtypes.get(name, "float32"))
                     for name, value in named.items()}  # fmt: skip
        request = predict_pb2.PredictRequest()
        self._spec(request, version, signature_name)
        for name, value in named.items():
            request.inputs[name].CopyFrom(tensors.to_tensor_proto(value))
        response = self.call(self._prediction.Predict, request)
        return {
            "model_spec": {"name": response.model_spec.name,
                           "version": str(response.model_spec.version.value),
                           "signature_name": response.model_spec.signature_name},
            "outputs": {name: tensors.to_array(value, name)
                        for name, value in response.outputs.items()},
        }  # fmt: skip

    def _dtypes(self, version: int | None, signature: str) -> dict[str, str]:
        """`{input: NumPy dtype name}` of a signature of the served (or given) version; a
        given version's are read once, the served one's at each call (it may change)."""
        if (version, signature) in self._input_dtypes:
            return self._input_dtypes[(version, signature)]
        metadata = self.metadata(version)
        key = (int(metadata["model_spec"]["version"]), signature)
        if key not in self._input_dtypes:
            signatures = metadata["metadata"]["signature_def"]["signature_def"]
            if signature not in signatures:
                message = unknown_signature(signature, signatures)
                raise ServingError(None, message, self.target, code="FAILED_PRECONDITION")
            self._input_dtypes[key] = {
                name: _NUMPY_DTYPES.get(info["dtype"], "float32")
                for name, info in signatures[signature]["inputs"].items()
            }
        if version is not None:
            self._input_dtypes[(version, signature)] = self._input_dtypes[key]
        return self._input_dtypes[key]

    def _predict_stream(self, version: int, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        return self.predict(inputs, version, STREAM_SIGNATURE)["outputs"]


_NUMPY_DTYPES = {"DT_FLOAT": "float32", "DT_DOUBLE": "float64", "DT_HALF": "float16",
                 "DT_INT32": "int32", "DT_INT64": "int64"}  # fmt: skip


#: gRPC's most attempts of a call: `maxAttempts` above it count as this.
MAX_GRPC_ATTEMPTS = 5


#: The back-offs given to gRPC's service config. Its durations count whole milliseconds,
#: refuse zero and end at protobuf's 10,000 years; and grpcio's retry loses calls whose
#: back-off is a few milliseconds: they wait for their deadline instead of the next
#: attempt (https://github.com/grpc/grpc/issues/41036; seen with 1 ms, not with 10 ms).
GRPC_BACKOFF_RANGE = (0.01, 315_576_000_000.0)


def _grpc_duration(seconds: float) -> str:
    """`seconds` as a service config's duration, within `GRPC_BACKOFF_RANGE`: a shorter
    back-off (zero, as the REST client allows) waits 10 ms, and one longer than gRPC's
    longest would outlast any deadline either way."""
    low, high = GRPC_BACKOFF_RANGE
    return f"{min(max(seconds, low), high):.3f}s"


def _retry_options(retries: int, backoff: float) -> list[tuple[str, Any]]:
    """The channel options of grpcio's own retry policy: RESOURCE_EXHAUSTED and
    UNAVAILABLE retried `retries` times (at most 4: gRPC's limit of 5 attempts), with
    jittered back-off from `backoff` seconds, doubling; the call's deadline covers them all."""
    if retries == 0:
        return [("grpc.enable_retries", 0)]
    policy = {
        "maxAttempts": min(retries + 1, MAX_GRPC_ATTEMPTS),
        "initialBackoff": _grpc_duration(backoff),
        "maxBackoff": _grpc_duration(max(backoff, 10.0)),
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["RESOURCE_EXHAUSTED", "UNAVAILABLE"],
    }
    config = {"methodConfig": [{"name": [{}], "retryPolicy": policy}]}
    return [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(config))]


def _as_json(json_format: Any, message: Any) -> dict:
    """A proto as TensorFlow Serving's REST API writes it: field names kept, defaults shown."""
    return json_format.MessageToDict(
        message, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )
