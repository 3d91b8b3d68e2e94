"""`serving.local.payload` on its own: TensorFlow Serving's request checks and messages, byte
limits, metadata and prediction layouts, against hand-written requests."""

import json

import numpy as np
import pytest
import tensorflow as tf

from serving.local import payload
from serving.local.payload import RequestError


class FakeServable:
    """A servable of one signature whose function is `fn` (None: never called)."""

    version, max_rank = 3, 3
    signature_def = {"signature_def": {"serving_default": {"inputs": {}}}}

    def __init__(self, specs, fn=None):
        self.specs, self.signatures = specs, {"serving_default": fn}

    def input_specs(self, signature_name):
        return self.specs


SEQUENCE = tf.TensorSpec([None, 3, 1], tf.float32, name="x")
ONE = FakeServable({"x": SEQUENCE})
TWO = FakeServable({"a": tf.TensorSpec([None, 2], tf.float32),
                    "b": tf.TensorSpec([None], tf.int32)})  # fmt: skip


def _parse(body, servable, max_elements=payload.DEFAULT_MAX_INPUT_ELEMENTS):
    """A REST body as the server reads it: decoded, then its inputs checked."""
    signature, sent, rows = payload.parse_predict_request(body, servable, max_elements)
    arrays = payload.checked_inputs(servable, signature, sent, payload.as_input_array,
                                    max_elements)  # fmt: skip
    return signature, arrays, rows


def _predict(servable, signature, arrays, rows):
    """What a request's checked inputs are answered with over REST."""
    return payload.predict_body(payload.run_signature(servable, signature, arrays), signature,
                                rows)  # fmt: skip


def _error(body, servable=ONE, max_elements=payload.DEFAULT_MAX_INPUT_ELEMENTS):
    text = body if isinstance(body, str) else json.dumps(body)
    with pytest.raises(RequestError) as raised:
        _parse(text.encode(), servable, max_elements)
    assert raised.value.status == 400
    return raised.value.message


@pytest.mark.parametrize(
    "leaf, kind",
    [
        ("1", "string"),
        (True, "boolean"),
        (None, "null"),
        ({"v": 1}, "dict"),
        ([0.5], "list (ragged nesting)"),
    ],
)
def test_a_leaf_that_is_no_number_is_named_by_its_json_kind(leaf, kind):
    message = _error({"instances": [[[0.5], [leaf], [0.5]]]})
    assert message == f"Input 'x' expects numbers of type float32, got a {kind}"


def test_a_float_where_an_int_goes_is_refused():
    message = _error({"inputs": {"a": [[1.0, 2.0]], "b": [1.5]}}, TWO)
    assert message == "Input 'b' expects numbers of type int32, got a float"


def test_inputs_that_are_not_the_signatures_are_listed_as_tensorflow_serving_does():
    message = _error({"inputs": {"a": [[1.0, 2.0]], "c": [1], "d": [2]}}, TWO)
    assert message == (
        "input size does not match signature: 3!=2 len({a,c,d}) != len({a,b}). "
        "Sent extra: {c,d}. Missing but required: {b}."
    )
    message = _error({"inputs": {"c": [1]}}, TWO)
    assert message == (
        "input size does not match signature: 1!=2 len({c}) != len({a,b}). "
        "Sent extra: {c}. Missing but required: {a,b}."
    )


@pytest.mark.parametrize(
    "body, message, servable",
    [
        ([1, 2], "JSON Value is not an object", ONE),
        ({"instances": {"x": 1}}, "'instances' must be a JSON list", ONE),
        ({"instances": []}, "'instances' is an empty list (empty batch)", ONE),
        ({"x": 1}, "Missing 'inputs' or 'instances' key", ONE),
        ({"instances": [[[1], [2], [3]]], "inputs": [[[1], [2], [3]]]},
         "Request must contain either 'instances' or 'inputs', not both", ONE),
        ({"signature_name": 7, "inputs": []}, "'signature_name' must be a string", ONE),
        ({"instances": [[[1], [2]]]}, "Input 'x' expects shape [-1, 3, 1], got [1, 2, 1]", ONE),
        ({"instances": [[[1], [2], [3]], [[1], [2]]]},
         "Input 'x' is not a rectangular array of shape [2, 3, 1]", ONE),
        ({"instances": [[1, 2, 3]]}, "Input 'x' expects a rank-3 nested list, got rank 2", ONE),
        ({"instances": [[[[1]], [2], [3]]]},
         "Input 'x' expects a rank-3 nested list, got a deeper one", ONE),
        ({"instances": [[]]}, "Input 'x' has an empty dimension (empty batch or sequence)", ONE),
        ({"instances": [{"a": [1.0, 2.0], "c": 1}, {"c": 2, "a": [1.0, 2.0]}]},
         "input size does not match signature: 2!=2 len({a,c}) != len({a,b}). "
         "Sent extra: {c}. Missing but required: {b}.", TWO),
        ({"instances": [{"a": [1.0, 2.0]}]}, "input size does not match signature: 1!=2 "
         "len({a}) != len({a,b}). Sent extra: {}. Missing but required: {b}.", TWO),
        ({"inputs": {"a": [[1.0, 2.0]], "b": [1, 2]}}, "Inputs have different batch sizes", TWO),
    ],
)  # fmt: skip
def test_malformed_requests_get_tensorflow_servings_messages(body, message, servable):
    assert _error(body, servable) == message


def test_the_body_limit_counts_json_values_up_to_its_exact_bound():
    # (max_rank + 2) * max_elements + 1024 values: (3 + 2) * 10 + 1024 = 1074.
    def body(tokens):  # "[" and "," are what the byte count sees
        return '{"inputs": [' + "0," * (tokens - 2) + "0]}"

    assert body(1074).count(",") + body(1074).count("[") + body(1074).count("{") == 1074
    with pytest.raises(RequestError) as raised:
        payload.check_body_size(body(1075).encode(), 10, 3)
    assert "about 1075 JSON values" in raised.value.message
    payload.check_body_size(body(1074).encode(), 10, 3)  # at the bound: parsed


def test_huge_floats_are_refused_as_out_of_range():
    message = _error({"instances": [[[1e300], [0.0], [0.0]]]})
    assert message == "Input 'x' contains NaN, Infinity or values out of float32 range"


def test_metadata_has_tensorflow_servings_layout():
    assert payload.model_metadata(ONE, "antisym") == {
        "model_spec": {"name": "antisym", "signature_name": "", "version": "3"},
        "metadata": {"signature_def": ONE.signature_def},
    }


def test_a_signatures_error_is_a_400_with_its_first_line():
    def refuse(**inputs):
        raise tf.errors.InvalidArgumentError(None, None, "length must be at least 1\ndetails")

    servable = FakeServable({"x": SEQUENCE}, refuse)
    with pytest.raises(RequestError) as raised:
        _predict(servable, "serving_default", {"x": np.zeros((1, 3, 1), "float32")}, True)
    assert (raised.value.status, raised.value.message) == (400, "length must be at least 1")


def test_outputs_come_in_the_row_or_the_columnar_layout():
    def answer(x):
        total = tf.reduce_sum(x, axis=[1, 2])
        return {"sum": total, "twice": 2 * total}

    servable = FakeServable({"x": SEQUENCE}, answer)
    x = np.arange(6, dtype="float32").reshape(2, 3, 1)
    rows = _predict(servable, "serving_default", {"x": x}, True)
    assert rows == {"predictions": [{"sum": 3.0, "twice": 6.0}, {"sum": 12.0, "twice": 24.0}]}
    columns = _predict(servable, "serving_default", {"x": x}, False)
    assert columns == {"outputs": {"sum": [3.0, 12.0], "twice": [6.0, 24.0]}}
    single = FakeServable({"x": SEQUENCE}, lambda x: {"sum": tf.reduce_sum(x, axis=[1, 2])})
    assert _predict(single, "serving_default", {"x": x}, True) == {
        "predictions": [3.0, 12.0]
    }
    assert _predict(single, "serving_default", {"x": x}, False) == {"outputs": [3.0, 12.0]}


def test_a_rest_error_is_an_exception_with_its_message_and_status():
    error = RequestError(404, "not here")
    assert (str(error), error.message, error.status) == ("not here", "not here", 404)


def test_a_message_past_the_cap_is_cut_to_it_and_ends_with_an_ellipsis():
    limit = payload.MAX_MESSAGE_CHARS
    fits = RequestError(400, "m" * limit)
    assert fits.message == "m" * limit  # at the cap: whole
    cut = RequestError(400, "a" * (limit - 3) + "bcdefg")
    assert cut.message == "a" * (limit - 3) + "..."
    assert str(cut) == cut.message and len(cut.message) == limit


@pytest.mark.parametrize(
    "instances, servable, message",
    [
        ([{"a": [1.0, 2.0], "b": 1}, {"a": [1.0, 2.0]}], TWO,
         "Every instance must have exactly the keys ['a', 'b']"),
        ([[1.0, 2.0]], TWO,
         "Instances must be objects with keys ['a', 'b'] (or all plain values for one input)"),
        ([[[0.5]], {"x": [[0.5]]}], ONE,
         "Instances must be objects with keys ['x'] (or all plain values for one input)"),
    ],
)  # fmt: skip
def test_row_instances_are_all_objects_or_all_plain_values_of_one_input(
    instances, servable, message
):
    assert _error({"instances": instances}, servable) == message


@pytest.mark.parametrize(
    "instances",
    [
        [{"a": [1.0, 2.0], "b": 1}],
        [{"a": [1.0, 2.0], "b": 1}, {"b": 2, "a": [3.0, 4.0]}],
    ],
)
def test_row_instances_as_objects_become_one_column_per_input(instances):
    signature, arrays, rows = _parse(json.dumps({"instances": instances}).encode(), TWO)
    assert (signature, rows, sorted(arrays)) == ("serving_default", True, ["a", "b"])
    assert arrays["a"].dtype == np.float32 and arrays["b"].dtype == np.int32
    np.testing.assert_array_equal(arrays["a"], [row["a"] for row in instances])
    np.testing.assert_array_equal(arrays["b"], [row["b"] for row in instances])


def _as_array(value, spec, budget=None):
    try:
        return payload.as_input_array(value, spec, "x", budget or payload.Budget(100))
    except RequestError as error:
        assert error.status == 400
        return error.message


@pytest.mark.parametrize(
    "value, spec, message",
    [
        ([1.0], tf.TensorSpec(None, tf.float32), "Input 'x' has an unsupported dtype or unknown "
         "rank: TensorSpec(shape=<unknown>, dtype=tf.float32, name=None)"),
        (["a"], tf.TensorSpec([None], tf.string), "Input 'x' has an unsupported dtype or unknown "
         "rank: TensorSpec(shape=(None,), dtype=tf.string, name=None)"),
        ([2**31], tf.TensorSpec([None], tf.int32), "Input 'x' has values out of int32 range"),
        ([10**400], tf.TensorSpec([None], tf.int32), "Input 'x' has values out of int32 range"),
        ([10**400], tf.TensorSpec([None], tf.float32),
         "Input 'x' has values out of float32 range"),
    ],
)  # fmt: skip
def test_an_input_outside_its_dtype_is_a_400_naming_it(value, spec, message):
    assert _as_array(value, spec) == message


def test_integers_are_read_exactly_and_a_float_overflow_is_refused_without_a_warning():
    import warnings

    exact = _as_array([9007199254740993, -(2**63)], tf.TensorSpec([None], tf.int64))
    assert exact.dtype == np.int64 and exact.tolist() == [9007199254740993, -(2**63)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float64 to float32 overflows quietly, then is refused
        assert _as_array([1e39], tf.TensorSpec([None], tf.float32)) == (
            "Input 'x' contains NaN, Infinity or values out of float32 range"
        )


def test_the_request_s_number_budget_is_shared_by_its_inputs():
    budget = payload.Budget(10)
    spec = tf.TensorSpec([None, 3], tf.float32)
    assert _as_array([[1, 2, 3], [4, 5, 6]], spec, budget).shape == (2, 3)
    assert budget.used == 6
    assert _as_array([[1, 2, 3]], spec, budget).shape == (1, 3)
    assert budget.used == 9
    # The message names the limit, not what was left of it.
    assert _as_array([[1, 2, 3]], spec, budget) == (
        "Request has more than 10 input numbers (--max-input-elements); input 'x' has 3, "
        "after 9 in the inputs before it"
    )
    assert _as_array([7.0], tf.TensorSpec([None], tf.float32), budget).tolist() == [7.0]
    assert budget.used == 10  # exactly the limit is allowed
    assert _as_array([[1, 2, 3]] * 4, spec, payload.Budget(10)) == (
        "Request has more than 10 input numbers (--max-input-elements); input 'x' alone has 12"
    )


@pytest.mark.parametrize(
    "body, message",
    [
        (b'{"a": NaN}', "NaN is not a valid JSON number"),
        (b"[-Infinity]", "-Infinity is not a valid JSON number"),
        (b"[" * 100_000, "nesting too deep"),
        (b"{", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        # JSON between systems is UTF-8: json.loads alone would accept UTF-16.
        ("[1]".encode("utf-16"),
         "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
    ],
)  # fmt: skip
def test_a_body_that_is_not_json_is_tensorflow_serving_s_parse_error(body, message):
    with pytest.raises(RequestError) as caught:
        payload.decode_json(body)
    assert (caught.value.status, caught.value.message) == (400, f"JSON Parse error: {message}")


def test_json_is_decoded_from_bytes_or_text():
    assert payload.decode_json(b'{"a": [1.5]}') == payload.decode_json('{"a": [1.5]}') == {
        "a": [1.5]
    }  # fmt: skip
    assert payload.decode_json(bytearray(b"[2]")) == [2]


def test_a_single_unnamed_tensor_needs_a_signature_of_one_input():
    assert _error({"inputs": [[1.0, 2.0]]}, TWO) == (
        "Expected inputs ['a', 'b'], got a single unnamed tensor"
    )


PADDED = FakeServable({"sequence": tf.TensorSpec([None, 4, 1], tf.float32, name="sequence"),
                       "length": tf.TensorSpec([None], tf.int32, name="length")})  # fmt: skip


def _padded(lengths, signature="padded"):
    """The `padded` signature's inputs for `len(lengths)` rows of 4 steps, checked."""
    sequence = np.zeros((len(lengths), 4, 1)).tolist()
    sent = {"sequence": sequence, "length": list(lengths)}
    return payload.checked_inputs(PADDED, signature, sent)


@pytest.mark.parametrize("lengths, row, value", [
    ([0], 0, 0), ([5], 0, 5), ([2, 0, 7], 1, 0), ([4, 4, -1], 2, -1),
])  # fmt: skip
def test_a_padded_length_outside_one_to_the_steps_names_its_first_row(lengths, row, value):
    with pytest.raises(RequestError) as raised:
        _padded(lengths)
    assert (raised.value.status, raised.value.message) == (
        400,
        f"Input 'length' of row {row} is {value}; each row's length must be in 1..4 (the "
        "steps of input 'sequence')",
    )


def test_padded_lengths_from_one_to_the_steps_pass_and_other_signatures_skip_them():
    arrays = _padded([1, 4, 2])
    assert arrays["length"].tolist() == [1, 4, 2] and arrays["sequence"].shape == (3, 4, 1)
    # The check belongs to the `padded` signature: another one's `length` is not a length.
    assert _padded([0, 9], signature="other")["length"].tolist() == [0, 9]
    # Either input alone: nothing to check against.
    assert payload.check_lengths({"length": np.array([9])}) is None
    assert payload.check_lengths({"sequence": np.zeros((2, 4, 1))}) is None


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("rows", [True, False])
def test_an_output_json_cannot_carry_is_a_400_naming_it_and_its_row(bad, rows):
    outputs = {"ok": np.zeros((3, 2), "float32"),
               "state": np.array([[0.0, 1.0], [2.0, 3.0], [4.0, bad]], "float32")}  # fmt: skip
    with pytest.raises(RequestError) as raised:
        payload.predict_body(outputs, "stream", rows)
    assert (raised.value.status, raised.value.message) == (
        400,
        "Output 'state' of signature 'stream' holds NaN or Infinity (row 2), which JSON "
        "cannot carry: the inputs (a state, say) drive the model out of float32 range",
    )
    # Integer outputs and finite floats are answered.
    counts = {"count": np.array([1, 2, 3], "int64")}
    assert payload.predict_body(counts, "stream", rows) == (
        {"predictions": [1, 2, 3]} if rows else {"outputs": [1, 2, 3]}
    )


def test_a_scalar_output_that_is_not_finite_is_row_zero():
    with pytest.raises(RequestError, match=r"holds NaN or Infinity \(row 0\)"):
        payload.predict_body({"loss": np.array(np.nan, "float32")}, "serving_default", False)


def test_a_single_input_may_be_sent_bare_or_named_and_is_read_as_the_same_input():
    steps = [[[0.5], [0.25], [-1.0]]]
    bare = _parse(json.dumps({"inputs": steps}).encode(), ONE)
    named = _parse(json.dumps({"inputs": {"x": steps}}).encode(), ONE)
    for signature, arrays, rows in (bare, named):
        assert (signature, sorted(arrays), rows) == ("serving_default", ["x"], False)
        np.testing.assert_array_equal(arrays["x"], np.array(steps, "float32"))
