"""Warmup requests: each export writes TensorFlow Serving's `tf_serving_warmup_requests`
(read here with TensorFlow Serving's own protos), and the local server replays them when it
loads a version; a warmup that fails keeps the version from being served."""

import logging
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from serving import warmup
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
    from serving.repository import Servable

    _, base = exported("antisymmetric")
    version_dir = os.path.join(base, "1")
    with caplog.at_level(logging.INFO, logger="serving.server"):
        servable = Servable(version_dir, 1)
    assert any(r.getMessage().startswith("Warmed up version 1 with 3 requests in ")
               for r in caplog.records)  # fmt: skip
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="serving.server"):
        Servable(version_dir, 1, warmup=False)
    assert not [r for r in caplog.records if "Warmed up" in r.getMessage()]
    count, seconds = warmup.replay(version_dir, servable.signatures)
    assert count == 3 and seconds >= 0


def test_a_version_whose_warmup_fails_is_not_served(tmp_path):
    from serving.repository import ModelRepository

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


def _no_warmup(path, version):
    from serving.repository import Servable

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
