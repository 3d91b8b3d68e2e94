"""The container files: parsed with TensorFlow Serving's own protos, consistent with the export
and with what the REST clients send (no Docker engine here to run them)."""

import os
import re
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    text_format,
    wrappers_pb2,
)

from serving.names import SEQUENCE_INPUT

ROOT = Path(__file__).resolve().parents[1]
SERVING = ROOT / "serving"


def _read(name):
    return (SERVING / name).read_text()


def _model_server_config():
    """`ModelServerConfig` from tensorflow-serving-api (the `--model_config_file` proto)."""
    from tensorflow_serving.config import model_server_config_pb2

    return model_server_config_pb2.ModelServerConfig()


def _upstream_messages():
    """`BatchingParameters` and `MonitoringConfig` as TensorFlow Serving declares them.

    The tensorflow-serving-api wheel ships `apis/` and `config/model_server_config` but
    neither `servables/tensorflow/session_bundle_config.proto` (BatchingParameters, read
    by `--batching_parameters_file`) nor `config/monitoring_config.proto` (read by
    `--monitoring_config_file`). Their messages are rebuilt here field for field (names,
    numbers, types) from those upstream files, so `text_format` rejects what the server's
    own parser rejects: an unknown field, a wrong type, a missing `{ value: ... }` wrapper.
    """
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    proto = descriptor_pb2.FileDescriptorProto(
        name="tensorflow_serving_subset.proto",
        package="tensorflow.serving",
        syntax="proto3",
        dependency=["google/protobuf/wrappers.proto"],
    )
    field = descriptor_pb2.FieldDescriptorProto
    optional, repeated = field.LABEL_OPTIONAL, field.LABEL_REPEATED

    def message(name, fields):
        added = proto.message_type.add(name=name)
        for number, (field_name, kind, label, type_name) in enumerate(fields, 1):
            if field_name is None:
                continue
            added.field.add(
                name=field_name, number=number, type=kind, label=label, type_name=type_name
            )

    int64_value = (field.TYPE_MESSAGE, optional, ".google.protobuf.Int64Value")
    message(
        "BatchingParameters",
        [
            ("max_batch_size", *int64_value),
            ("batch_timeout_micros", *int64_value),
            ("max_enqueued_batches", *int64_value),
            ("num_batch_threads", *int64_value),
            ("thread_pool_name", field.TYPE_MESSAGE, optional, ".google.protobuf.StringValue"),
            ("allowed_batch_sizes", field.TYPE_INT64, repeated, None),
            ("pad_variable_length_inputs", field.TYPE_BOOL, optional, None),
        ],
    )
    message(
        "PrometheusConfig",
        [("enable", field.TYPE_BOOL, optional, None), ("path", field.TYPE_STRING, optional, None)],
    )
    message(
        "MonitoringConfig",
        [
            (
                "prometheus_config",
                field.TYPE_MESSAGE,
                optional,
                ".tensorflow.serving.PrometheusConfig",
            )
        ],
    )
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"tensorflow.serving.{name}")
        )
        for name in ("BatchingParameters", "MonitoringConfig")
    }


def _parse(name, text=None):
    """`serving/NAME` (or `text` in its place) parsed as the proto the server reads it as."""
    if name == "models.config":
        message = _model_server_config()
    else:
        kind = {"batching.config": "BatchingParameters", "monitoring.config": "MonitoringConfig"}
        message = _upstream_messages()[kind[name]]()
    return text_format.Parse(_read(name) if text is None else text, message)


def _entrypoint_flags():
    text = _read("Dockerfile")
    return dict(re.findall(r'"--(\w+)=([^"]*)"', text))


def test_dockerfile_has_one_pinned_tf_serving_base_and_reads_every_config():
    lines = _read("Dockerfile").splitlines()
    bases = [line for line in lines if line.startswith("FROM")]
    assert len(bases) == 1, bases
    assert re.fullmatch(r"FROM tensorflow/serving:\d+\.\d+\.\d+(-gpu)?", bases[0]), bases[0]
    copied = re.search(r"^COPY (.+) /config/$", "\n".join(lines), re.M).group(1).split()
    flags = _entrypoint_flags()
    read = {
        flags["model_config_file"],
        flags["batching_parameters_file"],
        flags["monitoring_config_file"],
    }
    assert read == {f"/config/{name}" for name in copied}
    assert flags["enable_batching"] == "true"
    for name in copied:
        _parse(name)  # each file the server reads parses as its proto


def test_model_config_serves_the_compose_volume_by_the_readme_name():
    (config,) = _parse("models.config").model_config_list.config
    assert config.model_platform == "tensorflow"
    assert config.model_version_policy.WhichOneof("policy_choice") == "latest"
    assert config.model_version_policy.latest.num_versions == 1
    compose = (ROOT / "docker-compose.yml").read_text()
    mounts = re.findall(r"-\s*\./models/(\w+):(\S+?)(?::ro)?\s*$", compose, re.M)
    assert [target for _, target in mounts] == [config.base_path]
    assert re.search(r'"8501:8501"', compose) and re.search(r'"8500:8500"', compose)
    # Every curl URL of the docs names the container's model, or a local server's
    # `--model-name` started in the same document.
    named = set()
    for doc in (ROOT / "README.md", ROOT / "docs" / "serving.md"):
        text = doc.read_text()
        urls = set(re.findall(r"http://[\w.]+:8501/v1/models/([\w-]+)", text))
        local = set(re.findall(r"--model-name (\w+)", text))
        assert urls <= {config.name} | local, (doc.name, urls)
        named |= urls
    assert config.name in named  # the container's model is queried somewhere in the docs
    docs = (ROOT / "docs" / "serving.md").read_text()
    assert config.name in re.findall(r"http://localhost:8501/v1/models/([\w-]+)", docs)


def test_batching_parameters_are_valid_for_the_batcher():
    batching = _parse("batching.config")
    for name in ("max_batch_size", "batch_timeout_micros", "num_batch_threads"):
        assert batching.HasField(name), name
    allowed = list(batching.allowed_batch_sizes)
    # BatchingSession's requirements: increasing, and the last equals max_batch_size.
    assert allowed == sorted(set(allowed)) and allowed[-1] == batching.max_batch_size.value
    assert batching.num_batch_threads.value >= 1
    assert not batching.pad_variable_length_inputs


def test_monitoring_exposes_prometheus_on_the_documented_path():
    monitoring = _parse("monitoring.config")
    assert monitoring.prometheus_config.enable
    docs = (ROOT / "docs" / "serving.md").read_text()
    assert f"8501{monitoring.prometheus_config.path}" in docs


@pytest.mark.parametrize(
    "name, good, typo",
    [
        ("models.config", 'model_platform: "tensorflow"', 'model_platfrom: "tensorflow"'),
        ("batching.config", "max_batch_size { value: 64 }", "max_batch_size: 64"),
        ("batching.config", "allowed_batch_sizes: 1\n", "allowed_batch_sizes: one\n"),
        ("monitoring.config", "enable: true", "enabled: true"),
    ],
)
def test_a_typo_the_server_would_reject_fails(name, good, typo):
    text = _read(name)
    assert good in text
    with pytest.raises(text_format.ParseError):
        _parse(name, text.replace(good, typo, 1))


def test_clients_send_the_exported_signature_and_input_names():
    """What `serving.client` and the documented curl bodies send, fed to the real export."""
    import json

    import tensorflow as tf

    from serving.client import ServingClient
    from tests.serving_helpers import STEPS, digits, exported

    model, base = exported("antisymmetric")
    loaded = tf.saved_model.load(os.path.join(base, "1"))
    # TF Serving picks this signature when a request names none (serving.client's default).
    assert tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY in loaded.signatures
    signature = loaded.signatures[tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY]
    (input_name,) = signature.structured_input_signature[1]
    assert input_name == SEQUENCE_INPUT

    sent = []

    class Recording(ServingClient):
        def request(self, method, url, body=None):
            sent.append((method, url, json.loads(json.dumps(body))))
            return {}

    (config,) = _parse("models.config").model_config_list.config
    client = Recording("http://127.0.0.1:8501", config.name)
    x = digits()[0][:3]
    client.predict(inputs={input_name: x.tolist()})
    client.predict(instances=x.tolist())
    (_, url_columnar, columnar), (_, url_rows, rows) = sent
    assert url_columnar == url_rows == f"http://127.0.0.1:8501/v1/models/{config.name}:predict"
    assert "signature_name" not in columnar and "signature_name" not in rows
    # Columnar: the input is named; rows: one instance per example, one input.
    answer = signature(**{k: tf.constant(v, tf.float32) for k, v in columnar["inputs"].items()})
    stacked = signature(**{input_name: tf.constant(rows["instances"], tf.float32)})
    expected = model.predict(x, verbose=0)
    np.testing.assert_allclose(answer["logits"].numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stacked["logits"].numpy(), expected, rtol=1e-5, atol=1e-5)
    # The documented columnar bodies name the same input; the row bodies send T steps.
    pages = ("serving.md", "streaming.md", "export.md", "devices.md")
    docs = "".join((ROOT / "docs" / page).read_text() for page in pages)
    docs += (ROOT / "README.md").read_text()
    assert set(re.findall(r'"inputs": \{"(\w+)"', docs)) == {input_name}
    assert f"[[[0.5]] * {STEPS}]" in docs
