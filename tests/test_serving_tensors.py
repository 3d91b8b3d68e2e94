"""`serving.local.tensors`: TensorProto to and from NumPy, bytes exact, checked against the spec."""

import numpy as np
import pytest
import tensorflow as tf

from serving.local import tensors
from serving.local.payload import Budget, RequestError


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64"])
def test_every_signature_dtype_round_trips_bit_for_bit(dtype):
    rng = np.random.default_rng(0)
    array = (rng.normal(size=(2, 3, 4)) * 1000).astype(dtype)
    proto = tensors.to_tensor_proto(array)
    assert proto.tensor_content == array.astype(array.dtype.newbyteorder("<")).tobytes()
    back = tensors.to_array(proto)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tobytes() == array.tobytes()
    # TensorFlow reads the proto as the same tensor.
    np.testing.assert_array_equal(tf.make_ndarray(proto), array)


def test_a_float32_keeps_every_bit_where_a_decimal_string_would_not():
    tiny = np.array([np.float32(0.1), np.nextafter(np.float32(1), np.float32(2)), 3e-45],
                    "float32")  # fmt: skip
    assert tensors.to_array(tensors.to_tensor_proto(tiny)).tobytes() == tiny.tobytes()


@pytest.mark.parametrize(
    ("dtype", "values"),
    [(tf.float32, [0.5, -1.25, 3.0, 4.0]), (tf.float64, [1e300, 2.0, -3.0, 0.0]),
     (tf.int32, [1, -2, 3, 2**31 - 1]), (tf.int64, [2**40, -1, 0, 7]),
     (tf.float16, [0.5, 1.0, -2.0, 65504.0])],
)  # fmt: skip
def test_tensors_in_typed_value_fields_are_read_as_tensorflow_reads_them(dtype, values):
    """Other clients send `float_val` and friends instead of `tensor_content`."""
    proto = tf.make_tensor_proto(values, dtype=dtype, shape=[2, 2])
    proto.ClearField("tensor_content")
    field = {tf.float32: "float_val", tf.float64: "double_val", tf.int32: "int_val",
             tf.int64: "int64_val", tf.float16: "half_val"}[dtype]  # fmt: skip
    if not getattr(proto, field):
        expected = np.array(values, dtype.as_numpy_dtype)
        raw = expected.view(np.uint16) if dtype == tf.float16 else expected
        getattr(proto, field).extend(raw.tolist())
    array = tensors.to_array(proto)
    assert array.dtype == dtype.as_numpy_dtype  # not NumPy's default for the field's numbers
    np.testing.assert_array_equal(array, np.array(values, dtype.as_numpy_dtype).reshape(2, 2))
    np.testing.assert_array_equal(array, tf.make_ndarray(proto))
    spec = tf.TensorSpec([None, 2], dtype)
    np.testing.assert_array_equal(tensors.input_array(proto, spec, "x", Budget(4)), array)


def test_an_unsupported_dtype_is_refused_naming_the_argument():
    with pytest.raises(TypeError, match="argument `array`, expected an array of .*got dtype bool"):
        tensors.to_tensor_proto(np.array([True]))


def test_inputs_are_counted_against_the_budget_before_they_are_read():
    proto = tensors.to_tensor_proto(np.zeros((3, 4), "float32"))
    spec = tf.TensorSpec([None, 4], tf.float32)
    budget = Budget(20)
    tensors.input_array(proto, spec, "a", budget)
    assert budget.used == 12
    with pytest.raises(RequestError) as refused:
        tensors.input_array(proto, spec, "b", budget)
    assert refused.value.code == "INVALID_ARGUMENT"
    assert refused.value.message == (
        "Request has more than 20 input numbers (--max-input-elements); input 'b' has 12, "
        "after 12 in the inputs before it"
    )


def test_an_input_of_an_unknown_dtype_number_is_named():
    proto = tensors.to_tensor_proto(np.zeros((1, 2), "float32"))
    proto.dtype = 7  # DT_STRING
    with pytest.raises(RequestError, match="Input 'x' expects dtype DT_FLOAT, got DataType 7"):
        tensors.input_array(proto, tf.TensorSpec([None, 2], tf.float32), "x", Budget(10))


def _refusal(proto, spec, name="x"):
    with pytest.raises(RequestError) as refused:
        tensors.input_array(proto, spec, name, Budget(100))
    assert refused.value.code == "INVALID_ARGUMENT"
    return refused.value.message


def test_a_dtype_outside_the_table_is_named_as_tensorflow_names_it():
    proto = tensors.to_tensor_proto(np.zeros((1, 2), "float32"))
    assert _refusal(proto, tf.TensorSpec([None, 2], tf.bool)) == (
        "Input 'x' expects dtype bool, got DT_FLOAT"
    )


@pytest.mark.parametrize(
    ("spec", "dtype_number"),
    [(tf.TensorSpec([None, 2], tf.bool), 10),  # DT_BOOL: sent as asked, still not taken
     (tf.TensorSpec(None, tf.float32), 1)],  # any rank: no shape to check it against
)  # fmt: skip
def test_a_spec_without_a_table_dtype_or_a_rank_is_refused_as_over_rest(spec, dtype_number):
    proto = tensors.to_tensor_proto(np.zeros((1, 2), "float32"))
    proto.dtype = dtype_number
    assert _refusal(proto, spec) == f"Input 'x' has an unsupported dtype or unknown rank: {spec}"


@pytest.mark.parametrize(
    ("shape", "spec_shape"),
    [((2, 3), [None, 2]),  # the rank fits, a size does not
     ((2, 2, 1), [None, 2]),  # one dimension too many
     ((4,), [None, 2])],  # one too few
)  # fmt: skip
def test_a_shape_that_does_not_fit_the_spec_is_refused_naming_both(shape, spec_shape):
    proto = tensors.to_tensor_proto(np.zeros(shape, "float32"))
    assert _refusal(proto, tf.TensorSpec(spec_shape, tf.float32)) == (
        f"Input 'x' expects shape [-1, 2], got {list(shape)}"
    )


def test_a_tensor_of_unknown_rank_is_refused_naming_it():
    proto = tensors.to_tensor_proto(np.zeros((1, 2), "float32"))
    proto.tensor_shape.unknown_rank = True
    assert _refusal(proto, tf.TensorSpec([None, 2], tf.float32), "seq") == (
        "Input 'seq' has an unknown rank"
    )
    with pytest.raises(RequestError, match=r"^Output 'out' has an unknown rank$"):
        tensors.to_array(proto, "out")


def test_values_that_do_not_fill_the_shape_are_counted_in_the_refusal():
    content = tensors.to_tensor_proto(np.zeros((2, 2), "float32"))
    content.tensor_content = content.tensor_content[:12]
    spec = tf.TensorSpec([None, 2], tf.float32)
    assert _refusal(content, spec) == (
        "Input 'x' has 12 bytes of tensor_content; shape [2, 2] of float32 takes 16"
    )
    typed = tf.make_tensor_proto([1.0, 2.0, 3.0, 4.0], dtype=tf.float32, shape=[2, 2])
    typed.ClearField("tensor_content")
    typed.float_val[:] = [1.0, 2.0, 3.0]
    assert _refusal(typed, spec) == "Input 'x' has 3 values in float_val; shape [2, 2] takes 4"
    # An answer's output is read by the same check, named as an output.
    with pytest.raises(RequestError, match=r"^Output 'out' has 3 values in float_val;"):
        tensors.to_array(typed, "out")
    with pytest.raises(RequestError, match=r"^Output 'tensor' has 12 bytes of tensor_content;"):
        tensors.to_array(content)


def test_an_empty_dimension_is_refused_and_a_dimension_of_one_is_taken():
    spec = tf.TensorSpec([None, None, 1], tf.float32)
    one = tensors.input_array(tensors.to_tensor_proto(np.ones((1, 1, 1), "float32")), spec, "x",
                              Budget(1))  # fmt: skip
    np.testing.assert_array_equal(one, np.ones((1, 1, 1), "float32"))
    for shape in ((0, 3, 1), (2, 0, 1)):
        assert _refusal(tensors.to_tensor_proto(np.zeros(shape, "float32")), spec) == (
            "Input 'x' has an empty dimension (empty batch or sequence)"
        )


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_float_that_is_not_finite_is_refused_as_over_rest(bad):
    array = np.array([[0.5, bad]], "float32")
    assert _refusal(tensors.to_tensor_proto(array), tf.TensorSpec([None, 2], tf.float32)) == (
        "Input 'x' contains NaN or Infinity"
    )
    # Integers are always finite: the largest int64 is a number like any other.
    big = np.array([[np.iinfo("int64").max, 0]], "int64")
    spec = tf.TensorSpec([None, 2], tf.int64)
    np.testing.assert_array_equal(
        tensors.input_array(tensors.to_tensor_proto(big), spec, "x", Budget(2)), big
    )
