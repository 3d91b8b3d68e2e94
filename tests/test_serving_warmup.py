"""Warmup requests: each export writes TensorFlow Serving's `tf_serving_warmup_requests`
(read here with TensorFlow Serving's own protos), and the local server replays them when it
loads a version; a warmup that fails keeps the version from being served."""

import logging
import os
import shutil
import time

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from serving.exports import warmup
from serving.names import LENGTH_INPUT, PADDED_SIGNATURE, SEQUENCE_INPUT, STREAM_SIGNATURE
from tests.serving_helpers import exported


def _records(version_dir):
    path = os.path.join(version_dir, warmup.WARMUP_FILE)
    return [
        prediction_log_pb2.PredictionLog.FromString(record)
        for record in tf.data.TFRecordDataset(path).as_numpy_iterator()
    ]


def test_an_export_carries_one_predict_request_per_signature_that_the_signature_takes():
    _, base = exported("antisymmetric")
    version_dir = os.path.join(base, "1")
    loaded = tf.saved_model.load(version_dir)
    logs = _records(version_dir)
    assert [log.WhichOneof("log_type") for log in logs] == ["predict_log"] * len(logs)
    requests = {log.predict_log.request.model_spec.signature_name: log.predict_log.request
                for log in logs}  # fmt: skip
    assert set(requests) == set(loaded.signatures) == {
        "serving_default", STREAM_SIGNATURE, PADDED_SIGNATURE
    }  # fmt: skip
    for name, request in requests.items():
        function = loaded.signatures[name]
        specs = function.structured_input_signature[1]
        arrays = {key: tf.make_ndarray(proto) for key, proto in request.inputs.items()}
        assert set(arrays) == set(specs), name
        for key, array in arrays.items():
            assert array.shape[0] == 1, (name, key)
            assert specs[key].is_compatible_with(tf.constant(array)), (name, key)
        function(**{key: tf.constant(value) for key, value in arrays.items()})  # it runs
    padded = {key: tf.make_ndarray(p) for key, p in requests[PADDED_SIGNATURE].inputs.items()}
    assert padded[LENGTH_INPUT].tolist() == [padded[SEQUENCE_INPUT].shape[1]]  # every step


def test_the_server_replays_the_warmup_before_serving_and_can_skip_it(caplog):
    from serving.local.servable import Servable

    _, base = exported("antisymmetric")
    version_dir = os.path.join(base, "1")
    with caplog.at_level(logging.INFO, logger="serving"):
        servable = Servable(version_dir, 1)
    assert any(r.getMessage().startswith("Warmed up version 1 with 3 requests in ")
               for r in caplog.records)  # fmt: skip
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="serving"):
        Servable(version_dir, 1, warmup=False)
    assert not [r for r in caplog.records if "Warmed up" in r.getMessage()]
    started = time.monotonic()
    count, seconds = warmup.replay(version_dir, servable.signatures)
    # The seconds the replay took: no more than the call's own.
    assert count == 3 and 0 <= seconds <= time.monotonic() - started


def test_a_version_whose_warmup_fails_is_not_served(tmp_path):
    from serving.local.repository import ModelRepository

    _, base = exported("antisymmetric")
    broken = tmp_path / "models"
    shutil.copytree(base, broken)
    version_dir = str(broken / "1")
    logs = _records(version_dir)
    request = logs[0].predict_log.request
    request.inputs[SEQUENCE_INPUT].CopyFrom(tf.make_tensor_proto(np.zeros((1, 3), "float32")))
    with tf.io.TFRecordWriter(os.path.join(version_dir, warmup.WARMUP_FILE)) as records:
        for log in logs:
            records.write(log.SerializeToString())
    repository = ModelRepository(str(broken), "m")
    repository.refresh()
    (status,) = repository.status("m")["model_version_status"]
    assert status["state"] != "AVAILABLE"
    assert status["status"]["error_code"] in ("INVALID_ARGUMENT", "UNKNOWN")
    skipping = ModelRepository(str(broken), "m", loader=_no_warmup)
    skipping.refresh()
    (status,) = skipping.status("m")["model_version_status"]
    assert status["state"] == "AVAILABLE"


def _rewritten(base, tmp_path, change):
    """A copy of the export at `base` whose version 1 warmup records went through
    `change(records)`; the copy's base path."""
    copy = tmp_path / "models"
    shutil.copytree(base, copy)
    version_dir = str(copy / "1")
    logs = change(_records(version_dir))
    with tf.io.TFRecordWriter(os.path.join(version_dir, warmup.WARMUP_FILE)) as records:
        for log in logs:
            records.write(log.SerializeToString())
    return str(copy)


def test_a_warmup_refused_inside_the_graph_reports_the_assertion_s_line(tmp_path, caplog):
    """The `padded` request's length beyond its 12 steps fails the graph's own assertion:
    the status and the log give that line, with the request and signature, not
    TensorFlow's "Graph execution error:" heading."""
    from serving.local.repository import ModelRepository

    def too_long(logs):
        for log in logs:
            request = log.predict_log.request
            if request.model_spec.signature_name == PADDED_SIGNATURE:
                steps = tf.make_ndarray(request.inputs[SEQUENCE_INPUT]).shape[1]
                request.inputs[LENGTH_INPUT].CopyFrom(
                    tf.make_tensor_proto(np.array([steps + 5], "int32"))
                )
        return logs

    _, base = exported("antisymmetric")
    repository = ModelRepository(_rewritten(base, tmp_path, too_long), "m")
    with caplog.at_level(logging.ERROR, logger="serving"):
        repository.refresh()
    (status,) = repository.status("m")["model_version_status"]
    code, message = status["status"]["error_code"], status["status"]["error_message"]
    assert (status["state"], code) == ("END", "INVALID_ARGUMENT")
    index = [log.predict_log.request.model_spec.signature_name
             for log in _records(os.path.join(base, "1"))].index(PADDED_SIGNATURE)  # fmt: skip
    assert message.startswith(f"warmup request {index} (signature 'padded') failed: ")
    assert "assertion failed" in message.lower() and "length" in message, message
    assert "\n" not in message and "Graph execution error" not in message
    (line,) = [r.getMessage() for r in caplog.records if "Could not load" in r.getMessage()]
    assert line.endswith(message), line


def test_a_warmup_file_of_more_than_1000_records_fails_the_load(tmp_path):
    """TensorFlow Serving replays at most 1,000 records: one more fails the load with its
    message, before any is replayed; 1,000 load."""
    from serving.local.repository import ModelRepository

    _, base = exported("antisymmetric")
    for count, state in ((1001, "END"), (1000, "AVAILABLE")):
        folder = tmp_path / str(count)
        folder.mkdir()
        repository = ModelRepository(
            _rewritten(base, folder, lambda logs, n=count: (logs * n)[:n]), "m"
        )
        repository.refresh()
        (status,) = repository.status("m")["model_version_status"]
        assert status["state"] == state, status
    assert status["status"]["error_code"] == "OK"
    repository = ModelRepository(str(tmp_path / "1001" / "models"), "m")
    repository.refresh()
    (status,) = repository.status("m")["model_version_status"]
    assert status["status"]["error_code"] == "INVALID_ARGUMENT"
    assert status["status"]["error_message"].startswith(
        "Number of warmup records exceeds the maximum (1,000) at "
    )


def _no_warmup(path, version):
    from serving.local.servable import Servable

    return Servable(path, version, warmup=False)


def test_a_record_that_is_no_predict_request_or_names_no_signature_is_refused(tmp_path):
    version_dir = str(tmp_path)
    path = os.path.join(version_dir, warmup.WARMUP_FILE)
    os.makedirs(os.path.dirname(path))
    with tf.io.TFRecordWriter(path) as records:
        records.write(prediction_log_pb2.PredictionLog(
            classify_log=prediction_log_pb2.ClassifyLog()).SerializeToString())  # fmt: skip
    with pytest.raises(ValueError, match="warmup record 0 of .* is not a predict request"):
        warmup.read(version_dir)
    assert warmup.read(str(tmp_path / "none")) == []
    log = prediction_log_pb2.PredictionLog()
    log.predict_log.request.model_spec.signature_name = "absent"
    with tf.io.TFRecordWriter(path) as records:
        records.write(log.SerializeToString())
    with pytest.raises(ValueError, match="names signature 'absent', which is absent"):
        warmup.replay(version_dir, {"serving_default": None})


class _Signature:
    """A stand-in concrete function: only its input specs, as `structured_input_signature`."""

    def __init__(self, **specs):
        self.structured_input_signature = ((), specs)


@pytest.mark.parametrize(
    "specs, shapes, length",
    [
        # A fixed number of steps is kept; an unknown one is a single step.
        ({"sequence": ([None, 784, 1], "float32")}, {"sequence": (1, 784, 1)}, 784),
        ({"sequence": ([None, None, 3], "float32"), "h": ([None, 8], "float32")},
         {"sequence": (1, 1, 3), "h": (1, 8)}, 1),
        # No sequence among the inputs: each is one step.
        ({"x": ([None, 4], "float64")}, {"x": (1, 4)}, 1),
    ],
)  # fmt: skip
def test_representative_inputs_are_zeros_of_one_example_with_every_step_valid(
    specs, shapes, length
):
    tensor_specs = {name: tf.TensorSpec(shape, dtype) for name, (shape, dtype) in specs.items()}
    plain = warmup.representative_inputs(_Signature(**tensor_specs))
    assert {name: array.shape for name, array in plain.items()} == shapes
    assert all(not array.any() for array in plain.values())
    assert {name: array.dtype.name for name, array in plain.items()} == {
        name: dtype for name, (_, dtype) in specs.items()
    }
    with_length = warmup.representative_inputs(
        _Signature(**tensor_specs, **{LENGTH_INPUT: tf.TensorSpec([None], tf.int64)})
    )
    assert with_length[LENGTH_INPUT].tolist() == [length]
    assert with_length[LENGTH_INPUT].dtype == np.int64
