"""TensorFlow's `TensorProto` to and from NumPy, as TensorFlow Serving's gRPC API carries
tensors.

A tensor travels as its bytes (`tensor_content`, little-endian): no number goes
through a Python float or a decimal string, so a float32 arrives as the same
float32. Decoding a request's tensor checks it against the signature's input
spec and the request's `serving.local.payload.Budget` of input numbers before an
array is built, as the REST API checks its JSON.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from serving import protos
from serving.local.payload import Budget, bad_request, shape_text, unsupported_spec

if TYPE_CHECKING:
    import tensorflow as tf

# TensorFlow's `DataType` numbers (types.proto) of the dtypes the signatures take, with the
# `TensorProto` field that holds their values when `tensor_content` is not used.
_DTYPES: dict[int, tuple[np.dtype, str]] = {
    1: (np.dtype("float32"), "float_val"),  # DT_FLOAT
    2: (np.dtype("float64"), "double_val"),  # DT_DOUBLE
    3: (np.dtype("int32"), "int_val"),  # DT_INT32
    9: (np.dtype("int64"), "int64_val"),  # DT_INT64
    19: (np.dtype("float16"), "half_val"),  # DT_HALF: bit patterns in int32s
}
_NUMBERS = {dtype: number for number, (dtype, _) in _DTYPES.items()}
_NAMES = {1: "DT_FLOAT", 2: "DT_DOUBLE", 3: "DT_INT32", 9: "DT_INT64", 19: "DT_HALF"}


def _tensor_pb2() -> Any:
    return protos.load().tensor_pb2  # without TensorFlow's Python package


def to_tensor_proto(array: Any) -> Any:
    """`array` (float16/32/64, int32/64) as a `TensorProto` holding its bytes.

    Raises:
        TypeError: a dtype the signatures do not take (bool, strings, ...).
    """
    array = np.asarray(array)
    number = _NUMBERS.get(array.dtype)
    if number is None:
        raise TypeError(
            f"Received an invalid value for argument `array`, expected an array of "
            f"{', '.join(str(d) for d in _NUMBERS)}, got dtype {array.dtype}."
        )
    proto = _tensor_pb2().TensorProto(dtype=number)
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)
    proto.tensor_content = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    return proto


def _shape(proto: Any, what: str) -> list[int]:
    """The dimensions of a `TensorProto`, or a 400 naming it as `what` ("Input 'x'")."""
    if proto.tensor_shape.unknown_rank:
        raise bad_request(f"{what} has an unknown rank")
    return [dim.size for dim in proto.tensor_shape.dim]


def _values(proto: Any, shape: list[int], what: str) -> np.ndarray:
    """The array a `TensorProto` of a known dtype holds, or a 400 naming it as `what`."""
    dtype, field = _DTYPES[proto.dtype]
    size = math.prod(shape)
    if proto.tensor_content:
        needed = size * dtype.itemsize
        if len(proto.tensor_content) != needed:
            raise bad_request(
                f"{what} has {len(proto.tensor_content)} bytes of tensor_content; "
                f"shape {shape} of {dtype.name} takes {needed}"
            )
        return np.frombuffer(proto.tensor_content, dtype.newbyteorder("<")).astype(dtype)
    values = getattr(proto, field)
    if len(values) != size:
        raise bad_request(
            f"{what} has {len(values)} values in {field}; shape {shape} takes {size}"
        )
    if proto.dtype == 19:
        return np.array(values, np.uint16).view(np.float16)
    return np.array(values, dtype)


def to_array(proto: Any, name: str = "tensor") -> np.ndarray:
    """The NumPy array of a `TensorProto` (an answer's output), or a 400 `RequestError`."""
    if proto.dtype not in _DTYPES:
        raise bad_request(f"Output '{name}' has an unsupported dtype {proto.dtype}")
    what = f"Output '{name}'"
    shape = _shape(proto, what)
    return _values(proto, shape, what).reshape(shape)


def input_array(proto: Any, spec: tf.TensorSpec, name: str, budget: Budget) -> np.ndarray:
    """The array of one request input, checked against the signature's `spec`.

    Its dtype must be the spec's (TensorFlow Serving does not convert), its shape
    must match the spec's known sizes with no empty dimension, its numbers are
    counted in `budget` before they are read, and floats must be finite (as over
    REST, whose JSON cannot carry NaN or Infinity).

    Raises:
        RequestError: 400 (INVALID_ARGUMENT) naming the input and what it needs.
    """
    wanted = spec.dtype.as_datatype_enum
    if proto.dtype != wanted:
        got = _NAMES.get(proto.dtype, f"DataType {proto.dtype}")
        raise bad_request(
            f"Input '{name}' expects dtype {_NAMES.get(wanted, spec.dtype.name)}, got {got}"
        )
    if wanted not in _DTYPES or spec.shape.rank is None:
        raise unsupported_spec(spec, name)  # the shape check below needs the spec's rank
    what = f"Input '{name}'"
    shape = _shape(proto, what)
    if len(shape) != spec.shape.rank or any(
        want is not None and want != got for want, got in zip(spec.shape, shape, strict=True)
    ):  # fmt: skip
        raise bad_request(f"Input '{name}' expects shape {shape_text(spec.shape)}, got {shape}")
    if any(size < 1 for size in shape):
        raise bad_request(f"Input '{name}' has an empty dimension (empty batch or sequence)")
    budget.take(math.prod(shape), name)
    array = _values(proto, shape, what).reshape(shape)
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise bad_request(f"Input '{name}' contains NaN or Infinity")
    return array
