"""`serving.repository`: TensorFlow Serving's `latest` policy and a watcher that never dies."""

import os
import shutil
import time

import pytest

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
    from serving.payload import RestError

    try:
        return repository.get(repository.name).version
    except RestError:
        return None


def test_latest_policy_retries_rolls_back_and_ignores_non_ascii_digits(tmp_path):
    """The highest loadable version; a half-copied one retried; deletions roll back."""
    from serving.repository import ModelRepository

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

    from serving.repository import ModelRepository

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
        deadline = time.monotonic() + 10
        while _served(repository) != 5:
            assert time.monotonic() < deadline, "version 5 was not loaded"
            time.sleep(0.02)
    finally:
        repository.stop()


def test_an_empty_base_path_says_how_versions_are_laid_out_and_a_version_folder_says_so(tmp_path):
    from serving.repository import no_versions_message

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
