"""The versions of one exported model on disk, loaded with TensorFlow Serving's `latest` policy.

`ModelRepository` serves the highest version under its base path that loads,
retries versions that failed to load (with back-off, at once when their files
change), falls back to the next lower version when the served one is deleted,
and keeps watching through any error.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from apputil.quiet import import_tensorflow
from serving.payload import RestError

log = logging.getLogger("serving.server")

# ASCII digits only: str.isdigit() accepts "²" and other digits int() may reject.
VERSION_NAME = re.compile(r"[0-9]{1,18}")
MAX_RETRY_SECONDS = 30.0


class Servable:
    """One loaded SavedModel version: its signatures and its metadata JSON.

    Args:
        path: The version folder (holding `saved_model.pb`).
        version: Integer version number.
    """

    def __init__(self, path: str, version: int):
        # Heavy, and needed only here: routing and HTTP run without TensorFlow.
        tf = import_tensorflow()
        from google.protobuf import json_format
        from tensorflow.core.protobuf import saved_model_pb2

        self.version = version
        self._module = tf.saved_model.load(path)  # kept alive: signatures reference it
        self.signatures = dict(self._module.signatures)
        proto = saved_model_pb2.SavedModel()
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            proto.ParseFromString(f.read())
        # TensorFlow Serving prints the SignatureDefMap proto with field names kept
        # and default values included; so do we.
        self.signature_def = {
            "signature_def": {
                key: json_format.MessageToDict(
                    value,
                    always_print_fields_with_no_presence=True,
                    preserving_proto_field_name=True,
                )
                for key, value in proto.meta_graphs[0].signature_def.items()
            }
        }
        self.max_rank = max(
            (spec.shape.rank or 0 for fn in self.signatures.values() for spec in _specs(fn)),
            default=0,
        )

    def input_specs(self, signature_name: str) -> dict[str, Any]:
        """`{name: tf.TensorSpec}` of a signature's inputs, or a 400 `RestError`."""
        if signature_name not in self.signatures:
            raise RestError(
                HTTPStatus.BAD_REQUEST,
                f'Serving signature name: "{signature_name}" not found in signature def',
            )
        return self.signatures[signature_name].structured_input_signature[1]


def _specs(function):
    return function.structured_input_signature[1].values()


class _Failure:
    """A version that failed to load: when to try again, and the files it had."""

    def __init__(self, fingerprint, delay):
        self.fingerprint = fingerprint
        self.delay = delay
        self.retry_at = time.monotonic() + delay


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


class ModelRepository:
    """The versions of one model under a base path; the highest loadable one is served.

    Args:
        base_path: Folder with one sub-folder of ASCII digits per version.
        name: The model name in URLs.
        poll_seconds: Seconds between scans of `base_path`.
        loader: `loader(path, version)` returns a servable (tests swap it).
    """

    def __init__(
        self,
        base_path: str,
        name: str,
        poll_seconds: float = 1.0,
        loader: Callable[[str, int], Any] = Servable,
    ):
        self.base_path = base_path
        self.name = name
        self.poll_seconds = poll_seconds
        self._loader = loader
        self._current = None
        self._failed = {}  # version -> _Failure
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._last_error = None

    def versions_on_disk(self) -> list[int]:
        """Version numbers with a `saved_model.pb`, highest first; OSError if unreadable."""
        found = []
        with os.scandir(self.base_path) as entries:
            for entry in entries:
                if VERSION_NAME.fullmatch(entry.name) and os.path.isfile(
                    os.path.join(entry.path, "saved_model.pb")
                ):
                    found.append(int(entry.name))
        return sorted(found, reverse=True)

    def refresh(self) -> None:
        """One scan: serve the highest version that loads, as TF Serving's `latest` does."""
        versions = self.versions_on_disk()
        self._failed = {v: f for v, f in self._failed.items() if v in versions}
        current = self._current
        for version in versions:
            if current is not None and version == current.version:
                return  # nothing higher loaded: keep serving it
            servable = self._try_load(version)
            if servable is not None:
                self._set_current(servable)
                return
        if current is not None:
            log.warning("Version %s of %s is gone and no other loads", current.version, self.name)
            self._set_current(None)

    def _try_load(self, version):
        path = os.path.join(self.base_path, str(version))
        failure = self._failed.get(version)
        fingerprint = _fingerprint(path)
        if failure and failure.fingerprint == fingerprint and time.monotonic() < failure.retry_at:
            return None
        try:
            servable = self._loader(path, version)
        except Exception as error:  # a broken or half-copied export must not stop serving
            delay = min(2 * failure.delay, MAX_RETRY_SECONDS) if failure else self.poll_seconds
            self._failed[version] = _Failure(fingerprint, delay)
            log.error("Could not load version %s of %s (retried): %s", version, self.name, error)
            return None
        self._failed.pop(version, None)
        return servable

    def _set_current(self, servable):
        with self._lock:
            self._current = servable
        if servable is not None:
            log.info("Serving version %s of model %s", servable.version, self.name)

    def start(self) -> None:
        """Load the highest version now and keep watching in a daemon thread."""
        self._refresh_logged()
        self._thread = threading.Thread(target=self._watch, name="version-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching for new versions."""
        self._stop.set()

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

    def get(self, name: str, version: str | None = None) -> Any:
        """The servable for `name` and optional `version` string, or a 404 `RestError`."""
        if name != self.name:
            raise RestError(HTTPStatus.NOT_FOUND, f"Servable not found for request: Latest({name})")
        with self._lock:
            current = self._current
        if current is None:
            raise RestError(HTTPStatus.NOT_FOUND, f"Servable not found for request: Latest({name})")
        if version is not None and (
            not VERSION_NAME.fullmatch(version) or int(version) != current.version
        ):
            raise RestError(
                HTTPStatus.NOT_FOUND,
                f"Servable not found for request: Specific({name}, {version})",
            )
        return current
