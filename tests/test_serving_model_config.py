"""Several models in one server: TensorFlow Serving's model config file (parsed with its own
protos), the version policies, version labels over REST and gRPC, and the re-read."""

import logging
import os
import shutil
import threading
import time

import grpc
import numpy as np
import pytest
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving.local import tensors
from serving.local.model_config import (
    ModelConfig,
    ModelConfigError,
    Models,
    parse_model_config,
    read_model_config,
)
from serving.local.payload import RequestError
from serving.local.repository import ModelRepository, VersionPolicy
from serving.names import MAX_VERSION
from tests.limits import limit
from tests.serving_helpers import REPO_ROOT, ThreadServer, exported, http_call

pytestmark = pytest.mark.timeout(120)


class _Loaded:
    """A stand-in servable: loads any version folder."""

    def __init__(self, path, version):
        self.version, self.path = version, path


def _versions(base, *numbers):
    for number in numbers:
        os.makedirs(os.path.join(base, str(number)), exist_ok=True)
        with open(os.path.join(base, str(number), "saved_model.pb"), "w") as handle:
            handle.write("pb")
    return str(base)


def _config(*models):
    """A ModelServerConfig text of `(name, base_path, policy text, {label: version})`."""
    entries = []
    for name, base, policy, labels in models:
        lines = [f'name: "{name}"', f'base_path: "{base}"', 'model_platform: "tensorflow"']
        if policy:
            lines.append(f"model_version_policy {{ {policy} }}")
        lines += [f'version_labels {{ key: "{k}" value: {v} }}' for k, v in labels.items()]
        entries.append("config {\n  " + "\n  ".join(lines) + "\n}")
    return "model_config_list {\n" + "\n".join(entries) + "\n}\n"


def test_a_config_reads_as_tensorflow_serving_reads_it(tmp_path):
    a, b, c = (_versions(tmp_path / name, 1) for name in "abc")
    text = _config(
        ("a", a, "specific { versions: 3 versions: 1 }", {"stable": 1, "canary": 3}),
        ("b", b, "latest { num_versions: 2 }", {}),
        ("c", c, "all {}", {}),
        ("d", c, "", {}),
    )
    models = parse_model_config(text)
    assert models == [
        ModelConfig("a", a, VersionPolicy("specific", versions=(1, 3)), {"stable": 1, "canary": 3}),
        ModelConfig("b", b, VersionPolicy("latest", 2)),
        ModelConfig("c", c, VersionPolicy("all")),
        ModelConfig("d", c, VersionPolicy("latest", 1)),  # no policy: the latest one
    ]
    assert parse_model_config(_config(("e", a, "latest {}", {})))[0].policy == VersionPolicy()


def test_the_repository_s_example_config_parses():
    (model,) = read_model_config(os.path.join(REPO_ROOT, "serving", "models.config"))
    assert (model.name, model.base_path, model.policy) == (
        "antisym", "/models/antisym", VersionPolicy("latest", 1)
    )  # fmt: skip


def test_a_label_may_name_any_int64_version():
    (config,) = parse_model_config(_config(("a", "x", "", {"first": 0, "last": MAX_VERSION})))
    assert config.labels == {"first": 0, "last": 2**63 - 1}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model_config_list { config { name: 'a' base_path: 'x' }", "does not parse: "),
        ("", "has no model_config_list (the only kind served)"),
        ("model_config_list { }", "lists no model"),
        (_config(("a", "x", "", {}), ("a", "y", "", {})), "names model 'a' more than once"),
        (_config(("a/b", "x", "", {})), "model 1: Received an invalid value for argument "
         "`name`, expected a name usable in /v1/models/NAME"),
        ("model_config_list { config { name: 'a' } }", "model 1 (a) has no base_path"),
        ("model_config_list { config { name: 'a' base_path: 'x' model_platform: 'onnx' } }",
         "model 1 (a) has model_platform 'onnx'; only tensorflow is served"),
        (_config(("a", "x", "specific { }", {})),
         "model 1 (a) has a specific version policy without versions"),
        (_config(("a", "x", "specific { versions: 1 }", {"canary": 2})),
         "model 1 (a) labels version 2 'canary', which its policy (specific 1) does not serve"),
        (_config(("a", "x", "", {"a/b": 1})),
         "model 1 (a) has label 'a/b', which /v1/models/NAME/labels/LABEL cannot reach"),
        (_config(("a", "x", "", {"old": -1})), "model 1 (a) labels version -1 'old': not a "
         "version"),
    ],
)  # fmt: skip
def test_a_bad_config_is_one_line_naming_the_model_at_fault(text, message):
    with pytest.raises(ModelConfigError) as refused:
        parse_model_config(text, "the model config 'm.config'")
    assert str(refused.value).startswith("the model config 'm.config'")
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_config_text_without_a_source_is_named_the_model_config():
    with pytest.raises(ModelConfigError, match=r"^the model config does not parse: "):
        parse_model_config("model_config_list { config {")


def test_a_version_folder_as_base_path_and_an_unreadable_file_are_refused(tmp_path):
    base = _versions(tmp_path, 1)
    with pytest.raises(ModelConfigError, match=r"model 1 \(a\): base_path '.*1' holds a saved"):
        parse_model_config(_config(("a", os.path.join(base, "1"), "", {})))
    with pytest.raises(ModelConfigError, match=r"cannot read the model config '.*missing'"):
        read_model_config(str(tmp_path / "missing"))


@pytest.mark.parametrize(
    ("policy", "served"),
    [
        (VersionPolicy("latest", 2), [4, 3]),
        (VersionPolicy("specific", versions=(1, 3, 9)), [3, 1]),  # 9 has no folder
        (VersionPolicy("all"), [4, 3, 2, 1]),
    ],
)
def test_each_version_policy_serves_its_versions(tmp_path, policy, served):
    repository = ModelRepository(_versions(tmp_path, 1, 2, 3, 4), "m", 60, _Loaded, policy)
    repository.refresh()
    assert repository.served_versions == served
    assert repository.get("m").version == served[0]  # no version asked: the highest served
    for version in served:
        assert repository.get("m", str(version)).version == version
    states = {e["version"]: e["state"] for e in repository.status("m")["model_version_status"]}
    assert states == {str(v): "AVAILABLE" if v in served else "END" for v in (1, 2, 3, 4)}
    for version in {1, 2, 3, 4} - set(served):
        with pytest.raises(RequestError) as refused:
            repository.get("m", str(version))
        assert refused.value.status == 404
        assert refused.value.message == (
            f"Servable not found for request: Specific(m, {version}): version {version} is not "
            f"loaded: the served versions are {', '.join(map(str, served))} (policy "
            f"{policy.describe()})"
        )


def test_latest_two_falls_back_past_a_version_that_fails_and_keeps_what_it_served(tmp_path):
    class Refusing(_Loaded):
        def __init__(self, path, version):
            if version == 3:
                raise ValueError("cannot load 3")
            super().__init__(path, version)

    base = _versions(tmp_path, 1, 2, 3)
    repository = ModelRepository(base, "m", 60, Refusing, VersionPolicy("latest", 2))
    repository.refresh()
    assert repository.served_versions == [2, 1]
    kept = repository.get("m", "2")
    _versions(tmp_path, 4)
    repository.refresh()
    assert repository.served_versions == [4, 2]
    assert repository.get("m", "2") is kept  # not loaded again
    repository.set_policy(VersionPolicy("specific", versions=(1,)))
    repository.refresh()
    assert repository.served_versions == [1]


def test_a_policy_refuses_what_it_cannot_mean():
    with pytest.raises(ValueError, match="argument `kind`, expected latest, specific or all"):
        VersionPolicy("newest")
    with pytest.raises(ValueError, match="argument `num_versions`, expected at least 1, got 0"):
        VersionPolicy("latest", 0)
    with pytest.raises(ValueError, match="argument `versions`, expected at least one version"):
        VersionPolicy("specific")


def _models(tmp_path, text):
    path = tmp_path / "models.config"
    path.write_text(text)
    models = Models.from_file(str(path), poll_seconds=60, loader=_Loaded)
    models.start()
    return models, path


def test_labels_name_served_versions_and_an_unknown_label_is_400(tmp_path):
    a, b = _versions(tmp_path / "a", 1, 2, 3), _versions(tmp_path / "b", 5)
    models, _ = _models(tmp_path, _config(
        ("a", a, "specific { versions: 1 versions: 2 }", {"stable": 1, "canary": 2}),
        ("b", b, "", {}),
    ))  # fmt: skip
    try:
        assert models.names == ["a", "b"]
        assert models.get("a", label="stable").version == 1
        assert models.get("a", label="canary").version == 2
        assert models.get("a").version == 2 and models.get("b").version == 5
        assert models.labels("a") == {"stable": 1, "canary": 2} and models.labels("b") == {}
        status = models.status("a", label="stable")["model_version_status"]
        assert [(e["version"], e["state"]) for e in status] == [("1", "AVAILABLE")]
        for call in (lambda: models.get("a", label="beta"), lambda: models.get("b", label="x")):
            with pytest.raises(RequestError) as refused:
                call()
            assert refused.value.status == 400 and refused.value.code == "INVALID_ARGUMENT"
            assert refused.value.message.startswith("Unrecognized servable version label: ")
        with pytest.raises(RequestError) as refused:
            models.get("c")
        assert (refused.value.status, refused.value.message) == (
            404, "Servable not found for request: Latest(c)"
        )  # fmt: skip
        unknown = r"^Servable not found for request: Specific\(c, 9\)$"
        with pytest.raises(RequestError, match=unknown):
            models.status("c", version="9")
    finally:
        models.stop()
    assert not models.watching


def test_a_label_of_a_version_that_is_not_served_is_refused(tmp_path):
    base = _versions(tmp_path / "a", 1, 2)
    text = _config(("a", base, "", {"stable": 1}))  # latest: only 2 is served
    models = Models(parse_model_config(text), poll_seconds=60, loader=_Loaded)
    try:
        with pytest.raises(ModelConfigError) as refused:
            models.start()
        assert str(refused.value) == (
            "label 'stable' of model a names version 1, which is not served (served: 2)"
        )
        assert models.labels("a") == {}
    finally:
        models.stop()
    unserved = _config(("a", base, "specific { versions: 5 }", {"stable": 5}))
    nothing = Models(parse_model_config(unserved), poll_seconds=60, loader=_Loaded)
    try:
        with pytest.raises(ModelConfigError, match=r"not served \(served: none\)$"):
            nothing.start()
    finally:
        nothing.stop()


def test_a_reread_applies_changes_and_a_bad_file_keeps_the_previous_config(tmp_path, caplog):
    a = _versions(tmp_path / "a", 1, 2, 3)
    b = _versions(tmp_path / "b", 7)
    policy = "specific { versions: 1 versions: 2 versions: 3 }"
    models, path = _models(tmp_path, _config(("a", a, policy, {"stable": 1, "canary": 2})))
    try:
        assert models.reread(str(path)) is False  # unchanged: nothing to do
        # A rollout step: canary moves to 3, a second model arrives.
        path.write_text(_config(("a", a, policy, {"stable": 2, "canary": 3}),
                                ("b", b, "", {})))  # fmt: skip
        with caplog.at_level(logging.INFO, logger="serving"):
            assert models.reread(str(path)) is True
        assert f"Model config {path} applied: a, b" in [r.getMessage() for r in caplog.records]
        assert models.get("a", label="canary").version == 3
        assert models.get("a", label="stable").version == 2
        assert models.get("b").version == 7
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="serving"):
            path.write_text("model_config_list { config { name: 'a' ")  # half written
            assert models.reread(str(path)) is False
            assert models.reread(str(path)) is False  # the same bad file: said once
        (record,) = caplog.records
        assert record.getMessage().startswith(
            "Model config not applied, still serving the previous one: the model config "
        )
        assert models.get("a", label="canary").version == 3 and models.names == ["a", "b"]
        b_repository = models.repository("b")
        path.write_text(_config(("a", a, "latest { num_versions: 1 }", {})))
        assert models.reread(str(path)) is True
        assert models.names == ["a"] and not b_repository.watching  # b unloaded
        assert models.repository("a").served_versions == [3]
        with pytest.raises(RequestError, match="Unrecognized servable version label: canary"):
            models.get("a", label="canary")
    finally:
        models.stop()


def test_apply_keeps_what_did_not_change_and_unloads_what_left(tmp_path, caplog):
    """The same entry keeps its repository (nothing loaded again); a model whose folder
    changed is loaded from the new one; a model that left (one without labels) is
    unloaded, with one log line."""
    a, moved, b = (
        _versions(tmp_path / "a", 1),
        _versions(tmp_path / "a2", 4),
        _versions(tmp_path / "b", 7),
    )
    models, path = _models(tmp_path, _config(("a", a, "", {}), ("b", b, "", {})))
    try:
        kept, first = models.repository("a"), models.get("a")
        models.apply(read_model_config(str(path)))
        assert models.repository("a") is kept and models.get("a") is first
        with caplog.at_level(logging.INFO, logger="serving"):
            models.apply(parse_model_config(_config(("a", moved, "", {}))))
        unloads = [r.getMessage() for r in caplog.records if "no longer" in r.getMessage()]
        assert unloads == ["Model b is no longer in the config: unloading it"]
        assert models.names == ["a"]
        assert models.get("a").version == 4 and models.get("a").path.startswith(moved)
        assert models.repository("a") is not kept and not kept.watching
    finally:
        models.stop()


def test_a_model_whose_labels_were_refused_can_still_be_removed(tmp_path):
    a, b = _versions(tmp_path / "a", 1), _versions(tmp_path / "b", 7)
    models, _ = _models(tmp_path, _config(("a", a, "", {})))
    try:
        with pytest.raises(ModelConfigError, match="label 'canary' of model b names version 9"):
            models.apply(parse_model_config(_config(("a", a, "", {}), ("b", b, "", {"canary": 9}))))
        assert models.names == ["a", "b"] and models.labels("b") == {}  # served, unlabelled
        models.apply(parse_model_config(_config(("a", a, "", {}))))
        assert models.names == ["a"]
    finally:
        models.stop()


def test_stop_waits_for_a_reload_in_progress_up_to_its_timeout(tmp_path):
    """A reload the watcher is in the middle of (a slow load) holds `stop`: it waits up to
    `timeout`, reports that the watcher has not ended, and a later `stop` ends it."""
    a, b = _versions(tmp_path / "a", 1), _versions(tmp_path / "b", 2)
    gate, loading = threading.Event(), threading.Event()

    class SlowB(_Loaded):
        def __init__(self, path, version):
            if os.path.basename(os.path.dirname(path)) == "b":
                loading.set()
                gate.wait(10)
            super().__init__(path, version)

    path = tmp_path / "models.config"
    path.write_text(_config(("a", a, "", {})))
    models = Models.from_file(str(path), poll_seconds=60, loader=SlowB)
    models.start()
    models.watch(str(path), poll_seconds=0.05)
    try:
        # A daemon: a server that stops is not held open by the watcher.
        (watcher,) = [t for t in threading.enumerate() if t.name == "model-config-watcher"]
        assert watcher.daemon
        path.write_text(_config(("a", a, "", {}), ("b", b, "", {})))
        assert loading.wait(30)  # the watcher is loading b
        started = time.monotonic()
        assert models.stop(timeout=0.3) is False
        assert time.monotonic() - started < 5
        assert models.watching
    finally:
        gate.set()
        stopped = models.stop(timeout=limit(30))  # also after a failure: no thread left behind
    assert stopped is True
    assert not models.watching


def test_the_watcher_rereads_on_its_interval(tmp_path):
    a = _versions(tmp_path / "a", 1, 2)
    models, path = _models(tmp_path, _config(("a", a, "all {}", {"stable": 1})))
    models.watch(str(path), poll_seconds=0.05)
    try:
        path.write_text(_config(("a", a, "all {}", {"stable": 2})))
        deadline = time.monotonic() + limit(30)
        while models.labels("a") != {"stable": 2} and time.monotonic() < deadline:
            time.sleep(0.02)
        assert models.labels("a") == {"stable": 2}
        assert models.watching
    finally:
        assert models.stop(timeout=limit(10))
    assert not models.watching


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory):
    """A real export as versions 1 and 2 of model `a`, version 1 also as model `b`."""
    _, base = exported("antisymmetric")
    root = tmp_path_factory.mktemp("config")
    shutil.copytree(os.path.join(base, "1"), root / "a" / "1")
    shutil.copytree(os.path.join(base, "1"), root / "a" / "2")
    shutil.copytree(os.path.join(base, "1"), root / "b" / "1")
    config = root / "models.config"
    config.write_text(_config(
        ("a", root / "a", "specific { versions: 1 versions: 2 }", {"stable": 1, "canary": 2}),
        ("b", root / "b", "", {}),
    ))  # fmt: skip
    return config


def test_the_server_answers_labels_over_rest_and_grpc(two_versions):
    server = ThreadServer(None, None, grpc_port=0, model_config_file=str(two_versions))
    x = np.full((1, 64, 1), 0.5, "float32")
    try:
        assert server.server.models.names == ["a", "b"]
        for label, version in (("stable", 1), ("canary", 2)):
            path = f"/v1/models/a/labels/{label}"
            status, body = http_call(server.url + path + ":predict", "POST",
                                     {"instances": x.tolist()})  # fmt: skip
            assert status == 200 and len(body["predictions"]) == 1, body
            status, metadata = http_call(server.url + path + "/metadata")
            assert metadata["model_spec"]["version"] == str(version)
            status, states = http_call(server.url + path)
            assert [e["version"] for e in states["model_version_status"]] == [str(version)]
        status, body = http_call(server.url + "/v1/models/a/labels/beta:predict", "POST",
                                 {"instances": x.tolist()})  # fmt: skip
        assert (status, body) == (400, {"error": "Unrecognized servable version label: beta"})
        status, body = http_call(server.url + "/v1/models/b/versions/1:predict", "POST",
                                 {"instances": x.tolist()})  # fmt: skip
        assert status == 200
        host, port = server.server.grpc_address
        with grpc.insecure_channel(f"{host}:{port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "a"
            request.model_spec.version_label = "canary"
            request.inputs["sequence"].CopyFrom(tensors.to_tensor_proto(x))
            response = stub.Predict(request, timeout=limit(60))
            assert response.model_spec.version.value == 2
            request.model_spec.version_label = "beta"
            with pytest.raises(grpc.RpcError) as refused:
                stub.Predict(request, timeout=limit(60))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details() == "Unrecognized servable version label: beta"
    finally:
        server.stop()


def test_the_server_command_refuses_a_bad_config_in_one_line(tmp_path, capsys):
    from serving.local import server as server_module

    path = tmp_path / "bad.config"
    path.write_text("model_config_list { config { name: 'a' } }")
    assert server_module.main(["--model-config-file", str(path), "--grpc-port", "0"]) == 2
    assert capsys.readouterr().err == (
        "python -m serving.server: error: Received an invalid value for argument "
        "`--model-config-file`, expected a TensorFlow Serving model config file "
        f"(ModelServerConfig, text format), got the model config '{path}', model 1 (a) has no "
        "base_path.\n"
    )


def test_a_label_moved_to_a_version_still_loading_applies_once_it_loads(tmp_path, caplog):
    """Export a version, then move the label to it: the re-read that comes before the
    version has loaded refuses the label (said once, as the labels' refusal, not the
    config's) and the next re-reads of the same file try again until it applies."""
    a = _versions(tmp_path / "a", 1)
    policy = "all {}"
    models, path = _models(tmp_path, _config(("a", a, policy, {"stable": 1})))
    try:
        _versions(tmp_path / "a", 2)  # exported; the next scan (60 s away) loads it
        path.write_text(_config(("a", a, policy, {"stable": 2})))
        with caplog.at_level(logging.ERROR, logger="serving"):
            assert models.reread(str(path)) is False
            assert models.reread(str(path)) is False  # tried again, not said again
        (record,) = caplog.records
        assert record.getMessage().startswith(
            f"Model config {path} applied but not its labels (tried again at each re-read): "
            "label 'stable' of model a names version 2, which is not served (served: 1)"
        )
        assert models.get("a", label="stable").version == 1  # the old label still answers
        models.repository("a").refresh()  # version 2 is AVAILABLE
        assert models.reread(str(path)) is True  # the same file, now applicable
        assert models.get("a", label="stable").version == 2
        assert models.reread(str(path)) is False  # applied: nothing left to do
    finally:
        models.stop()


def test_a_config_file_that_is_no_regular_file_or_too_large_is_refused_without_reading(
    tmp_path,
):
    from serving.local.model_config import MAX_CONFIG_BYTES

    fifo = tmp_path / "fifo.config"
    os.mkfifo(fifo)
    big = tmp_path / "big.config"
    big.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    cases = {
        str(fifo): f"the model config {str(fifo)!r} is not a regular file",
        "/dev/zero": "the model config '/dev/zero' is not a regular file",
        str(big): f"the model config {str(big)!r} is larger than 1,048,576 bytes",
    }
    for path, message in cases.items():
        answers = []

        def read(path=path, answers=answers):
            try:
                read_model_config(path)
            except ModelConfigError as error:
                answers.append(str(error))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(10)  # a FIFO must not block, /dev/zero must not be read to the end
        assert not reader.is_alive() and answers == [message], path
    # At the limit it is read (and parsed: a comment alone is no model list).
    big.write_bytes(b"#" * MAX_CONFIG_BYTES)
    with pytest.raises(ModelConfigError, match="has no model_config_list"):
        read_model_config(str(big))


def test_a_config_replaced_by_a_fifo_is_refused_at_the_re_read_and_the_models_kept(
    tmp_path, caplog
):
    a = _versions(tmp_path / "a", 1)
    models, path = _models(tmp_path, _config(("a", a, "", {})))
    try:
        path.unlink()
        os.mkfifo(path)
        with caplog.at_level(logging.ERROR, logger="serving"):
            assert models.reread(str(path)) is False
        assert "is not a regular file" in caplog.records[0].getMessage()
        assert models.get("a").version == 1
    finally:
        models.stop()
