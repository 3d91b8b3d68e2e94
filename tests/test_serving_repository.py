"""The model repository: TensorFlow Serving's `latest` policy and a watcher that never dies."""

import os
import shutil
import threading
import time

import pytest

from tests.limits import limit

pytestmark = pytest.mark.timeout(60)


class _FakeServable:
    """Loads only complete versions (with a file under variables/), like a SavedModel."""

    def __init__(self, path, version):
        if not os.listdir(os.path.join(path, "variables")):
            raise OSError(f"no variables in {path}")
        self.version = version


def _fake_version(base, name, variables=True):
    os.makedirs(os.path.join(base, name, "variables"), exist_ok=True)
    with open(os.path.join(base, name, "saved_model.pb"), "w") as f:
        f.write("pb")
    if variables:
        with open(os.path.join(base, name, "variables", "variables.index"), "w") as f:
            f.write("index")


def _served(repository):
    from serving.local.payload import RequestError

    try:
        return repository.get(repository.name).version
    except RequestError:
        return None


def test_latest_policy_retries_rolls_back_and_ignores_non_ascii_digits(tmp_path):
    """The highest loadable version; a half-copied one retried; deletions roll back."""
    from serving.local.repository import ModelRepository

    base = str(tmp_path)
    for name in ("1", "2", "²", "3x", "٣"):  # "²" and "٣" pass str.isdigit()
        _fake_version(base, name)
    repository = ModelRepository(base, "m", poll_seconds=0.01, loader=_FakeServable)
    repository.refresh()
    assert _served(repository) == 2
    _fake_version(base, "3", variables=False)  # caught mid-copy
    repository.refresh()
    assert _served(repository) == 2
    _fake_version(base, "3")  # the copy finished: retried at once (its files changed)
    repository.refresh()
    assert _served(repository) == 3
    shutil.rmtree(os.path.join(base, "3"))
    shutil.rmtree(os.path.join(base, "2"))
    repository.refresh()
    assert _served(repository) == 1
    assert repository.get("m", "1").version == 1
    shutil.rmtree(os.path.join(base, "1"))
    repository.refresh()
    assert _served(repository) is None


def test_version_watcher_survives_any_error(tmp_path, monkeypatch):
    """The base path turned into a file, then gone, then EMFILE: still watching, then loads."""
    import errno

    from serving.local.repository import ModelRepository

    base = str(tmp_path / "base")
    _fake_version(base, "1")
    repository = ModelRepository(base, "m", 0.02, loader=_FakeServable)
    repository.start()
    try:
        assert _served(repository) == 1
        shutil.rmtree(base)
        with open(base, "w") as f:
            f.write("not a folder")
        time.sleep(0.2)
        os.remove(base)

        def emfile():
            raise OSError(errno.EMFILE, "Too many open files")

        monkeypatch.setattr(repository, "scan", emfile)
        time.sleep(0.2)
        assert repository.watching and _served(repository) == 1
        monkeypatch.undo()
        assert repository.watching and _served(repository) == 1
        _fake_version(base, "5")
        deadline = time.monotonic() + limit(10)
        while _served(repository) != 5:
            assert time.monotonic() < deadline, "version 5 was not loaded"
            time.sleep(0.02)
    finally:
        repository.stop()


def test_an_empty_base_path_says_how_versions_are_laid_out_and_a_version_folder_says_so(tmp_path):
    from serving.local.repository import no_versions_message

    base = str(tmp_path)
    assert no_versions_message("m", base) == (
        f"No versions of servable m found under base path {base} "
        "(version folders are numbered: 1/, 2/)"
    )
    _fake_version(base, "3")
    version = os.path.join(base, "3")
    assert no_versions_message("m", version) == (
        f"No versions of servable m found under base path {version} ({version!r} holds a "
        "saved_model.pb itself: it is a version folder, the base path is its parent (versions "
        "are numbered sub-folders))"
    )


class _CodedError(Exception):
    """Like `tf.errors.OpError`: an `error_code` and a `message` apart from `str()`."""

    def __init__(self, code, message):
        super().__init__("str() of the error, not its message")
        self.error_code, self.message = code, message


class _CodeOnly(Exception):
    """An `error_code` without a `message`: `str()` is its text."""

    def __init__(self, code, text="str() when there is no message"):
        super().__init__(text)
        self.error_code = code


def _warmup_failed(error):
    from serving.exports.warmup import WarmupRequestFailed

    return WarmupRequestFailed(3, "serving_default", error)


@pytest.mark.parametrize(
    "error, expected",
    [
        (_CodedError(5, "no such file\nand pages of context"), ("NOT_FOUND", "no such file")),
        (_CodedError(1, "cancelled"), ("CANCELLED", "cancelled")),
        (_CodedError(16, "who are you"), ("UNAUTHENTICATED", "who are you")),
        (_CodedError(9, ""), ("FAILED_PRECONDITION", "")),
        # Codes outside TensorFlow's (and OK, which is no failure) are told by their class.
        (_CodedError(0, "ok?"), ("UNKNOWN", "_CodedError: str() of the error, not its message")),
        (_CodedError(17, "x"), ("UNKNOWN", "_CodedError: str() of the error, not its message")),
        (_CodedError("5", "x"), ("UNKNOWN", "_CodedError: str() of the error, not its message")),
        (FileNotFoundError(2, "gone"), ("NOT_FOUND", "FileNotFoundError: [Errno 2] gone")),
        (PermissionError(13, "no"), ("PERMISSION_DENIED", "PermissionError: [Errno 13] no")),
        (ValueError("bad\nmore"), ("UNKNOWN", "ValueError: bad")),
        (_CodedError(13, "x" * 600), ("INTERNAL", "x" * 500)),
        (_CodeOnly(14), ("UNAVAILABLE", "str() when there is no message")),
        (_CodeOnly(14, ""), ("UNAVAILABLE", "")),
    ],
)
def test_a_load_failure_is_reported_with_tensorflow_serving_s_code_and_first_line(error, expected):
    from serving.local.servable import error_status

    assert error_status(error) == expected


@pytest.mark.parametrize(
    "error, code",
    [(_CodedError(5, "missing"), "NOT_FOUND"), (ValueError("missing"), "INVALID_ARGUMENT")],
)
def test_a_refused_warmup_request_keeps_its_error_s_code_or_is_an_invalid_argument(error, code):
    from serving.local.servable import error_status

    assert error_status(_warmup_failed(error)) == (
        code, "warmup request 3 (signature 'serving_default') failed: missing"
    )  # fmt: skip


def test_a_real_tensorflow_error_keeps_its_code_and_message():
    import tensorflow as tf

    from serving.local.servable import error_status

    error = tf.errors.InvalidArgumentError(None, None, "bad graph\nnode context")
    assert error_status(error) == ("INVALID_ARGUMENT", "bad graph")


def test_a_failed_version_waits_for_its_retry_unless_its_files_change(tmp_path):
    from serving.local.repository import ModelRepository

    calls = []

    def failing(path, version):
        calls.append(version)
        raise ValueError(f"cannot load {version}")

    base = str(tmp_path)
    _fake_version(base, "1")
    repository = ModelRepository(base, "m", poll_seconds=0.5, loader=failing)
    repository.refresh()
    repository.refresh()  # the same files, before the retry is due: not loaded again
    assert calls == [1]
    assert repository.status("m")["model_version_status"][0]["status"]["error_code"] == "UNKNOWN"
    with open(os.path.join(base, "1", "variables", "more"), "w") as f:
        f.write("copied on")
    repository.refresh()  # its files changed: tried at once
    assert calls == [1, 1]
    time.sleep(0.6)
    repository.refresh()  # the files as they are now: the delay doubled to 1 s
    assert calls == [1, 1]
    time.sleep(0.6)
    repository.refresh()
    assert calls == [1, 1, 1]


def _never_loading(tmp_path, monkeypatch, **settings):
    """`(repository, calls, now)`: version 1 under `tmp_path` on a loader that always
    fails (each call recorded in `calls`), on a clock `now[0]` the test moves."""
    from serving.local.repository import ModelRepository

    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    calls = []

    def failing(path, version):
        calls.append(version)
        raise ValueError(f"cannot load {version}")

    _fake_version(str(tmp_path), "1")
    repository = ModelRepository(str(tmp_path), "m", poll_seconds=0.5, loader=failing,
                                 **settings)  # fmt: skip
    return repository, calls, now


def test_a_version_that_keeps_failing_is_left_after_its_retries_until_its_files_change(
    tmp_path, monkeypatch, caplog
):
    """Two retries allowed: three loads of the same files, then none however long the
    server waits (said once); a changed copy is tried again with retries of its own."""
    repository, calls, now = _never_loading(tmp_path, monkeypatch, max_load_retries=2)
    with caplog.at_level("ERROR", logger="serving"):
        for _ in range(12):
            repository.refresh()
            now[0] += 40.0  # past any back-off
    assert calls == [1, 1, 1]
    assert [r.getMessage() for r in caplog.records] == [
        "Could not load version 1 of m (retried): cannot load 1",
        "Could not load version 1 of m (retried): cannot load 1",
        "Could not load version 1 of m (failed 3 times: tried again when its files change): "
        "cannot load 1",
    ]
    (status,) = repository.status("m")["model_version_status"]
    assert (status["state"], status["status"]["error_code"]) == ("END", "UNKNOWN")
    with open(os.path.join(str(tmp_path), "1", "variables", "more"), "w") as f:
        f.write("a new copy")
    for _ in range(12):
        repository.refresh()
        now[0] += 40.0
    assert calls == [1] * 6


def test_a_failed_version_is_retried_once_its_delay_has_passed_exactly(
    tmp_path, monkeypatch, caplog
):
    repository, calls, now = _never_loading(tmp_path, monkeypatch)
    with caplog.at_level("ERROR", logger="serving"):
        repository.refresh()
    assert [r.getMessage() for r in caplog.records] == [
        "Could not load version 1 of m (retried): cannot load 1"
    ]
    now[0] = 100.4999
    repository.refresh()
    assert calls == [1]
    now[0] = 100.5  # retry_at itself: due
    repository.refresh()
    assert calls == [1, 1]


def test_a_version_s_fingerprint_is_every_file_under_it_with_its_size_and_mtime(
    tmp_path, monkeypatch
):
    from serving.local.repository import _fingerprint

    folder = tmp_path / "1"
    (folder / "variables").mkdir(parents=True)
    names = ["saved_model.pb", "fingerprint.pb", "variables/variables.index",
             "variables/variables.data-00000-of-00001"]  # fmt: skip
    for size, name in enumerate(names, start=3):
        (folder / name).write_bytes(b"x" * size)
    expected = []
    for name in names:
        info = os.stat(folder / name)
        expected.append((os.path.join(str(folder), *name.split("/")), info.st_size,
                         info.st_mtime_ns))  # fmt: skip
    assert _fingerprint(str(folder)) == tuple(sorted(expected))
    # A file gone between the listing and its stat is left out; the others stay.
    first = next(os.walk(folder))[2][0]
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        if os.path.basename(path) == first:
            raise FileNotFoundError(path)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    kept = tuple(sorted(item for item in expected if os.path.basename(item[0]) != first))
    assert _fingerprint(str(folder)) == kept


def test_the_watcher_is_a_named_daemon_thread_and_each_version_served_is_logged(tmp_path, caplog):
    from serving.local.repository import ModelRepository

    _fake_version(str(tmp_path), "4")
    repository = ModelRepository(str(tmp_path), "digits", 60.0, loader=_FakeServable)
    with caplog.at_level("INFO", logger="serving"):
        repository.start()
    try:
        # A daemon: a server that stops is not held open by the watcher.
        assert repository._thread.name == "version-watcher" and repository._thread.daemon
        assert [r.getMessage() for r in caplog.records] == ["Serving version 4 of model digits"]
    finally:
        repository.stop()


class _Refusing(_FakeServable):
    """Loads as `_FakeServable`, except the versions listed in `REFUSED`."""

    REFUSED = (2,)

    def __init__(self, path, version):
        if version in self.REFUSED:
            raise ValueError(f"cannot load {version}")
        super().__init__(path, version)


def _not_found(call):
    from serving.local.payload import RequestError

    with pytest.raises(RequestError) as caught:
        call()
    assert caught.value.status == 404
    return caught.value.message


def test_each_404_says_why_the_version_asked_for_is_not_served(tmp_path):
    from serving.local.repository import ModelRepository

    base = str(tmp_path)
    for name in ("1", "2"):
        _fake_version(base, name)
    repository = ModelRepository(base, "m", poll_seconds=60, loader=_Refusing)
    repository.refresh()
    assert _served(repository) == 1
    assert _not_found(lambda: repository.get("m", "2")) == (
        "Servable not found for request: Specific(m, 2): version 2 is not loaded: UNKNOWN: "
        "ValueError: cannot load 2"
    )
    _fake_version(base, "3")
    _fake_version(base, "4", variables=False)
    repository.refresh()
    assert _served(repository) == 3
    assert _not_found(lambda: repository.get("m", "1")) == (
        "Servable not found for request: Specific(m, 1): version 1 is not loaded: the served "
        "version is 3"
    )
    assert _not_found(lambda: repository.get("m", "7")) == (
        "Servable not found for request: Specific(m, 7): no version folder 7 under the "
        "model's base path"
    )
    assert _not_found(lambda: repository.get("m", "x")) == (
        "Servable not found for request: Specific(m, x): not a version"
    )
    assert _not_found(lambda: repository.get("other")) == (
        "Servable not found for request: Latest(other)"
    )
    assert _not_found(lambda: repository.status("other")) == (
        "Servable not found for request: Latest(other)"
    )
    assert _not_found(lambda: repository.status("other", "3")) == (
        "Servable not found for request: Specific(other, 3)"
    )
    assert _not_found(lambda: repository.status("m", "7")) == "Could not find version 7 of model m"
    assert [e["version"] for e in repository.status("m", "4")["model_version_status"]] == ["4"]


def test_with_no_version_served_the_404_names_the_highest_failure(tmp_path, monkeypatch):
    from serving.local.repository import ModelRepository

    monkeypatch.setattr(_Refusing, "REFUSED", (1, 2))
    base = str(tmp_path)
    for name in ("1", "2"):
        _fake_version(base, name)
    repository = ModelRepository(base, "m", poll_seconds=60, loader=_Refusing)
    repository.refresh()
    assert _not_found(lambda: repository.get("m")) == (
        "Servable not found for request: Latest(m): no version loads; the highest: UNKNOWN: "
        "ValueError: cannot load 2"
    )


def test_an_unreadable_base_path_is_named_until_a_scan_succeeds(tmp_path):
    from serving.local.repository import ModelRepository

    base = str(tmp_path / "base")
    repository = ModelRepository(base, "m", poll_seconds=0.05, loader=_FakeServable)
    repository.start()
    try:
        message = _not_found(lambda: repository.get("m"))
        assert message.startswith(
            "Servable not found for request: Latest(m): cannot read the model's base path: "
            "FileNotFoundError: "
        ), message
        _fake_version(base, "1")
        deadline = time.monotonic() + limit(10)
        while _served(repository) != 1:
            assert time.monotonic() < deadline, "version 1 was not loaded"
            time.sleep(0.02)
        os.rename(base, base + ".moved")  # versions were listed: they stay the answer
        time.sleep(0.2)
        assert _not_found(lambda: repository.get("m", "2")) == (
            "Servable not found for request: Specific(m, 2): no version folder 2 under the "
            "model's base path"
        )
    finally:
        repository.stop()


def test_a_loaded_version_prints_its_signatures_as_tensorflow_serving_does():
    from serving.local.servable import Servable
    from tests.serving_helpers import FEATURES, STEPS, exported

    _, base = exported("antisymmetric")
    servable = Servable(os.path.join(base, "1"), 1)
    assert servable.version == 1
    assert servable.max_rank == 3  # (batch, T, m): the deepest input of any signature
    signatures = servable.signature_def["signature_def"]
    # The whole SignatureDefMap, as TensorFlow Serving prints it: the init op's entry too.
    assert sorted(signatures) == ["__saved_model_init_op", "padded", "serving_default", "stream"]
    default = signatures["serving_default"]
    assert default["method_name"] == "tensorflow/serving/predict"
    sequence = default["inputs"]["sequence"]
    assert sequence["dtype"] == "DT_FLOAT"
    # Field names kept and default values printed (`unknown_rank: false`, empty dim names).
    assert sequence["tensor_shape"] == {
        "dim": [{"size": "-1", "name": ""}, {"size": str(STEPS), "name": ""},
                {"size": str(FEATURES), "name": ""}],
        "unknown_rank": False,
    }  # fmt: skip


def test_the_deepest_input_of_a_saved_model_without_ranks_is_zero(tmp_path):
    import tensorflow as tf

    from serving.local.servable import Servable

    bare = str(tmp_path / "bare")
    tf.saved_model.save(tf.Module(), bare)
    assert Servable(bare, 1).max_rank == 0  # no signature at all

    module = tf.Module()
    module.f = tf.function(lambda x: {"y": x}, input_signature=[tf.TensorSpec(None, tf.float32)])
    unranked = str(tmp_path / "unranked")
    tf.saved_model.save(module, unranked, signatures={"serving_default": module.f})
    assert Servable(unranked, 1).max_rank == 0  # an input of unknown rank counts as none


def test_a_new_repository_polls_every_second_watches_nothing_and_answers_404(tmp_path):
    from serving.local.repository import ModelRepository

    _fake_version(str(tmp_path), "1")
    repository = ModelRepository(str(tmp_path), "m", loader=_FakeServable)
    assert repository.poll_seconds == 1.0  # TensorFlow Serving's file system poll, 1 s
    assert repository.watching is False
    # Before its first scan it serves nothing and lists nothing, without failing.
    assert _not_found(lambda: repository.status("m", "1")) == "Could not find version 1 of model m"
    assert _served(repository) is None


@pytest.mark.parametrize(
    "files, said",
    [(["model.tflite"], ": it holds a LiteRT model (model.tflite), which is not served here"),
     (["serving_default.onnx", "stream.onnx"],
      ": it holds an ONNX model (serving_default.onnx, stream.onnx), which is not served here"),
     (["notes.txt"], "")],
)  # fmt: skip
def test_a_version_folder_of_another_format_is_named_as_such(tmp_path, files, said):
    """A server pointed at a LiteRT or ONNX export's base path says what it found."""
    from serving.local.repository import ModelRepository

    os.makedirs(tmp_path / "1")
    for name in files:
        (tmp_path / "1" / name).write_bytes(b"x")
    repository = ModelRepository(str(tmp_path), "m", loader=_FakeServable)
    repository.refresh()
    (status,) = repository.status("m")["model_version_status"]
    assert status["status"] == {
        "error_code": "NOT_FOUND",
        "error_message": f"No saved_model.pb in version folder 1{said}",
    }


def test_a_broken_version_on_the_first_scan_is_logged_once(tmp_path, caplog):
    from serving.local.repository import ModelRepository

    os.makedirs(tmp_path / "2")  # no saved_model.pb
    _fake_version(str(tmp_path), "1")
    repository = ModelRepository(str(tmp_path), "m", loader=_FakeServable)
    expected = ["Version 2 of m is not loaded: No saved_model.pb in version folder 2"]
    with caplog.at_level("ERROR", logger="serving"):
        repository.refresh()
        assert [r.getMessage() for r in caplog.records] == expected  # at once
        repository.refresh()
    assert [r.getMessage() for r in caplog.records] == expected  # and not again
    assert _served(repository) == 1


def test_an_empty_base_path_warns_once_and_a_version_gone_is_logged(tmp_path, caplog):
    from serving.local.repository import ModelRepository

    base = tmp_path / "base"
    base.mkdir()
    repository = ModelRepository(str(base), "m", loader=_FakeServable)
    empty = (
        f"No versions of servable m found under base path {base} "
        "(version folders are numbered: 1/, 2/)"
    )
    with caplog.at_level("WARNING", logger="serving"):
        repository.refresh()
        repository.refresh()
        assert [r.getMessage() for r in caplog.records] == [empty]
        _fake_version(str(base), "1")
        repository.refresh()
        caplog.clear()
        shutil.rmtree(base / "1")
        repository.refresh()
    assert [r.getMessage() for r in caplog.records] == [
        empty,  # again: versions had been listed since
        "Version 1 of m is gone and no other loads",
    ]


def test_a_version_that_loads_on_its_retry_is_listed_ok(tmp_path):
    from serving.local.repository import ModelRepository

    base = str(tmp_path)
    _fake_version(base, "1", variables=False)  # caught mid-copy: fails
    repository = ModelRepository(base, "m", poll_seconds=60, loader=_FakeServable)
    repository.refresh()
    (status,) = repository.status("m")["model_version_status"]
    assert status["status"]["error_code"] == "UNKNOWN"
    _fake_version(base, "1")  # the copy finished: its files changed, so it is retried now
    repository.refresh()
    assert repository.status("m")["model_version_status"] == [
        {"version": "1", "state": "AVAILABLE",
         "status": {"error_code": "OK", "error_message": ""}}
    ]  # fmt: skip


def test_scan_errors_are_logged_once_each_until_a_scan_succeeds(tmp_path, monkeypatch, caplog):
    from serving.local.repository import ModelRepository

    repository = ModelRepository(str(tmp_path), "m", loader=_FakeServable)
    errors = iter([OSError("disk"), OSError("disk"), PermissionError("denied"), None,
                   OSError("disk")])  # fmt: skip

    def scan():
        error = next(errors)
        if error is not None:
            raise error
        return {}, {}

    monkeypatch.setattr(repository, "scan", scan)
    with caplog.at_level("DEBUG", logger="serving"):
        for _ in range(5):
            repository._refresh_logged()
    scans = [(r.levelname, r.getMessage()) for r in caplog.records if "Scan" in r.getMessage()]
    prefix = f"Scan of {tmp_path} failed, still serving: "
    assert scans == [
        ("ERROR", prefix + "OSError: disk"),
        ("DEBUG", prefix + "OSError: disk"),  # the same again: not repeated as an error
        ("ERROR", prefix + "PermissionError: denied"),
        ("ERROR", prefix + "OSError: disk"),  # after a good scan it is news again
    ]


def test_two_folders_naming_one_version_are_refused_with_both_names(tmp_path):
    from serving.local.repository import ModelRepository

    _fake_version(str(tmp_path), "3")
    _fake_version(str(tmp_path), "03")
    loadable, broken = ModelRepository(str(tmp_path), "m").scan()
    assert loadable == {}
    assert broken == {
        3: ("FAILED_PRECONDITION",
            "Folders '03' and '3' both name version 3; remove or rename one")
    }  # fmt: skip


def test_answers_to_clients_never_show_the_base_path_on_disk(tmp_path):
    """Load failures carry the path (TensorFlow's messages do); clients see `<base_path>`."""
    from serving.local.repository import ModelRepository

    base = str(tmp_path / "models")

    def loader(path, version):
        raise OSError(f"SavedModel file does not exist at: {path}/saved_model.pb")

    repository = ModelRepository(base, "m", loader=loader)
    repository._refresh_logged()  # the base path is missing: the scan fails
    assert base not in _not_found(lambda: repository.get("m"))
    _fake_version(base, "1")
    os.makedirs(os.path.join(base, "2"))  # no saved_model.pb
    repository.refresh()
    answers = [
        _not_found(lambda: repository.get("m")),
        _not_found(lambda: repository.get("m", "1")),
        _not_found(lambda: repository.get("m", "2")),
        _not_found(lambda: repository.get("m", "9")),
        str(repository.status("m")),
    ]
    for answer in answers:
        assert str(tmp_path) not in answer, answer
    assert "OSError: SavedModel file does not exist at: <base_path>/1/saved_model.pb" in answers[4]
    assert "No saved_model.pb in version folder 2" in answers[4]


def test_stop_waits_for_the_scan_in_progress_and_nothing_loads_after_it(tmp_path):
    """A version appears while the watcher is loading another: `stop()` returns once the
    watcher has ended (the load in progress finished), and no load starts afterwards."""
    from serving.local.repository import ModelRepository

    loading, release, loads = threading.Event(), threading.Event(), []

    def slow(path, version):
        loads.append(version)
        loading.set()
        release.wait(10)
        raise ValueError("not a model")

    base = str(tmp_path)
    repository = ModelRepository(base, "m", poll_seconds=0.05, loader=slow)
    repository.start()  # nothing to load yet: the watcher polls
    _fake_version(base, "1")
    assert loading.wait(10)  # the watcher is inside the load of version 1
    threading.Timer(0.3, release.set).start()
    assert repository.stop() is True  # returned only after the load in progress ended
    assert release.is_set() and not repository.watching
    _fake_version(base, "2")
    time.sleep(0.3)
    assert loads == [1]


def test_stop_gives_up_after_its_timeout_on_a_scan_that_does_not_end(tmp_path):
    """A load that hangs: `stop(timeout)` returns False after the timeout, True once the
    watcher has ended."""
    from serving.local.repository import ModelRepository

    loading, release = threading.Event(), threading.Event()

    def stuck(path, version):
        loading.set()
        release.wait(10)
        raise ValueError("not a model")

    base = str(tmp_path)
    repository = ModelRepository(base, "m", poll_seconds=0.05, loader=stuck)
    repository.start()
    _fake_version(base, "1")
    assert loading.wait(10)
    started = time.monotonic()
    assert repository.stop(timeout=0.2) is False  # still loading: it says so
    assert 0.2 <= time.monotonic() - started < 2 and repository.watching
    release.set()
    assert repository.stop(timeout=limit(10)) is True and not repository.watching


def test_version_policies_check_only_their_own_fields_and_describe_themselves():
    from serving.local.repository import VersionPolicy

    assert VersionPolicy().describe() == "latest 1"
    assert VersionPolicy("latest", num_versions=2).describe() == "latest 2"
    assert VersionPolicy("specific", versions=(3, 1)).describe() == "specific 1, 3"
    assert VersionPolicy("all").describe() == "all"
    # `num_versions` counts only for `latest`: the other kinds take any.
    assert VersionPolicy("all", num_versions=0).describe() == "all"
    assert VersionPolicy("specific", num_versions=0, versions=(2,)).describe() == "specific 2"
    with pytest.raises(ValueError, match=r"argument `num_versions`, expected at least 1, got 0"):
        VersionPolicy("latest", num_versions=0)
    with pytest.raises(ValueError, match=r"argument `kind`, expected latest, specific or all"):
        VersionPolicy("LATEST")


def test_a_specific_policy_serves_its_versions_below_the_highest(tmp_path):
    from serving.local.repository import ModelRepository, VersionPolicy

    for version in ("1", "2", "3"):
        _fake_version(str(tmp_path), version)
    loaded = []

    def loader(path, version):
        loaded.append(version)
        return _FakeServable(path, version)

    specific = VersionPolicy("specific", versions=(1,))
    repository = ModelRepository(str(tmp_path), "m", loader=loader, policy=specific)
    repository.refresh()
    assert repository.served_versions == [1] and loaded == [1]
    latest = ModelRepository(str(tmp_path), "m", loader=loader, policy=VersionPolicy())
    loaded.clear()
    latest.refresh()
    assert latest.served_versions == [3] and loaded == [3]  # lower versions are not loaded


def test_a_version_replaced_by_a_higher_one_is_logged_as_no_longer_served(tmp_path, caplog):
    from serving.local.repository import ModelRepository

    _fake_version(str(tmp_path), "1")
    repository = ModelRepository(str(tmp_path), "m", loader=_FakeServable)
    repository.refresh()
    _fake_version(str(tmp_path), "2")
    with caplog.at_level("INFO", logger="serving"):
        repository.refresh()
    assert [r.getMessage() for r in caplog.records] == [
        "Serving version 2 of model m",
        "Version 1 of model m is no longer served",
    ]


def test_a_base_path_linked_into_its_own_folder_is_hidden_whole(tmp_path):
    """`models/current -> models`: its real path is the start of its own spelling, so the
    longer spelling is replaced first and a message shows no leftover of it."""
    from serving.local.repository import BASE_PATH_SHOWN, ModelRepository

    models = tmp_path / "models"
    models.mkdir()
    (models / "current").symlink_to(models, target_is_directory=True)
    repository = ModelRepository(str(models / "current"), "m", loader=_FakeServable)
    text = f"cannot read {models / 'current' / '1'} nor {models / '2'}"
    assert repository.hide_paths(text) == (
        f"cannot read {BASE_PATH_SHOWN}/1 nor {BASE_PATH_SHOWN}/2"
    )


def test_the_status_of_a_version_below_the_served_one_is_its_own(tmp_path):
    from serving.local.repository import ModelRepository

    for version in ("1", "2", "3"):
        _fake_version(str(tmp_path), version)
    repository = ModelRepository(str(tmp_path), "m", loader=_FakeServable)
    repository.refresh()
    entries = [repository.status("m", v)["model_version_status"] for v in ("1", "2", "3")]
    assert [[(e["version"], e["state"]) for e in each] for each in entries] == [
        [("1", "END")], [("2", "END")], [("3", "AVAILABLE")]
    ]


def test_stop_before_any_watch_has_nothing_to_wait_for(tmp_path):
    from serving.local.repository import ModelRepository

    repository = ModelRepository(str(tmp_path), "m", loader=_FakeServable)
    assert repository.stop(timeout=0.1) is True
    assert not repository.watching


def test_a_relative_base_path_is_hidden_in_its_absolute_spelling_too(tmp_path, monkeypatch):
    from serving.local.repository import BASE_PATH_SHOWN, ModelRepository

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    repository = ModelRepository("m", "m", loader=_FakeServable)
    text = f"cannot read {tmp_path / 'm' / '1' / 'saved_model.pb'}, nor m/2 under m."
    assert repository.hide_paths(text) == (
        f"cannot read {BASE_PATH_SHOWN}/1/saved_model.pb, nor {BASE_PATH_SHOWN}/2 under "
        f"{BASE_PATH_SHOWN}."
    )
    # Only whole paths: the same letters inside words or other folders' names stay.
    assert repository.hide_paths("a model in mm/ or m.pb or x/m") == "a model in mm/ or m.pb or x/m"
