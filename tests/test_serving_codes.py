"""Canonical codes (`serving.codes`): TensorFlow's error codes named as TensorFlow Serving
names them, and the line of a TensorFlow error that an answer carries."""

import pytest
import tensorflow as tf

from serving import codes

# Every failure code of TensorFlow's `tf.errors`, by the name TensorFlow gives its number.
NAMES = ["CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
         "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
         "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
         "UNAUTHENTICATED"]  # fmt: skip


class _Coded(Exception):
    """An error that carries `error_code` as TensorFlow's do."""

    def __init__(self, code):
        super().__init__("coded")
        self.error_code = code


@pytest.mark.parametrize("name", NAMES)
def test_each_tensorflow_error_code_is_named_as_tensorflow_names_it(name):
    assert codes.tensorflow_code(_Coded(getattr(tf.errors, name))) == name


def test_a_real_tensorflow_error_is_named_by_its_code_and_other_errors_by_none():
    assert codes.tensorflow_code(tf.errors.NotFoundError(None, None, "gone")) == "NOT_FOUND"
    assert codes.tensorflow_code(tf.errors.DeadlineExceededError(None, None, "late")) == (
        "DEADLINE_EXCEEDED"
    )
    # OK is no failure; numbers past TensorFlow's codes and non-numbers are not codes.
    for code in (tf.errors.OK, len(NAMES) + 1, -1, "3", None):
        assert codes.tensorflow_code(_Coded(code)) is None, code
    assert codes.tensorflow_code(ValueError("plain")) is None


class _Messaged(Exception):
    """An error whose `message` differs from its `str`, as TensorFlow's `OpError`."""

    def __init__(self, message, text="the str of the error"):
        super().__init__(text)
        self.message = message


@pytest.mark.parametrize(
    "error, line",
    [
        (ValueError("Graph execution error:\n\nDetected at node 'x'\n  assertion failed: "
                    "[length out of range] [Condition x > 0 did not hold]\n"),
         "assertion failed: [length out of range] [Condition x > 0 did not hold]"),
        (ValueError("first line\nAssertion Failed: the second"), "Assertion Failed: the second"),
        (ValueError("Graph execution error:\nInput 'x' expects dtype DT_FLOAT\nlater"),
         "Input 'x' expects dtype DT_FLOAT"),
        (ValueError("while reading the request\nInput 'x' has an empty dimension"),
         "Input 'x' has an empty dimension"),
        (ValueError("Graph execution error:\n\n  Detected at node y\n  the cause  \nlater"),
         "the cause"),
        (ValueError("Graph execution error:\nDetected unsupported operations: a"),
         "Graph execution error:"),
        (_Messaged("from the message\nsecond"), "from the message"),
        (_Messaged(""), "the str of the error"),
        (ValueError(""), "ValueError"),
        (ValueError("  \n\n"), "ValueError"),
        (ValueError("assertion failed: " + "a" * 600), ("assertion failed: " + "a" * 600)[:500]),
        (ValueError("b" * 600), "b" * 500),
    ],
)  # fmt: skip
def test_an_error_s_text_is_its_line_that_says_what_is_wrong(error, line):
    assert codes.error_text(error) == line


def test_a_failed_assertion_in_a_graph_answers_with_its_own_line():
    @tf.function
    def positive(x):
        tf.debugging.assert_positive(x, message="lengths must be positive")
        return x

    with pytest.raises(tf.errors.InvalidArgumentError) as failed:
        positive(tf.constant([1.0, -1.0]))
    line = codes.error_text(failed.value)
    assert line.startswith("assertion failed: [lengths must be positive"), line
    assert "Condition x > 0 did not hold" in line and "\n" not in line, line
    assert codes.tensorflow_code(failed.value) == "INVALID_ARGUMENT"
