"""The versions of one exported model on disk, loaded as TensorFlow Serving's version
policies say.

`ModelRepository` serves the versions under its base path (version folder
names follow `serving.names`) that its `VersionPolicy` asks for: by default the
highest one that loads (`latest`), or the N highest that load, given ones
(`specific`) or every one (`all`). It retries versions that failed to load
(with back-off, at once when their files change), falls back to the next lower
version when a served one is deleted (`latest`), and keeps watching through any
error.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from serving.local.payload import RequestError
from serving.local.servable import Servable, error_status
from serving.names import parse_version

log = logging.getLogger(__name__)

MAX_RETRY_SECONDS = 30.0
#: Seconds between scans of a base path for versions: TensorFlow Serving's default
#: `--file_system_poll_wait_seconds`.
POLL_SECONDS = 1.0
#: Loads tried again after a version's first failure while its files stay the same, as
#: TensorFlow Serving's `--max_num_load_retries` (a changed copy is tried anew).
MAX_LOAD_RETRIES = 5
#: How answers to clients write the base path (the server's logs give it in full).
BASE_PATH_SHOWN = "<base_path>"
# A path inside a message: not preceded or followed by a character a path name goes on with.
_PATH_EDGES = r"(?<![\w./~-]){}(?![\w~-]|\.\w)"


def _other_format(path: str) -> str:
    """What a version folder without a SavedModel holds instead, said to the user who
    pointed a server at it."""
    try:
        files = os.listdir(path)
    except OSError:
        return ""
    for kind, found in (("a LiteRT model", [f for f in files if f.endswith(".tflite")]),
                        ("an ONNX model", [f for f in files if f.endswith(".onnx")])):  # fmt: skip
        if found:
            return f": it holds {kind} ({', '.join(sorted(found))}), which is not served here"
    return ""


class _Failure:
    """A version that failed to load: when to try again, the files it had, why it failed."""

    def __init__(self, fingerprint, delay, code, message, attempts):
        self.attempts = attempts  # loads of these files that failed
        self.fingerprint = fingerprint
        self.delay = delay
        self.retry_at = time.monotonic() + delay
        self.code, self.message = code, message


def _fingerprint(path):
    """Names, sizes and mtimes of the files under `path`: a changed copy retries at once."""
    found = []
    for root, _, files in os.walk(path):
        for name in files:
            try:
                stat = os.stat(os.path.join(root, name))
            except OSError:
                continue
            found.append((os.path.join(root, name), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(found))


def base_path_problem(base_path: str) -> str | None:
    """Why `base_path` cannot hold versions (it is a version folder itself), or None."""
    if os.path.isfile(os.path.join(base_path, "saved_model.pb")):
        return (
            f"{base_path!r} holds a saved_model.pb itself: it is a version folder, the base "
            "path is its parent (versions are numbered sub-folders)"
        )
    return None


def no_versions_message(name: str, base_path: str) -> str:
    """TF Serving's words for a base path without versions."""
    message = f"No versions of servable {name} found under base path {base_path}"
    return f"{message} ({base_path_problem(base_path) or 'version folders are numbered: 1/, 2/'})"


#: Seconds `ModelRepository.stop` waits for a scan in progress (loading a version).
STOP_TIMEOUT_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class VersionPolicy:
    """TensorFlow Serving's `model_version_policy`: which versions of a model are served.

    Args:
        kind: `"latest"` (the `num_versions` highest versions that load; a version
            that fails to load gives its place to the next lower one), `"specific"`
            (the `versions` listed, each that loads) or `"all"` (every version).
        num_versions: How many versions `latest` serves (at least 1).
        versions: The versions `specific` serves (at least one).
    """

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("latest", "specific", "all"):
            raise ValueError(f"Received an invalid value for argument `kind`, expected "
                             f"latest, specific or all, got {self.kind!r}.")  # fmt: skip
        if self.kind == "latest" and self.num_versions < 1:
            raise ValueError(f"Received an invalid value for argument `num_versions`, expected "
                             f"at least 1, got {self.num_versions}.")  # fmt: skip
        if self.kind == "specific" and not self.versions:
            raise ValueError("Received an invalid value for argument `versions`, expected "
                             "at least one version, got ().")  # fmt: skip

    def wants(self, version: int, kept: int) -> bool:
        """Whether `version` should be served, with `kept` higher ones served already."""
        if self.kind == "latest":
            return kept < self.num_versions
        return self.kind == "all" or version in self.versions

    def describe(self) -> str:
        """The policy as its proto's text reads: `latest 2`, `specific 1, 3`, `all`."""
        if self.kind == "latest":
            return f"latest {self.num_versions}"
        if self.kind == "specific":
            return "specific " + ", ".join(map(str, sorted(self.versions)))
        return "all"


class ModelRepository:
    """The versions of one model under a base path, served as `policy` says (by default
    the highest loadable one).

    Every version folder is reported by `status` with its state: AVAILABLE (served),
    END with an error (failed to load, no saved_model.pb, two folders naming one
    version) or END (not served: an older version, or one the policy leaves out).

    Args:
        base_path: Folder with one numbered sub-folder per version (`serving.names`).
        name: The model name in URLs.
        poll_seconds: Seconds between scans of `base_path`.
        loader: `loader(path, version)` returns a servable (tests swap it).
        policy: Which versions to serve (`VersionPolicy`; default: the latest one).
        max_load_retries: Loads tried again after a version fails to load, with
            back-off, while its files stay the same; then it is left failed until
            they change (a deterministic failure, a warmup the export refuses, is
            not retried forever).
    """

    def __init__(
        self,
        base_path: str,
        name: str,
        poll_seconds: float = POLL_SECONDS,
        loader: Callable[[str, int], Any] = Servable,
        policy: VersionPolicy | None = None,
        max_load_retries: int = MAX_LOAD_RETRIES,
    ):
        self.base_path = base_path
        self.max_load_retries = max_load_retries
        self.name = name
        self.poll_seconds = poll_seconds
        self.policy = policy if policy is not None else VersionPolicy()
        self._loader = loader
        self._served: dict[int, Any] = {}  # version -> servable, highest first
        self._failed: dict[int, Any] = {}  # version -> _Failure
        # version -> (error_code, error_message) of folders not loadable
        self._listing: dict[int, tuple[str, str]] = {}
        self._scanned = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error: str | None = None

    def scan(self) -> tuple[dict[int, str], dict[int, tuple[str, str]]]:
        """`({version: folder} loadable, highest first; {version: (code, message)} broken)`.

        A folder is a version when `serving.names.parse_version` reads its name.
        Broken: no saved_model.pb, or two folders naming one version. OSError if
        the base path is unreadable.
        """
        folders: dict[int, list[str]] = {}
        with os.scandir(self.base_path) as entries:
            for entry in entries:
                version = parse_version(entry.name)
                if version is not None and entry.is_dir():
                    folders.setdefault(version, []).append(entry.name)
        loadable, broken = {}, {}
        for version in sorted(folders, reverse=True):
            names = sorted(folders[version])
            path = os.path.join(self.base_path, names[0])
            if len(names) > 1:
                broken[version] = (
                    "FAILED_PRECONDITION",
                    f"Folders {' and '.join(map(repr, names))} both name version {version}; "
                    "remove or rename one",
                )
            elif not os.path.isfile(os.path.join(path, "saved_model.pb")):
                broken[version] = ("NOT_FOUND", f"No saved_model.pb in version folder "
                                   f"{names[0]}{_other_format(path)}")  # fmt: skip
            else:
                loadable[version] = names[0]
        return loadable, broken

    def refresh(self) -> None:
        """One scan: serve the versions the policy asks for that load (for `latest`, the
        highest ones; a served version is kept, not loaded again)."""
        loadable, broken = self.scan()
        self._failed = {v: f for v, f in self._failed.items() if v in loadable}
        served = self._served
        if not loadable and not broken and (self._listing or not self._scanned):
            log.warning(no_versions_message(self.name, self.base_path))
        for version, (_, message) in broken.items():
            if self._listing.get(version) != broken[version]:  # logged once, not every scan
                log.error("Version %s of %s is not loaded: %s", version, self.name, message)
        kept: dict[int, Any] = {}
        for version, folder in loadable.items():  # highest first
            if not self.policy.wants(version, len(kept)):
                if self.policy.kind == "latest":
                    break  # enough: lower versions are not loaded
                continue
            servable = served.get(version) or self._try_load(version, folder)
            if servable is not None:
                kept[version] = servable
        listing = dict(broken)
        for version in loadable:
            failure = self._failed.get(version)
            listing[version] = (failure.code, failure.message) if failure else ("OK", "")
        with self._lock:
            self._listing = dict(sorted(listing.items(), reverse=True))
            self._scanned = True
        if kept.keys() != served.keys():
            if served and not kept:
                log.warning("Version %s of %s is gone and no other loads",
                            ", ".join(map(str, served)), self.name)  # fmt: skip
            self._set_served(kept)

    def _try_load(self, version, folder):
        path = os.path.join(self.base_path, folder)
        failure = self._failed.get(version)
        fingerprint = _fingerprint(path)
        same = failure if failure is not None and failure.fingerprint == fingerprint else None
        if same and (same.attempts > self.max_load_retries
                     or time.monotonic() < same.retry_at):  # fmt: skip
            return None
        try:
            servable = self._loader(path, version)
        except Exception as error:  # a broken or half-copied export must not stop serving
            delay = min(2 * failure.delay, MAX_RETRY_SECONDS) if failure else self.poll_seconds
            code, message = error_status(error)
            attempts = same.attempts + 1 if same else 1
            self._failed[version] = _Failure(fingerprint, delay, code, message, attempts)
            retry = ("retried" if attempts <= self.max_load_retries
                     else f"failed {attempts} times: tried again when its files change")
            log.error("Could not load version %s of %s (%s): %s", version, self.name, retry,
                      error)  # fmt: skip
            return None
        self._failed.pop(version, None)
        return servable

    def _set_served(self, kept):
        with self._lock:
            before, self._served = self._served, kept
        for version in kept:
            if version not in before:
                log.info("Serving version %s of model %s", version, self.name)
        for version in before:
            if version not in kept and kept:
                log.info("Version %s of model %s is no longer served", version, self.name)

    def set_policy(self, policy: VersionPolicy) -> None:
        """Serve as `policy` says from the next scan on."""
        self.policy = policy

    @property
    def served_versions(self) -> list[int]:
        """The versions served now, highest first."""
        with self._lock:
            return list(self._served)

    def start(self) -> None:
        """Load the highest version now and keep watching in a daemon thread."""
        self._refresh_logged()
        thread = threading.Thread(target=self._watch, name="version-watcher", daemon=True)
        self._thread = thread
        thread.start()

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> bool:
        """Stop watching for new versions; returns whether the watcher has ended.

        Waits (up to `timeout` seconds) for a scan in progress to finish, so that no
        version loads after the server that owns the repository has closed.
        """
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        return not self.watching

    def _watch(self):
        while not self._stop.wait(self.poll_seconds):
            self._refresh_logged()

    def _refresh_logged(self):
        """`refresh`, logging any error (once per distinct message) instead of dying."""
        try:
            self.refresh()
        except Exception as error:  # the watcher must outlive any scan error
            message = f"{type(error).__name__}: {error}"
            level = logging.DEBUG if message == self._last_error else logging.ERROR
            log.log(level, "Scan of %s failed, still serving: %s", self.base_path, message)
            self._last_error = message
        else:
            self._last_error = None

    @property
    def watching(self) -> bool:
        """Whether the watcher thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def _check_name(self, name: str, request: str) -> None:
        if name != self.name:
            raise RequestError(HTTPStatus.NOT_FOUND, f"Servable not found for request: {request}")

    def _why_unavailable(self, version: int | None = None, served: Any = None) -> str:
        """Why nothing (or not `version`, while `served` are) is served: for 404 messages."""
        with self._lock:
            listing = self._listing
        if self._last_error and not listing:
            return f"cannot read the model's base path: {self.hide_paths(self._last_error)}"
        if not listing:
            return no_versions_message(self.name, BASE_PATH_SHOWN)
        if version is not None:
            if version not in listing:
                return f"no version folder {version} under the model's base path"
            code, message = listing[version]
            if code != "OK":
                return f"version {version} is not loaded: {code}: {self.hide_paths(message)}"
            if self.policy.kind != "latest" or self.policy.num_versions > 1:
                return (f"version {version} is not loaded: the served versions are {served} "
                        f"(policy {self.policy.describe()})")  # fmt: skip
            return f"version {version} is not loaded: the served version is {served}"
        code, message = next(iter(listing.values()))
        return f"no version loads; the highest: {code}: {self.hide_paths(message)}"

    def hide_paths(self, text: str) -> str:
        """`text` with the base path on disk written as `<base_path>`: clients see no paths."""
        paths = {self.base_path, os.path.abspath(self.base_path), os.path.realpath(self.base_path)}
        for path in sorted(paths, key=len, reverse=True):
            # Whole paths only: a relative base path such as `m` is no letter of other words.
            whole = _PATH_EDGES.format(re.escape(path.rstrip(os.sep) or path))
            text = re.sub(whole, lambda _: BASE_PATH_SHOWN, text)
        return text

    def serves(self, name: str) -> bool:
        """Whether `name` is this model's."""
        return name == self.name

    def status(self, name: str, version: str | None = None, label: str | None = None) -> dict:
        """The `GET /v1/models/NAME[/versions/V]` body: every version folder, highest first.

        Raises:
            RequestError: 404 for another model, an unknown version or no version folders;
                400 for a `label` (a model alone has none: `serving.local.model_config`).
        """
        request = f"Latest({name})" if version is None else f"Specific({name}, {version})"
        self._check_name(name, request)
        _no_label(label)
        number = None if version is None else parse_version(version)
        with self._lock:
            listing, served = self._listing, self._served
        if version is not None and number not in listing:
            raise RequestError(
                HTTPStatus.NOT_FOUND, f"Could not find version {version} of model {name}"
            )
        if not listing:
            raise RequestError(HTTPStatus.NOT_FOUND, self._why_unavailable())
        entries = []
        for each, (code, message) in listing.items():
            if version is not None and each != number:
                continue
            entries.append({
                "version": str(each),
                "state": "AVAILABLE" if each in served else "END",
                "status": {"error_code": code, "error_message": self.hide_paths(message)},
            })  # fmt: skip
        return {"model_version_status": entries}

    def get(self, name: str, version: str | None = None, label: str | None = None) -> Any:
        """The servable for `name` and optional `version` string, or a 404 `RequestError`
        (400 for a `label`: a model alone has none)."""
        self._check_name(name, f"Latest({name})")
        _no_label(label)
        with self._lock:
            served = self._served
        if not served:
            raise RequestError(
                HTTPStatus.NOT_FOUND,
                f"Servable not found for request: Latest({name}): {self._why_unavailable()}",
            )
        if version is None:
            return served[max(served)]
        number = parse_version(version)
        if number not in served:
            shown = ", ".join(map(str, served))
            why = "not a version" if number is None else self._why_unavailable(number, shown)
            raise RequestError(
                HTTPStatus.NOT_FOUND,
                f"Servable not found for request: Specific({name}, {version}): {why}",
            )
        return served[number]


def _no_label(label: str | None) -> None:
    if label is not None:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"Unrecognized servable version label: {label}")
