"""TensorFlow Serving's REST bodies: `:predict` requests in, predictions and status out.

Work per request is bounded: the raw body is checked cheaply (byte counts)
before `json.loads` builds Python objects, and the decoded inputs must hold at
most `max_elements` numbers in all before NumPy arrays are built.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from apputil.quiet import import_tensorflow
from serving.codes import error_text, status_name
from serving.names import DEFAULT_SIGNATURE, LENGTH_INPUT, PADDED_SIGNATURE, SEQUENCE_INPUT

if TYPE_CHECKING:
    import tensorflow as tf

DEFAULT_MAX_INPUT_ELEMENTS = 1 << 18  # 4,096 digits of 64 x 1
# By dtype name: the specs come from the loaded SavedModel, so this module needs no TensorFlow.
_NUMPY_DTYPES = {
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
    "int32": np.int32,
    "int64": np.int64,
}


class Servable(Protocol):
    """What a request is answered from (`serving.local.servable.Servable` is one)."""

    version: int
    signatures: Mapping[str, Callable[..., Mapping[str, Any]]]
    signature_def: dict
    max_rank: int

    def input_specs(self, signature_name: str) -> Mapping[str, tf.TensorSpec]: ...


class Repository(Protocol):
    """What answers requests by model name (`serving.local.repository.ModelRepository` for one
    model, `serving.local.model_config.Models` for several, with labels)."""

    def get(self, name: str, version: str | None = None, label: str | None = None) -> Any: ...

    def serves(self, name: str) -> bool:
        """Whether `name` is a model it serves (whatever state its versions are in)."""
        ...

    def status(self, name: str, version: str | None = None, label: str | None = None) -> dict: ...


#: The longest error message answered: a message may echo what the request named (a model
#: name, every input name), and past gRPC's 16 KB of trailing metadata a client would read
#: RESOURCE_EXHAUSTED instead of the request's own code.
MAX_MESSAGE_CHARS = 2000


class RequestError(Exception):
    """A request failure: `{"error": message}` with an HTTP status over REST, the canonical
    `code` with the message over gRPC.

    Args:
        status: The HTTP status of the REST answer.
        message: What went wrong, for the client; cut to `MAX_MESSAGE_CHARS` (`...` ends
            a message that was cut).
        code: TensorFlow Serving's canonical code of the failure (`serving.codes`), where
            it is not the HTTP status' own (an unknown signature: FAILED_PRECONDITION).
    """

    def __init__(self, status: int, message: str, code: str | None = None):
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 3] + "..."
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.code = code if code is not None else status_name(self.status)


def bad_request(message: str) -> RequestError:
    """A 400 (INVALID_ARGUMENT) `RequestError` saying `message`."""
    return RequestError(HTTPStatus.BAD_REQUEST, message)


def check_body_size(body: bytes, max_elements: int, max_rank: int) -> None:
    """Refuse a body with more JSON values than any request within the limit needs.

    A request of E numbers with inputs of rank r needs at most about E commas
    and (r + 1) * E brackets; counting bytes is cheap, `json.loads` of a 16 MiB
    body of `[0],` is not (hundreds of MiB of Python lists).
    """
    tokens = body.count(b",") + body.count(b"[") + body.count(b"{")
    if tokens > (max_rank + 2) * max_elements + 1024:
        raise bad_request(
            f"Request body has about {tokens} JSON values, more than inputs of at most "
            f"{max_elements} numbers need (--max-input-elements)"
        )


def _leading_shape(value, rank, name):
    """The lengths along the first elements, `rank` levels deep."""
    shape: list[int] = []
    node = value
    for _ in range(rank):
        if not isinstance(node, list):
            raise bad_request(
                f"Input '{name}' expects a rank-{rank} nested list, got rank {len(shape)}"
            )
        if not node:
            raise bad_request(f"Input '{name}' has an empty dimension (empty batch or sequence)")
        shape.append(len(node))
        node = node[0]
    if isinstance(node, list):
        raise bad_request(f"Input '{name}' expects a rank-{rank} nested list, got a deeper one")
    return shape


def _flatten(value, shape, name):
    """All leaves of a rectangular nested list of `shape`, level by level (no recursion)."""
    level = [value]
    for size in shape:
        below = []
        for item in level:
            if not isinstance(item, list) or len(item) != size:
                raise bad_request(f"Input '{name}' is not a rectangular array of shape {shape}")
            below.extend(item)
        level = below
    return level


def _check_leaves(leaves, spec, name):
    """Numbers only: a boolean, string, null, list or object where a number goes is a 400."""
    allowed = (int,) if spec.dtype.is_integer else (int, float)
    for leaf in leaves:
        if type(leaf) not in allowed:  # type(), not isinstance(): bool is an int subclass
            kind = "boolean" if isinstance(leaf, bool) else type(leaf).__name__
            kind = {"NoneType": "null", "str": "string", "list": "list (ragged nesting)"}.get(
                kind, kind
            )
            raise bad_request(
                f"Input '{name}' expects numbers of type {spec.dtype.name}, got a {kind}"
            )


class Budget:
    """The input numbers one request may still carry: `limit` in all, `used` so far."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0

    def take(self, count: int, name: str) -> None:
        """Counts `count` numbers of input `name`, or raises a 400 past the limit."""
        if self.used + count > self.limit:
            alone = "" if self.used else " alone"
            raise bad_request(
                f"Request has more than {self.limit} input numbers (--max-input-elements); "
                f"input '{name}'{alone} has {count}"
                + (f", after {self.used} in the inputs before it" if self.used else "")
            )
        self.used += count


def as_input_array(value: Any, spec: tf.TensorSpec, name: str, budget: Budget) -> np.ndarray:
    """`value` (nested JSON lists) as an array matching `spec`, or a 400 `RequestError`.

    Args:
        value: The decoded JSON value of one input (all instances).
        spec: The signature's `tf.TensorSpec` for it.
        name: The input name, for messages.
        budget: The `Budget` of this request's input numbers (this input is counted).
    """
    if spec.dtype.name not in _NUMPY_DTYPES or spec.shape.rank is None:
        raise unsupported_spec(spec, name)
    shape = _leading_shape(value, spec.shape.rank, name)
    if any(want is not None and want != got for want, got in zip(spec.shape, shape, strict=True)):
        raise bad_request(f"Input '{name}' expects shape {shape_text(spec.shape)}, got {shape}")
    budget.take(math.prod(shape), name)
    leaves = _flatten(value, shape, name)
    _check_leaves(leaves, spec, name)
    wide = np.int64 if spec.dtype.is_integer else np.float64
    try:
        array = np.array(leaves, dtype=wide).reshape(shape)
    except OverflowError:
        raise bad_request(f"Input '{name}' has values out of {spec.dtype.name} range") from None
    target = _NUMPY_DTYPES[spec.dtype.name]
    with np.errstate(over="ignore"):  # float64 to float32: huge values become inf
        cast = array.astype(target)
    if spec.dtype.is_integer and not np.array_equal(cast, array):
        raise bad_request(f"Input '{name}' has values out of {spec.dtype.name} range")
    if not spec.dtype.is_integer and not np.isfinite(cast).all():
        raise bad_request(
            f"Input '{name}' contains NaN, Infinity or values out of {spec.dtype.name} range"
        )
    return cast


def unsupported_spec(spec: Any, name: str) -> RequestError:
    """The 400 for a signature input neither transport can take: a dtype it does not
    carry, or no rank to check a request's shape against."""
    return bad_request(f"Input '{name}' has an unsupported dtype or unknown rank: {spec}")


def shape_text(shape: Any) -> str:
    """A `tf.TensorShape` as TensorFlow Serving writes it: `[-1, 64, 1]`."""
    return "[" + ", ".join("-1" if d is None else str(d) for d in shape.as_list()) + "]"


def _reject_constant(name):
    raise bad_request(f"JSON Parse error: {name} is not a valid JSON number")


def decode_json(body: bytes | str) -> Any:
    """`json.loads` with TensorFlow Serving's 400s (also for nesting too deep to parse)."""
    try:
        # JSON between systems is UTF-8 (RFC 8259); json.loads would also guess UTF-16/32.
        text = body.decode("utf-8") if isinstance(body, bytes | bytearray) else body
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise bad_request("JSON Parse error: nesting too deep") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise bad_request(f"JSON Parse error: {error}") from None


def parse_predict_request(
    body: bytes, servable: Servable, max_elements: int = DEFAULT_MAX_INPUT_ELEMENTS
) -> tuple[str, dict[str, Any], bool]:
    """Decode a `:predict` body into `(signature_name, {input: value}, row_format)`.

    Args:
        body: The raw request bytes.
        servable: The `Servable` that will answer.
        max_elements: The most input numbers (all inputs, all instances) accepted.

    Returns:
        The signature name, the decoded inputs by name (nested lists; `checked_inputs`
        makes them arrays) and whether the request used the row (`instances`) format.
    """
    check_body_size(body, max_elements, servable.max_rank)
    request = decode_json(body)
    if not isinstance(request, dict):
        raise bad_request("JSON Value is not an object")
    signature_name = request.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(signature_name, str):
        raise bad_request("'signature_name' must be a string")
    specs = servable.input_specs(signature_name)
    has_rows, has_columns = "instances" in request, "inputs" in request
    if has_rows == has_columns:
        raise bad_request(
            "Missing 'inputs' or 'instances' key"
            if not has_rows
            else "Request must contain either 'instances' or 'inputs', not both"
        )
    columns = _rows_to_columns(request["instances"], specs) if has_rows else request["inputs"]
    # One input may be sent bare or named, as TensorFlow Serving allows; an object is
    # always named inputs (a tensor is never an object), so unknown names are reported.
    if not has_rows and len(specs) == 1 and not isinstance(columns, dict):
        columns = {next(iter(specs)): columns}
    if not isinstance(columns, dict):
        raise bad_request(f"Expected inputs {sorted(specs)}, got a single unnamed tensor")
    return signature_name, columns, has_rows


#: Converts one sent input to its checked array: `(value, spec, name, budget)`.
Convert = Callable[[Any, "tf.TensorSpec", str, Budget], np.ndarray]


def checked_inputs(
    servable: Servable,
    signature_name: str,
    sent: Mapping[str, Any],
    convert: Convert = as_input_array,
    max_elements: int = DEFAULT_MAX_INPUT_ELEMENTS,
) -> dict[str, np.ndarray]:
    """The sent inputs as the signature's checked arrays, whatever carried them: exactly
    its input names, each converted by `convert` (JSON lists: `as_input_array`; gRPC's
    TensorProtos: `serving.local.tensors.input_array`) within one budget of
    `max_elements` numbers, and valid together (batch sizes, `padded` lengths)."""
    specs = servable.input_specs(signature_name)
    if set(sent) != set(specs):
        raise bad_request(inputs_mismatch(sent, specs))
    budget = Budget(max_elements)
    arrays = {name: convert(sent[name], specs[name], name, budget) for name in specs}
    check_together(signature_name, arrays)
    return arrays


def check_together(signature_name: str, arrays: Mapping[str, np.ndarray]) -> None:
    """A 400 for inputs each valid alone but not together: different batch sizes, or
    `padded` lengths beyond the sequence's steps (`check_lengths`)."""
    if len({a.shape[0] for a in arrays.values() if a.ndim}) > 1:
        raise bad_request("Inputs have different batch sizes")
    if signature_name == PADDED_SIGNATURE:
        check_lengths(arrays)


def check_lengths(arrays: Mapping[str, np.ndarray]) -> None:
    """A 400 naming the first row whose `length` is not 1..T (the steps of `sequence`).

    The `padded` signature asserts the same in its graph; checked here, the
    answer says which row and what range instead of TensorFlow's words.
    """
    if LENGTH_INPUT not in arrays or SEQUENCE_INPUT not in arrays:
        return
    lengths, steps = arrays[LENGTH_INPUT].reshape(-1), arrays[SEQUENCE_INPUT].shape[1]
    outside = np.flatnonzero((lengths < 1) | (lengths > steps))
    if outside.size:
        row = int(outside[0])
        raise bad_request(
            f"Input '{LENGTH_INPUT}' of row {row} is {int(lengths[row])}; each row's length "
            f"must be in 1..{steps} (the steps of input '{SEQUENCE_INPUT}')"
        )


def inputs_mismatch(sent: Any, specs: Any) -> str:
    """TensorFlow Serving's message for inputs that are not the signature's (predict_util.cc)."""
    sent, wanted = sorted(sent), sorted(specs)
    extra = [name for name in sent if name not in specs]
    missing = [name for name in wanted if name not in sent]
    return (
        f"input size does not match signature: {len(sent)}!={len(wanted)} "
        f"len({{{','.join(sent)}}}) != len({{{','.join(wanted)}}}). "
        f"Sent extra: {{{','.join(extra)}}}. Missing but required: {{{','.join(missing)}}}."
    )


def _rows_to_columns(instances, specs):
    """Row format (`[instance, ...]`) to `{input: [value, ...]}`."""
    if not isinstance(instances, list):
        raise bad_request("'instances' must be a JSON list")
    if not instances:
        raise bad_request("'instances' is an empty list (empty batch)")
    names = list(specs)
    if all(isinstance(row, dict) for row in instances):
        if any(set(row) != set(instances[0]) for row in instances):
            raise bad_request(f"Every instance must have exactly the keys {names}")
        if set(instances[0]) != set(names):
            raise bad_request(inputs_mismatch(instances[0], specs))
        return {name: [row[name] for row in instances] for name in names}
    if len(names) != 1 or any(isinstance(row, dict) for row in instances):
        raise bad_request(
            f"Instances must be objects with keys {names} (or all plain values for one input)"
        )
    return {names[0]: instances}


def run_signature(
    servable: Servable, signature_name: str, arrays: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """`{output name: array}` of a signature called on checked inputs, or a 400 `RequestError`
    with the line of TensorFlow's error that says what is wrong (a failed assertion)."""
    tf = import_tensorflow()  # loaded already with the servable; the signatures take tensors
    function = servable.signatures[signature_name]
    try:
        outputs = function(**{k: tf.constant(v) for k, v in arrays.items()})
    except (tf.errors.InvalidArgumentError, ValueError, TypeError) as error:
        raise bad_request(error_text(error)) from None
    return {name: tensor.numpy() for name, tensor in outputs.items()}


def predict_body(outputs: Mapping[str, np.ndarray], signature_name: str, row_format: bool
                 ) -> dict:  # fmt: skip
    """A signature's outputs as TensorFlow Serving's REST API answers them.

    Returns:
        `{"predictions": [...]}` for the row format (one object per instance
        when the signature has several outputs) or `{"outputs": ...}` for the
        columnar format (an object of named outputs when there are several).
    """
    for name, value in sorted(outputs.items()):
        if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
            row = int(np.argwhere(~np.isfinite(value))[0][0]) if value.ndim else 0
            raise bad_request(
                f"Output '{name}' of signature '{signature_name}' holds NaN or Infinity "
                f"(row {row}), which JSON cannot carry: the inputs (a state, say) drive the "
                f"model out of {value.dtype.name} range"
            )
    single = next(iter(outputs.values())) if len(outputs) == 1 else None
    if not row_format:
        if single is not None:
            return {"outputs": single.tolist()}
        return {"outputs": {name: value.tolist() for name, value in sorted(outputs.items())}}
    if single is not None:
        return {"predictions": single.tolist()}
    batch = next(iter(outputs.values())).shape[0]
    columns = {name: value.tolist() for name, value in sorted(outputs.items())}
    return {"predictions": [{name: col[i] for name, col in columns.items()} for i in range(batch)]}


def model_metadata(servable: Servable, name: str) -> dict:
    """The `GET /v1/models/NAME/metadata` body."""
    return {
        "model_spec": {"name": name, "signature_name": "", "version": str(servable.version)},
        "metadata": {"signature_def": servable.signature_def},
    }
