"""A local server for exported SavedModels that speaks TensorFlow Serving's REST and gRPC APIs.

    python -m serving.server --model-base-path models/antisym --model-name antisym --port 8501
    python -m serving.server --model-config-file serving/models.config --grpc-port 8500

Serves the highest version under `--model-base-path` that loads (TensorFlow
Serving's `latest` policy), picks up new versions and falls back when the
served one is deleted, without a restart; or the models of a TensorFlow
Serving model config file, with their version policies and labels, re-read
every `--model-config-file-poll-wait-seconds` (`serving.local.model_config`). Answers
`GET /v1/models/NAME[/versions/V | /labels/L][/metadata]` and
`POST /v1/models/NAME[/versions/V | /labels/L]:predict` with TensorFlow Serving's JSON
formats, status codes and `{"error": ...}` bodies,
`GET /monitoring/prometheus/metrics` with its request metrics (`serving.local.metrics`),
and TensorFlow Serving's gRPC API on `--grpc-port` (`serving.local.grpcd`).
A WSGI app (serving.local.rest) on waitress (serving.local.httpd): strict HTTP
parsing, timeouts, a connection limit and a fixed pool of worker threads. It imports
TensorFlow only (no Keras), binds 127.0.0.1, has no authentication and does no
batching: it is for laptops, demos and tests; production uses the container.

SIGTERM or SIGINT drains: the server stops accepting connections, answers the
requests in progress (`--drain-seconds`, 10 s at most) and exits. Exit statuses:
0 after a drain that answered every request in progress; 1 when the address
cannot be bound, or when the drain ran out of time or a second signal cut it
short (the log says how many requests went unanswered); 2 for invalid arguments
(a port another process holds, checked before the models load; a model name
`/v1/models/NAME` cannot reach, a base path that is not a folder or is a version
folder itself). Errors at start-up are one line on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import math
import os
import resource
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from apputil import signals
from apputil.cli import EXIT_FAILURE, OneLineParser, run
from apputil.errors import Literal, invalid
from apputil.net import host_port, is_loopback, port_in_use
from serving.local.httpd import ServerThread
from serving.local.model_config import ModelConfig, ModelConfigError, Models, read_model_config
from serving.local.payload import DEFAULT_MAX_INPUT_ELEMENTS
from serving.local.plane import DataPlane
from serving.local.repository import POLL_SECONDS, base_path_problem
from serving.local.rest import RestApp
from serving.local.servable import Servable
from serving.names import check_model_name

if TYPE_CHECKING:
    from serving.local.grpcd import GrpcServer

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
FD_RESERVE = 64  # descriptors kept for TensorFlow, model files and logs


def _check_positive(name: str, value: object) -> None:
    if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
        raise invalid(name, "a positive number", value)


def _connection_limit(wanted: int) -> int:
    """`wanted`, within the open-file limit (else accept() fails with EMFILE).

    The soft limit is raised toward the hard one first (shells often start at
    1,024 of a far higher hard limit): connections are what stalled clients
    exhaust, so the server should have as many as it is allowed.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        if raised > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
            except (OSError, ValueError):
                pass
    if soft == resource.RLIM_INFINITY or wanted <= soft - FD_RESERVE:
        return wanted
    fitted = max(1, soft - FD_RESERVE)
    log.warning("connection limit %d lowered to %d to fit `ulimit -n` %d", wanted, fitted, soft)
    return fitted


def _limit(default: Any, meaning: str) -> Any:
    """A limit's field: its default, and its meaning for the CLI's help."""
    return dataclasses.field(default=default, metadata={"limit": meaning})


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """Every setting of the local server, each default in one place and checked once (as
    waitress' `Adjustments`).

    The CLI's flags are these fields (`--max-body-bytes` is `max_body_bytes`);
    `LIMITS` lists the limits among them with their defaults and meanings.
    """

    model_base_path: str | None = None
    model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8501
    poll_seconds: float = POLL_SECONDS
    # The limits: a flag each (`--max-body-bytes`) and a keyword of `make_server`, with
    # their meaning, from which `LIMITS` and the CLI's help are made.
    max_body_bytes: int = _limit(DEFAULT_MAX_BODY_BYTES, "larger request bodies get 413")
    max_input_elements: int = _limit(
        DEFAULT_MAX_INPUT_ELEMENTS, "more input numbers per request: 400"
    )
    max_header_bytes: int = _limit(64 * 1024, "larger request line + headers get 431")
    threads: int = _limit(4, "worker threads running predictions")
    connection_limit: int = _limit(1000, "open connections; more wait in the listen backlog")
    max_queued_requests: int = _limit(32, "more requests waiting for a worker get 503")
    channel_timeout: float = _limit(30, "seconds a keep-alive connection may sit idle")
    header_timeout: float = _limit(10.0, "seconds to send a request's line and headers")
    request_timeout: float = _limit(
        30.0, "seconds to send one request's headers and body (gRPC: its message)"
    )
    drain_seconds: float = _limit(
        10.0, "seconds to answer requests in progress after SIGTERM/SIGINT"
    )
    #: Replay each version's warmup requests before serving it (`serving.exports.warmup`).
    warmup: bool = True
    #: TensorFlow Serving's gRPC API on this port (0: any free one), None: REST only.
    grpc_port: int | None = None
    #: Serve the models of this TensorFlow Serving model config file (instead of one
    #: model by `model_base_path` and `model_name`; `serving.local.model_config`).
    model_config_file: str | None = None
    #: Seconds between re-reads of `model_config_file` (0: read it once).
    model_config_file_poll_wait_seconds: float = 60.0

    def limits(self) -> dict[str, float]:
        """The settings of `LIMITS`, by name."""
        return {name: getattr(self, name) for name in LIMITS}


    def model_configs(self, argument: Callable[[str], str] = str) -> list[ModelConfig]:
        """The models to serve: the config file's, or the one of `model_base_path` and
        `model_name`; a `UsageError` naming the setting at fault."""
        if self.model_config_file is not None:
            for name in ("model_base_path", "model_name"):
                if getattr(self, name) is not None:
                    raise invalid(argument(name), f"none with {argument('model_config_file')} "
                                  "(the file names the models)", getattr(self, name))  # fmt: skip
            try:
                return read_model_config(self.model_config_file)
            except ModelConfigError as error:
                raise invalid(argument("model_config_file"), "a TensorFlow Serving model "
                              "config file (ModelServerConfig, text format)",
                              Literal(str(error))) from None  # fmt: skip
        if self.model_base_path is None:
            raise invalid(argument("model_base_path"), "a folder of numbered version folders "
                          f"(or {argument('model_config_file')})", None)  # fmt: skip
        check_model_name(self.model_name, argument("model_name"))
        problem = base_path_problem(self.model_base_path)
        if problem:
            raise invalid(argument("model_base_path"), "a folder of numbered version folders",
                          Literal(problem))  # fmt: skip
        return [ModelConfig(str(self.model_name), self.model_base_path)]

    def checked(self, argument: Callable[[str], str] = str) -> ServerSettings:
        """`self`, or a `UsageError` naming the first bad setting as `argument(name)` says
        (the command line: its flag).

        The model name must be reachable in URLs, the base path must not be a
        version folder itself, the ports must be TCP ports, two apart and free
        (asked by binding them, before any model loads), and every other number
        positive and finite.
        """
        self.model_configs(argument)
        for name, value in {"poll_seconds": self.poll_seconds, **self.limits()}.items():
            _check_positive(argument(name), value)
        poll = self.model_config_file_poll_wait_seconds
        if not (isinstance(poll, int | float) and poll >= 0 and math.isfinite(poll)):
            raise invalid(
                argument("model_config_file_poll_wait_seconds"), "0 or more seconds", poll
            )
        ports = (("port", self.port), ("grpc_port", self.grpc_port))
        for name, port in ports:
            if port is not None and not 0 <= port <= 65535:
                raise invalid(argument(name), "0 to 65535", port)
        if self.port and self.port == self.grpc_port:
            raise invalid(argument("grpc_port"), f"a port other than {argument('port')}'s",
                          self.grpc_port)  # fmt: skip
        # Before the models load (seconds): a taken port is a mistake in the command line.
        for name, port in ports:
            if port and port_in_use(self.host, port):
                in_use = Literal(f"{port} (in use: {host_port(self.host, port)})")
                raise invalid(argument(name), f"a port no other process holds on {self.host}",
                              in_use)  # fmt: skip
        return self


#: The limits among the settings: `{name: (default, meaning)}`, read from their fields.
LIMITS: dict[str, tuple[Any, str]] = {
    field.name: (field.default, field.metadata["limit"])
    for field in dataclasses.fields(ServerSettings)
    if "limit" in field.metadata
}


class LocalServer:
    """The local server of checked `ServerSettings`: the version watcher (`repository`,
    one per model of `model_config`), one `DataPlane` over it and, side by side, its
    transports: REST on waitress (`rest`) and, with a `grpc_port`, gRPC (`grpc`).
    `serve_forever()` serves; `drain(seconds)` drains each; `close()` closes them.
    """

    def __init__(self, settings: ServerSettings):
        if not is_loopback(settings.host):
            log.warning("Binding %s: this server has no authentication, anyone who can reach "
                        "it can query the model", settings.host)  # fmt: skip
        self.settings = settings
        loader = functools.partial(Servable, warmup=settings.warmup)
        if settings.model_config_file is not None:
            self.models = Models.from_file(
                settings.model_config_file, settings.poll_seconds, loader
            )
        else:
            self.models = Models(settings.model_configs(), settings.poll_seconds, loader)
        # Loads each model's versions now; logs a warning for a model with none (404s
        # until one appears). A label of a version that did not load is a usage error.
        try:
            self.models.start()
        except ModelConfigError as error:
            self.models.stop()
            raise invalid("model_config_file", "labels of versions that load",
                          Literal(str(error))) from None  # fmt: skip
        if (
            settings.model_config_file is not None
            and settings.model_config_file_poll_wait_seconds > 0
        ):
            self.models.watch(
                settings.model_config_file, settings.model_config_file_poll_wait_seconds
            )
        # One data plane for both transports: the same checks, limits and metrics.
        self.plane = DataPlane(self.models, int(settings.max_input_elements))
        self.app = RestApp(self.plane, self.overloaded)
        try:
            self.rest = _rest_server(settings, self.app)
        except OSError as error:  # the address cannot be bound: nothing left running
            self.models.stop()
            address = host_port(settings.host, settings.port)
            raise OSError(f"cannot bind REST to {address}: {error.strerror or error}") from None
        self.grpc: GrpcServer | None = None
        if settings.grpc_port is not None:
            try:
                self.grpc = _grpc_server(settings, self.plane)
            except OSError:
                self.models.stop()
                self.rest.server_close()
                raise
            self.grpc.start()
        self.dropped = 0

    @property
    def transports(self) -> list[Any]:
        """The transports this server answers on: REST, then gRPC when it has one."""
        return [self.rest] + ([self.grpc] if self.grpc is not None else [])

    @property
    def server_address(self) -> tuple[str, int]:
        """`(host, port)` of the REST API."""
        return self.rest.server_address

    @property
    def grpc_address(self) -> tuple[str, int] | None:
        """`(host, port)` of the gRPC API, None without one."""
        return None if self.grpc is None else (self.grpc.host, self.grpc.port)

    def drain(self, seconds: float) -> None:
        """Every transport stops taking requests and answers those in progress within
        `seconds` (a second call stops at once); safe in a signal handler."""
        for transport in self.transports:
            transport.drain(seconds)

    def serve_forever(self) -> None:
        """Serves until `shutdown()` or the end of a drain (REST's event loop runs in this
        thread, gRPC's in its own), then waits for the gRPC calls in progress; `dropped`
        counts the requests of every transport left unanswered."""
        self.rest.serve_forever()
        self.dropped = self.rest.dropped
        if self.grpc is not None:
            self.dropped += self.grpc.wait_drained()

    def shutdown(self) -> None:
        """Stops `serve_forever` (from another thread) and waits for it."""
        self.rest.shutdown()

    def overloaded(self) -> bool:
        """Whether more requests wait for a worker than `max_queued_requests` (503)."""
        return self.rest.queued() > self.settings.max_queued_requests

    def close(self) -> None:
        """Stops watching for versions and closes every transport."""
        self.models.stop()
        if self.grpc is not None:
            self.grpc.close()
        self.rest.server_close()


def _rest_server(settings: ServerSettings, app: RestApp) -> ServerThread:
    """The REST transport of `settings`: waitress serving `app`; OSError when it cannot bind."""
    return ServerThread(
        app,
        settings.host,
        settings.port,
        settings.request_timeout,
        settings.header_timeout,
        threads=int(settings.threads),
        connection_limit=_connection_limit(int(settings.connection_limit)),
        channel_timeout=math.ceil(settings.channel_timeout),
        cleanup_interval=1,  # how often timeouts are checked
        max_request_header_size=int(settings.max_header_bytes),
        max_request_body_size=int(settings.max_body_bytes) + 1,  # waitress refuses >= cap
        ident="keras-antisym-local-serving",
        expose_tracebacks=False,
        asyncore_use_poll=True,  # select() fails on descriptors above 1,023
    )


def _grpc_server(settings: ServerSettings, plane: DataPlane) -> GrpcServer:
    """The gRPC API of `settings` over `plane`; OSError when it cannot bind."""
    # Imported here: grpcio and TensorFlow Serving's protos are needed only with gRPC.
    from serving.local.grpcd import GrpcApp, GrpcServer

    app = GrpcApp(plane)
    return GrpcServer(
        app, settings.host, int(settings.grpc_port or 0), threads=int(settings.threads),
        max_queued_requests=int(settings.max_queued_requests),
        max_message_bytes=int(settings.max_body_bytes), idle_seconds=settings.channel_timeout,
        receive_seconds=settings.request_timeout,
    )  # fmt: skip


def make_server(
    model_base_path: str | None = None,
    model_name: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8501,
    poll_seconds: float = POLL_SECONDS,
    grpc_port: int | None = None,
    model_config_file: str | None = None,
    model_config_file_poll_wait_seconds: float = 60.0,
    **limits: float,
) -> LocalServer:
    """Load the highest version (or the models of a config file) and bind a server; call
    `serve_forever()` on it.

    Args:
        model_base_path: Folder with one numbered sub-folder per version (`serving.names`).
        model_name: The model name in URLs (`serving.names.check_model_name`).
        host: Interface to bind; 127.0.0.1 keeps it local (there is no authentication).
        port: TCP port, 0 for any free one (see `server.server_address`).
        poll_seconds: Seconds between scans for new versions.
        grpc_port: Serve TensorFlow Serving's gRPC API on this port too (0: any free
            one, see `server.grpc_address`); None (the default): REST only.
        model_config_file: Serve the models of this TensorFlow Serving model config file
            (their policies and labels: `serving.local.model_config`) instead of
            `model_base_path` and `model_name`.
        model_config_file_poll_wait_seconds: Seconds between re-reads of `model_config_file`
            (0: read once).
        **limits: Overrides of `LIMITS` (see docs/serving.md).

    Returns:
        A `LocalServer`; `close()` (or `shutdown()` and `close()`) stops it.

    Raises:
        apputil.errors.UsageError: a limit or `poll_seconds` is not a positive number,
            the model name is not reachable in URLs, or the base path is a version folder.
        OSError: the address cannot be bound.
    """
    unknown = set(limits) - set(LIMITS)
    if unknown:
        raise TypeError(f"Unknown limits {sorted(unknown)}, expected some of {sorted(LIMITS)}")
    settings = ServerSettings(
        model_base_path, model_name, host, port, poll_seconds, grpc_port=grpc_port,
        model_config_file=model_config_file,
        model_config_file_poll_wait_seconds=model_config_file_poll_wait_seconds,
        **limits,  # type: ignore[arg-type]
    )  # fmt: skip
    return LocalServer(settings.checked())


@contextmanager
def _draining_on_signals(server: LocalServer) -> Iterator[threading.Event]:
    """SIGTERM and SIGINT drain `server` (a second one stops it at once) while inside;
    once the event it yields is set (the server closes), one is logged and changes
    nothing."""
    closing = threading.Event()

    def handler(signum, frame):
        if closing.is_set():  # the drain is over: nothing left to stop
            name = signal.Signals(signum).name
            log.info("%s while closing: the server is stopping already", name)
        else:
            server.drain(server.settings.drain_seconds)  # signal-safe: flags and a pipe write

    with signals.handling(handler):
        yield closing


def _serve(server: LocalServer, name: str) -> int:
    """Print the URL line, serve until SIGTERM/SIGINT, drain; the exit status."""
    host, port = server.server_address
    # The handler stays through the close: a signal then finds the drain over, not the
    # default handler that would kill the process.
    with _draining_on_signals(server) as closing:
        try:
            # Parseable lines: tests and scripts started with --port 0 (--grpc-port 0) read the
            # ports from them; the URL's comes last, so a reader waiting for it has both.
            if server.grpc_address is not None:
                grpc_host, grpc_port = server.grpc_address
                print(f"Serving {name} over gRPC on {grpc_host}:{grpc_port}", flush=True)
            print(f"Serving {name} on http://{host}:{port}", flush=True)
            server.serve_forever()
        finally:
            closing.set()
            server.close()
    return EXIT_FAILURE if server.dropped else 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; serves until interrupted, returns the exit status."""
    parser = OneLineParser(
        prog="python -m serving.server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model-base-path", help="e.g. models/antisym")
    parser.add_argument("--model-name", help="name in /v1/models/NAME (no '/' or ':')")
    parser.add_argument(
        "--model-config-file",
        help="serve the models of this TensorFlow Serving model config instead",
    )
    parser.add_argument(
        "--model-config-file-poll-wait-seconds", type=float, default=60.0,
        help="seconds between re-reads of --model-config-file (0: read once; default 60)",
    )  # fmt: skip
    parser.add_argument("--port", type=int, default=8501, help="REST port (0: any free port)")
    parser.add_argument(
        "--grpc-port", type=int, default=8500,
        help="gRPC port (0: any free port; default 8500, TensorFlow Serving's --port)",
    )  # fmt: skip
    parser.add_argument(
        "--host", default="127.0.0.1", help="interface to bind (no authentication: keep local)"
    )
    parser.add_argument(
        "--poll-seconds",
        type=float,
        default=POLL_SECONDS,
        help="seconds between scans for new versions",
    )
    for name, (default, meaning) in LIMITS.items():
        parser.add_argument(
            _flag(name), type=type(default), default=default,
            help=f"{meaning} (default {default})",
        )  # fmt: skip
    parser.add_argument(
        "--no-warmup", dest="warmup", action="store_false",
        help="serve each version without replaying its warmup requests first",
    )  # fmt: skip
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    return run(parser.prog, lambda: _start(args), {OSError: EXIT_FAILURE})


def _flag(name: str) -> str:
    """The command-line flag of a setting: `max_body_bytes` is `--max-body-bytes`."""
    return "--" + name.replace("_", "-")


def _start(args: argparse.Namespace) -> int:
    """Checks the arguments, binds the server, serves until SIGTERM/SIGINT; the status."""
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if not args.verbose:  # waitress warns on every queued request; the 503s tell overload
        logging.getLogger("waitress.queue").setLevel(logging.ERROR)
    if args.model_base_path is not None and not os.path.isdir(args.model_base_path):
        raise invalid("--model-base-path", "an existing folder", args.model_base_path)
    names = {field.name for field in dataclasses.fields(ServerSettings)}
    settings = ServerSettings(**{name: getattr(args, name) for name in names})
    # Checked before the slow model load, naming the flags.
    settings.checked(_flag)
    server = LocalServer(settings)
    return _serve(server, ",".join(server.models.names))

