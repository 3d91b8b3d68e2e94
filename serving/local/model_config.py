"""Several models in one server: TensorFlow Serving's model config file and version labels.

    model_config_list {
      config {
        name: "antisym"
        base_path: "models/antisym"
        model_platform: "tensorflow"
        model_version_policy { specific { versions: 1 versions: 2 } }
        version_labels { key: "stable" value: 1 }
        version_labels { key: "canary" value: 2 }
      }
    }

`read_model_config` reads that file (a `ModelServerConfig` in protobuf's text
format, as `--model_config_file` takes it; `serving/models.config` is one) into
checked `ModelConfig`s. `Models` serves them: one `ModelRepository` per model,
each with its version policy, and the labels, which name served versions
(`/v1/models/NAME/labels/LABEL`, gRPC's `version_label`). `watch` re-reads the
file on an interval as TensorFlow Serving's `--model_config_file_poll_wait_seconds`
does: models added are loaded, models removed are unloaded, changed policies and
labels take effect; a file that does not parse or check keeps the previous
config and logs one line.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import stat
import threading
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any

from serving.local.payload import RequestError, bad_request
from serving.local.repository import (
    POLL_SECONDS,
    STOP_TIMEOUT_SECONDS,
    ModelRepository,
    Servable,
    VersionPolicy,
    base_path_problem,
)
from serving.names import MAX_VERSION, check_model_name

log = logging.getLogger(__name__)


class ModelConfigError(ValueError):
    """A model config file that cannot be served: one line naming the file and the fault."""


class LabelsNotApplied(ModelConfigError):
    """A config whose models were applied but one of whose labels names a version that is
    not served (yet: it may still be loading)."""


#: The largest model config file read (TensorFlow Serving's are a few KB): a file past it,
#: or one that is not a regular file (a FIFO, a device), is refused without reading it.
MAX_CONFIG_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """One model of a config file: its name, base path, version policy and labels."""

    name: str
    base_path: str
    policy: VersionPolicy = VersionPolicy()
    labels: Mapping[str, int] = dataclasses.field(default_factory=dict)


def parse_model_config(text: str, where: str = "the model config") -> list[ModelConfig]:
    """The models of a `ModelServerConfig` in text format, checked.

    Raises:
        ModelConfigError: the text does not parse, or a model has no or a duplicate
            name, a name or label a URL cannot reach, no base path or a version folder
            as its base path, a platform other than `tensorflow`, an empty `specific`
            policy, or a label of a version its `specific` policy does not serve.
    """
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    proto = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, proto)
    except text_format.ParseError as error:
        raise ModelConfigError(f"{where} does not parse: {error}") from None
    if proto.WhichOneof("config") != "model_config_list":
        raise ModelConfigError(f"{where} has no model_config_list (the only kind served)")
    models: list[ModelConfig] = []
    for index, entry in enumerate(proto.model_config_list.config):
        models.append(_model(entry, f"{where}, model {index + 1}"))
    names = [model.name for model in models]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ModelConfigError(f"{where} names model {duplicates[0]!r} more than once")
    if not models:
        raise ModelConfigError(f"{where} lists no model")
    return models


def _model(entry: Any, where: str) -> ModelConfig:
    try:
        check_model_name(entry.name, "name")
    except ValueError as error:
        raise ModelConfigError(f"{where}: {error}") from None
    where = f"{where} ({entry.name})"
    if not entry.base_path:
        raise ModelConfigError(f"{where} has no base_path")
    problem = base_path_problem(entry.base_path)
    if problem:
        raise ModelConfigError(f"{where}: base_path {problem}")
    if entry.model_platform not in ("", "tensorflow"):
        raise ModelConfigError(
            f"{where} has model_platform {entry.model_platform!r}; only tensorflow is served"
        )
    policy = _policy(entry.model_version_policy, where)
    labels = dict(entry.version_labels)
    for label, version in sorted(labels.items()):
        try:
            check_model_name(label, "label")
        except ValueError:
            raise ModelConfigError(
                f"{where} has label {label!r}, which /v1/models/NAME/labels/LABEL cannot reach"
            ) from None
        if not 0 <= version <= MAX_VERSION:
            raise ModelConfigError(f"{where} labels version {version} {label!r}: not a version")
        if policy.kind == "specific" and version not in policy.versions:
            raise ModelConfigError(
                f"{where} labels version {version} {label!r}, which its policy "
                f"({policy.describe()}) does not serve"
            )
    return ModelConfig(entry.name, entry.base_path, policy, labels)


def _policy(proto: Any, where: str) -> VersionPolicy:
    kind = proto.WhichOneof("policy_choice")
    if kind == "specific":
        versions = tuple(sorted(set(proto.specific.versions)))
        if not versions:
            raise ModelConfigError(f"{where} has a specific version policy without versions")
        return VersionPolicy("specific", versions=versions)
    if kind == "all":
        return VersionPolicy("all")
    # `latest` without num_versions serves one version, as TensorFlow Serving's does.
    return VersionPolicy("latest", max(1, proto.latest.num_versions) if kind else 1)


def read_model_config(path: str) -> list[ModelConfig]:
    """`parse_model_config` of the file at `path`; `ModelConfigError` when unreadable, not
    a regular file, or over `MAX_CONFIG_BYTES` (checked before reading: a FIFO would
    block and a device never end)."""
    try:
        # O_NONBLOCK: opening a FIFO without a writer returns at once, to be refused.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise ModelConfigError(f"cannot read the model config {path!r}: {error}") from None
    with os.fdopen(descriptor, "rb") as handle:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise ModelConfigError(f"the model config {path!r} is not a regular file")
        try:
            data = handle.read(MAX_CONFIG_BYTES + 1)
        except OSError as error:
            raise ModelConfigError(f"cannot read the model config {path!r}: {error}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ModelConfigError(
            f"the model config {path!r} is larger than {MAX_CONFIG_BYTES:,} bytes"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ModelConfigError(f"cannot read the model config {path!r}: {error}") from None
    return parse_model_config(text, f"the model config {path!r}")


class Models:
    """The models a server serves: a `ModelRepository` per model, and their labels.

    Answers as one `ModelRepository` does (`get`, `status`), for every model, with
    labels: `get(name, label="stable")` is the labelled version. A label must name a
    version being served when its config is applied (as in TensorFlow Serving).

    Args:
        configs: The models (`ModelConfig`s, or `read_model_config`'s).
        poll_seconds: Seconds between scans of each base path for versions.
        loader: `loader(path, version)` returns a servable (tests swap it).
    """

    def __init__(
        self,
        configs: list[ModelConfig],
        poll_seconds: float = POLL_SECONDS,
        loader: Callable[[str, int], Any] = Servable,
    ):
        self.poll_seconds = poll_seconds
        self._loader = loader
        self._lock = threading.Lock()
        self._repositories: dict[str, ModelRepository] = {}
        self._labels: dict[str, dict[str, int]] = {}
        self._pending = list(configs)
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._config_seen: tuple[int, int, int] | None = None
        self._config_refused: tuple[int, int, int] | None = None  # said once per stamp

    @classmethod
    def from_file(
        cls,
        path: str,
        poll_seconds: float = POLL_SECONDS,
        loader: Callable[[str, int], Any] = Servable,
    ) -> Models:
        """The models of the config file at `path` (`read_model_config`); `reread(path)`
        applies the file again once it changes."""
        seen = _stamp(path)
        models = cls(read_model_config(path), poll_seconds, loader)
        models._config_seen = seen
        return models

    @property
    def names(self) -> list[str]:
        """The names of the models served, in the config's order."""
        with self._lock:
            return list(self._repositories)

    def repository(self, name: str) -> ModelRepository:
        """The repository of model `name` (KeyError for another)."""
        with self._lock:
            return self._repositories[name]

    def start(self) -> None:
        """Load every model now (each logs what it serves) and keep watching their versions.

        Raises:
            ModelConfigError: a label names a version that did not load.
        """
        configs, self._pending = self._pending, []
        self.apply(configs)

    def apply(self, configs: list[ModelConfig]) -> None:
        """Serve `configs` from now on: new models are loaded (now), removed ones are
        stopped, the others take their new policy (at their next scan) and labels.

        Raises:
            LabelsNotApplied: a label names a version that is not served (the models
                are applied, that model's labels are not).
        """
        wanted = {config.name: config for config in configs}
        with self._lock:
            gone = [name for name in self._repositories if name not in wanted]
            current = dict(self._repositories)
        for name in gone:
            log.info("Model %s is no longer in the config: unloading it", name)
            with self._lock:
                removed = self._repositories.pop(name)
                self._labels.pop(name, None)
            removed.stop()
        for name, config in wanted.items():
            repository: ModelRepository | None = current.get(name)
            if repository is not None and repository.base_path != config.base_path:
                repository.stop()  # another folder: another model under the same name
                repository = None
            if repository is None:
                repository = ModelRepository(config.base_path, name, self.poll_seconds,
                                             self._loader, config.policy)  # fmt: skip
                repository.start()
            elif repository.policy != config.policy:
                repository.set_policy(config.policy)
                repository.refresh()
            with self._lock:
                self._repositories[name] = repository
        problems = []
        for name, config in wanted.items():
            served = set(self.repository(name).served_versions)
            missing = {label: v for label, v in config.labels.items() if v not in served}
            if missing:
                label, version = sorted(missing.items())[0]
                problems.append(
                    f"label {label!r} of model {name} names version {version}, which is not "
                    f"served (served: {', '.join(map(str, sorted(served))) or 'none'})"
                )
                continue
            with self._lock:
                self._labels[name] = dict(config.labels)
        if problems:
            raise LabelsNotApplied("; ".join(problems))

    def _model(self, name: str, request: str) -> ModelRepository:
        with self._lock:
            repository = self._repositories.get(name)
        if repository is None:
            raise RequestError(HTTPStatus.NOT_FOUND, f"Servable not found for request: {request}")
        return repository

    def _version_of(self, name: str, label: str) -> str:
        with self._lock:
            version = self._labels.get(name, {}).get(label)
        if version is None:
            raise bad_request(f"Unrecognized servable version label: {label}")
        return str(version)

    def get(self, name: str, version: str | None = None, label: str | None = None) -> Any:
        """The servable of model `name`: its highest served version, `version`, or the
        version `label` names; a 404 (400 for an unknown label) `RequestError` otherwise."""
        repository = self._model(name, f"Latest({name})")
        if label is not None:
            version = self._version_of(name, label)
        return repository.get(name, version)

    def serves(self, name: str) -> bool:
        """Whether `name` is a model of the config in effect."""
        with self._lock:
            return name in self._repositories

    def status(self, name: str, version: str | None = None, label: str | None = None) -> dict:
        """The `GET /v1/models/NAME[/versions/V | /labels/L]` body of model `name`."""
        request = f"Latest({name})" if version is None else f"Specific({name}, {version})"
        repository = self._model(name, request)
        if label is not None:
            version = self._version_of(name, label)
        return repository.status(name, version)

    def labels(self, name: str) -> dict[str, int]:
        """`{label: version}` of model `name` (empty for a model without labels)."""
        with self._lock:
            return dict(self._labels.get(name, {}))

    def watch(self, path: str, poll_seconds: float) -> None:
        """Re-read the config file at `path` every `poll_seconds` in a daemon thread and
        apply it when it changed; a bad file keeps the previous config (one log line)."""
        thread = threading.Thread(target=self._watch, args=(path, poll_seconds),
                                  name="model-config-watcher", daemon=True)  # fmt: skip
        self._watcher = thread
        thread.start()

    def _watch(self, path: str, poll_seconds: float) -> None:
        while not self._stop.wait(poll_seconds):
            self.reread(path)

    def reread(self, path: str) -> bool:
        """Apply the file at `path` if it changed since it was last applied; whether it was
        applied now.

        A file that was refused is tried again at every call until it applies or
        changes: a label may name a version that is still loading (export, then
        move the label). Each refusal is logged once per version of the file.
        """
        stamp = _stamp(path)
        if stamp == self._config_seen:
            return False
        first = stamp != self._config_refused
        self._config_refused = stamp
        try:
            configs = read_model_config(path)
            self.apply(configs)
        except LabelsNotApplied as error:
            if first:
                log.error("Model config %s applied but not its labels (tried again at each "
                          "re-read): %s", path, error)  # fmt: skip
            return False
        except ModelConfigError as error:
            if first:
                log.error("Model config not applied, still serving the previous one: %s", error)
            return False
        except Exception as error:  # the watcher must outlive any fault of a reload
            if first:
                log.exception("Model config not applied, still serving the previous one: %s",
                              error)  # fmt: skip
            return False
        self._config_seen, self._config_refused = stamp, None
        log.info("Model config %s applied: %s", path, ", ".join(self.names))
        return True

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> bool:
        """Stop watching the config and every model's versions; whether all have ended."""
        self._stop.set()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout)
        with self._lock:
            repositories = list(self._repositories.values())
        ended = [repository.stop(timeout) for repository in repositories]
        return all(ended) and not (watcher is not None and watcher.is_alive())

    @property
    def watching(self) -> bool:
        """Whether any watcher thread (the config's or a model's) is alive."""
        with self._lock:
            repositories = list(self._repositories.values())
        watcher = self._watcher
        return any(r.watching for r in repositories) or bool(watcher and watcher.is_alive())


def _stamp(path: str) -> tuple[int, int, int] | None:
    """The file's size, mtime and inode: a changed (or replaced) file is read again."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns, stat.st_ino
