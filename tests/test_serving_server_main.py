"""`python -m serving.server` called in this process: its flags and their documented
defaults, one-line errors before the model loads, and the serve loop that a signal drains.

The subprocess tests (`tests/test_serving_reliability.py`) run the real command; these
call `main` here, so that a wrong default, a flag passed on wrongly or a handler left
behind shows up in the test that caused it.
"""

import io
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
import types

import pytest

from apputil.net import free_port
from serving.local import server as server_module
from tests.limits import limit
from tests.serving_helpers import REPO_ROOT, exported, http_call

PROG = "python -m serving.server"
DOCS = os.path.join(REPO_ROOT, "docs", "serving.md")
PREDICT_BODY = {"instances": [[[0.5]] * 64] * 3}


def _flag(name):
    return "--" + name.replace("_", "-")


def _docs_section(title):
    text = open(DOCS, encoding="utf-8").read()
    start = text.index(f"\n### {title}\n")
    end = text.find("\n#", start + 1)
    return text[start:end]


def _documented_help():
    return re.search(r"```text\n(options:\n.*?)\n```", _docs_section("Flags"), re.S)[1]


def _documented_limits():
    """`{name: value}` from the table of docs/serving.md's Limits (`16 MiB`, `1,000`, `10 s`)."""
    units = {"MiB": 2**20, "KiB": 2**10, "s": 1, "": 1}
    limits = {}
    for flag, number, unit in re.findall(
        r"^\| `--([a-z-]+)` \| ([\d,.]+) ?(MiB|KiB|s|)\b", _docs_section("Limits"), re.M
    ):
        limits[flag.replace("-", "_")] = float(number.replace(",", "")) * units[unit]
    return limits


class _FakeServer:
    """What `main` serves with, without a model or a socket: it records its settings."""

    def __init__(self, settings, calls):
        self.settings, self.calls = settings, calls
        self.server_address = ("127.0.0.1", 8555)
        self.grpc_address = ("127.0.0.1", settings.grpc_port)
        self.models = types.SimpleNamespace(names=[settings.model_name])  # what it serves
        self.dropped, self.events = calls.dropped, []
        calls.append(settings)
        calls.server = self

    def serve_forever(self):
        self.events.append("served")

    def close(self):
        self.events.append("closed")


class _Calls(list):
    """The settings each server was made with; `server` is the last one made."""

    dropped = 0
    server = None


@pytest.fixture
def made(monkeypatch):
    """`LocalServer` replaced by a stand-in that records its settings."""
    calls = _Calls()
    monkeypatch.setattr(server_module, "LocalServer", lambda settings: _FakeServer(settings, calls))
    return calls


def test_help_is_the_copy_in_the_docs(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exited:
        server_module.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {PROG} ")
    # The description is the module's docstring with its layout (an indented example).
    assert "\n\n    python -m serving.server --model-base-path models/antisym" in out
    assert out[out.index("options:") :].rstrip("\n") == _documented_help()


def test_every_flag_reaches_make_server_with_its_type(made, tmp_path, capsys):
    limits = {"max_body_bytes": 1000, "max_input_elements": 500, "max_header_bytes": 2048,
              "threads": 3, "connection_limit": 7, "max_queued_requests": 5,
              "channel_timeout": 9, "header_timeout": 2.5, "request_timeout": 3.5,
              "drain_seconds": 1.5}  # fmt: skip
    argv = ["--model-base-path", str(tmp_path), "--model-name", "antisym", "--port", "0",
            "--host", "localhost", "--poll-seconds", "0.25", "--grpc-port", "8557"]  # fmt: skip
    for name, value in limits.items():
        argv += [_flag(name), str(value)]
    assert server_module.main(argv) == 0
    (settings,) = made
    assert settings == server_module.ServerSettings(
        str(tmp_path), "antisym", "localhost", 0, 0.25, grpc_port=8557, **limits
    )
    for name, value in settings.limits().items():
        assert type(value) is type(limits[name]), name  # threads: int, timeouts: float
    assert capsys.readouterr().out == (
        "Serving antisym over gRPC on 127.0.0.1:8557\nServing antisym on http://127.0.0.1:8555\n"
    )
    assert made.server.events == ["served", "closed"]


def test_defaults_are_the_documented_ones(made, tmp_path):
    assert server_module.main(["--model-base-path", str(tmp_path), "--model-name", "m"]) == 0
    (settings,) = made
    assert (settings.model_base_path, settings.model_name, settings.host, settings.port,
            settings.grpc_port, settings.poll_seconds) == (
        str(tmp_path), "m", "127.0.0.1", 8501, 8500, 1.0)  # TensorFlow Serving's ports  # fmt: skip
    assert settings.limits() == _documented_limits()
    assert set(settings.limits()) == set(server_module.LIMITS)


def test_the_url_line_is_flushed_before_serving(made, tmp_path, monkeypatch):
    """A parent reading the pipe (`--port 0`) gets the line while the server runs."""

    class Pipe(io.StringIO):
        flushed = ""

        def flush(self):
            self.flushed = self.getvalue()

    pipe = Pipe()
    monkeypatch.setattr(sys, "stdout", pipe)
    seen = []
    monkeypatch.setattr(_FakeServer, "serve_forever", lambda self: seen.append(pipe.flushed))
    assert server_module.main(["--model-base-path", str(tmp_path), "--model-name", "m"]) == 0
    assert seen == ["Serving m over gRPC on 127.0.0.1:8500\nServing m on http://127.0.0.1:8555\n"]


def test_a_drain_that_left_requests_unanswered_exits_1(made, tmp_path):
    made.dropped = 2
    assert server_module.main(["--model-base-path", str(tmp_path), "--model-name", "m"]) == 1
    assert made.server.events == ["served", "closed"]


def test_an_address_in_use_is_one_line_and_status_1(monkeypatch, tmp_path, capsys):
    def in_use(settings):
        raise OSError(98, "Address already in use")

    monkeypatch.setattr(server_module, "LocalServer", in_use)
    assert server_module.main(["--model-base-path", str(tmp_path), "--model-name", "m"]) == 1
    assert capsys.readouterr().err == f"{PROG}: error: [Errno 98] Address already in use\n"


@pytest.mark.parametrize("verbose", [False, True])
def test_verbose_logs_every_request_and_quiet_mutes_waitress_queue_warnings(
    made, tmp_path, monkeypatch, verbose
):
    root, queue = logging.getLogger(), logging.getLogger("waitress.queue")
    monkeypatch.setattr(root, "handlers", [])  # basicConfig configures only a bare root
    before = root.level, queue.level
    try:
        argv = ["--model-base-path", str(tmp_path), "--model-name", "m"]
        assert server_module.main(argv + ["--verbose"] * verbose) == 0
        assert root.level == (logging.DEBUG if verbose else logging.INFO)
        assert queue.level == (before[1] if verbose else logging.ERROR)
        # Each line: time, level, logger, message.
        name = "serving.local.server"
        record = logging.LogRecord(name, logging.WARNING, "", 0, "hi", None, None)
        line = root.handlers[0].format(record)
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING " + name + " hi", line)
    finally:
        root.setLevel(before[0])
        queue.setLevel(before[1])


def _version_folder(tmp_path):
    (tmp_path / "saved_model.pb").write_bytes(b"")
    return str(tmp_path)


def _invalid(argument, expected, got):
    return f"Received an invalid value for argument `{argument}`, expected {expected}, got {got}."


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--model-name", "my/model"], "`--model-name`"),
        (["--model-name", ""], "`--model-name`"),
        (["--model-name", "m", "--threads", "0"], _invalid("--threads", "a positive number", 0)),
        (["--model-name", "m", "--drain-seconds", "nan"],
         _invalid("--drain-seconds", "a positive number", "nan")),
        (["--model-name", "m", "--max-body-bytes", "-1"],
         _invalid("--max-body-bytes", "a positive number", -1)),
        (["--model-name", "m", "--poll-seconds", "0"],
         _invalid("--poll-seconds", "a positive number", 0.0)),
        (["--model-name", "m", "--port", "65536"], _invalid("--port", "0 to 65535", 65536)),
        (["--model-name", "m", "--port", "-1"], _invalid("--port", "0 to 65535", -1)),
        (["--model-name", "m", "--header-timeout", "x"],
         "argument --header-timeout: invalid float value: 'x'"),
        (["--model-name", "m", "--threads", "1.5"],
         "argument --threads: invalid int value: '1.5'"),
        (["--model-name", "m", "--model-base-path", "no-such-folder"],
         _invalid("--model-base-path", "an existing folder", "'no-such-folder'")),
        (["--model-name", "m", "--model-base-path", _version_folder],
         _invalid("--model-base-path", "a folder of numbered version folders",
                  "'{tmp_path}' holds a saved_model.pb itself: it is a version folder, the base "
                  "path is its parent (versions are numbered sub-folders)")),
        (["--port", "1"], "argument `--model-name`, expected a name usable in /v1/models/NAME"),
        (["--model-name", "m", "--model-config-file", "x.config"],
         "argument `--model-base-path`, expected none with --model-config-file (the file names "
         "the models), got "),
    ],
)  # fmt: skip
def test_bad_flags_are_one_line_before_the_model_loads(made, tmp_path, capsys, flags, message):
    argv = ["--model-base-path", str(tmp_path)]
    argv += [flag(tmp_path) if callable(flag) else flag for flag in flags]
    try:
        status = server_module.main(argv)
    except SystemExit as exited:  # argparse's own errors (a value of the wrong type)
        status = exited.code
    assert status == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{PROG}: error: "), line
    assert message.format(tmp_path=tmp_path) in line
    assert made == []  # refused before any model was loaded


def test_the_base_path_or_a_model_config_file_is_required(made, capsys):
    assert server_module.main(["--model-name", "m"]) == 2
    assert capsys.readouterr().err == (
        f"{PROG}: error: Received an invalid value for argument `--model-base-path`, expected "
        "a folder of numbered version folders (or --model-config-file), got None.\n"
    )
    assert made == []


def test_the_highest_port_is_accepted(made, tmp_path):
    argv = ["--model-base-path", str(tmp_path), "--model-name", "m", "--port", "65535"]
    assert server_module.main(argv) == 0
    assert made[0].port == 65535


def _client(made, answers, signum):
    """Waits for the server, predicts once, then signals this process (the server's)."""
    deadline = time.monotonic() + limit(120)
    while not made and time.monotonic() < deadline:
        time.sleep(0.05)
    host, port = made[0].server_address[:2]
    answers.append(port)
    # Answered only once serve_forever runs, after the signal handlers are installed.
    answers.append(
        http_call(
            f"http://{host}:{port}/v1/models/antisym:predict", "POST", PREDICT_BODY,
            timeout=limit(60),
        )
    )
    os.kill(os.getpid(), signum)


@pytest.mark.parametrize("signum", [signal.SIGINT])
def test_serves_until_a_signal_then_drains_closes_and_gives_the_handlers_back(
    monkeypatch, capsys, signum
):
    _, base = exported("antisymmetric")
    real_server, made, answers = server_module.LocalServer, [], []

    def record(settings):
        made.append(real_server(settings))
        return made[-1]

    monkeypatch.setattr(server_module, "LocalServer", record)
    client = threading.Thread(target=_client, args=(made, answers, signum), daemon=True)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    client.start()
    status = server_module.main(
        ["--model-base-path", base, "--model-name", "antisym", "--port", "0", "--grpc-port", "0"]
    )
    client.join(timeout=limit(60))
    assert status == 0
    port, (code, body) = answers
    assert code == 200 and len(body["predictions"]) == 3
    assert f"Serving antisym on http://127.0.0.1:{port}\n" in capsys.readouterr().out
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    assert not made[0].models.watching
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


@pytest.mark.parametrize(
    "soft, hard, wanted, raised_to, fits",
    [
        (1024, 4096, 1000, 1064, 1000),  # raised to what the connections and the reserve need
        (1024, "inf", 1000, 1064, 1000),  # no hard limit: the same
        (1024, 1030, 1000, 1030, 966),  # raised as far as the hard limit, then fitted
        (1024, 1024, 1000, None, 960),  # cannot be raised: fitted to soft - 64
        (1064, 1064, 1000, None, 1000),  # exactly enough already
        ("inf", "inf", 1000, None, 1000),
        (100, 100, 1000, None, 36),
        (60, 60, 1000, None, 1),  # below the reserve: one connection still
    ],
)  # fmt: skip
def test_connection_limit_raises_the_soft_file_limit_or_fits_under_it(
    monkeypatch, caplog, soft, hard, wanted, raised_to, fits
):
    resource = server_module.resource
    infinity = resource.RLIM_INFINITY
    limits = [infinity if soft == "inf" else soft, infinity if hard == "inf" else hard]
    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda which: tuple(limits))
    monkeypatch.setattr(resource, "setrlimit", lambda which, pair: calls.append((which, pair)))
    with caplog.at_level(logging.WARNING, logger="serving"):
        assert server_module._connection_limit(wanted) == fits
    expected = [] if raised_to is None else [(resource.RLIMIT_NOFILE, (raised_to, limits[1]))]
    assert calls == expected
    warnings = [r.getMessage() for r in caplog.records]
    if fits == wanted:
        assert warnings == []
    else:
        final = raised_to if raised_to is not None else limits[0]
        assert warnings == [
            f"connection limit {wanted} lowered to {fits} to fit `ulimit -n` {final}"
        ]


def test_connection_limit_keeps_the_soft_limit_when_raising_it_fails(monkeypatch):
    resource = server_module.resource

    def refuse(which, pair):
        raise ValueError("not allowed")

    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 4096))
    monkeypatch.setattr(resource, "setrlimit", refuse)
    assert server_module._connection_limit(1000) == 960


def test_make_server_passes_every_limit_on_with_its_type(tmp_path, monkeypatch):
    """A real server on a free port (no version yet: nothing loads): the settings reach the
    watcher, the app and waitress's adjustments."""
    monkeypatch.setattr(server_module, "_connection_limit", lambda wanted: wanted - 1)
    made = server_module.make_server(str(tmp_path), "m", port=0)
    try:
        assert made.settings == server_module.ServerSettings(str(tmp_path), "m", port=0)
        repository = made.models.repository("m")
        assert made.models.names == ["m"]
        assert (repository.base_path, repository.name, repository.poll_seconds) == (
            str(tmp_path), "m", 1.0
        )  # fmt: skip
        assert repository.watching and made.app.plane is made.plane
        assert made.plane.repository is made.models and made.transports == [made.rest]
        assert (made.rest.server.request_timeout, made.rest.server.header_timeout) == (30.0, 10.0)
        adj = made.rest.adj
        assert (adj.threads, adj.connection_limit, adj.channel_timeout) == (4, 999, 30)
        assert adj.max_request_header_size == 64 * 1024
        assert adj.max_request_body_size == server_module.LIMITS["max_body_bytes"][0] + 1
        assert (adj.ident, adj.expose_tracebacks, adj.asyncore_use_poll) == (
            "keras-antisym-local-serving", False, True
        )  # fmt: skip
        made.rest.dispatcher.queue.extend([None] * 32)
        assert not made.app.overloaded()
        made.rest.dispatcher.queue.append(None)  # more than --max-queued-requests wait: 503
        assert made.app.overloaded()
        made.rest.dispatcher.queue.clear()
    finally:
        made.close()
    assert not made.models.watching

    given = server_module.make_server(
        str(tmp_path), "m", "127.0.0.1", 0, 0.5, threads=2.0, channel_timeout=2.5,
        max_queued_requests=1, drain_seconds=3, connection_limit=50, max_body_bytes=100,
        max_header_bytes=200.0, request_timeout=4, header_timeout=5, max_input_elements=77.0,
    )  # fmt: skip
    try:
        assert given.models.poll_seconds == 0.5
        assert (given.rest.server.request_timeout, given.rest.server.header_timeout) == (4, 5)
        assert given.settings.drain_seconds == 3
        assert (given.rest.adj.threads, given.rest.adj.channel_timeout) == (2, 3)
        assert given.rest.adj.connection_limit == 49
        assert given.rest.adj.max_request_body_size == 101
        assert given.rest.adj.max_request_header_size == 200
        assert given.plane.max_input_elements == 77 and type(given.plane.max_input_elements) is int
        given.rest.dispatcher.queue.extend([None] * 2)
        assert given.app.overloaded()
        given.rest.dispatcher.queue.clear()
    finally:
        given.close()


def test_make_server_refuses_unknown_limits_and_ports_outside_tcp(tmp_path, monkeypatch):
    with pytest.raises(TypeError) as caught:
        server_module.make_server(str(tmp_path), "m", threads=2, speed=3)
    assert str(caught.value) == (
        f"Unknown limits ['speed'], expected some of {sorted(server_module.LIMITS)}"
    )
    for port in (-1, 65536):
        with pytest.raises(ValueError) as caught:
            server_module.make_server(str(tmp_path), "m", port=port)
        assert str(caught.value) == (
            f"Received an invalid value for argument `port`, expected 0 to 65535, got {port}."
        )
    settings = server_module.ServerSettings(str(tmp_path), "m", port=65535)
    assert settings.checked() is settings


@pytest.mark.parametrize(
    "poll, accepted",
    [(0, True), (0.5, True), (60, True), (-1, False), (-0.5, False), (float("inf"), False),
     (float("nan"), False), ("5", False), (None, False)],
)  # fmt: skip
def test_the_config_files_poll_wait_is_zero_or_more_finite_seconds(poll, accepted, tmp_path):
    """0 reads the model config file once (TensorFlow Serving's meaning); a negative,
    infinite or non-number wait is refused by name."""
    settings = server_module.ServerSettings(
        str(tmp_path), "m", port=0, model_config_file_poll_wait_seconds=poll
    )
    if accepted:
        assert settings.checked() is settings
        return
    with pytest.raises(ValueError) as caught:
        settings.checked()
    assert str(caught.value) == (
        "Received an invalid value for argument `model_config_file_poll_wait_seconds`, "
        f"expected 0 or more seconds, got {poll!r}."
    )


def test_the_grpc_api_binds_the_port_asked_for(tmp_path):
    port = free_port()
    made = server_module.make_server(str(tmp_path), "m", port=0, grpc_port=port)
    try:
        assert made.grpc_address == ("127.0.0.1", port)
    finally:
        made.close()


def test_the_grpc_api_needs_a_port_of_its_own(tmp_path):
    settings = server_module.ServerSettings(str(tmp_path), "m", port=8600, grpc_port=8600)
    with pytest.raises(ValueError) as caught:
        settings.checked(_flag)
    assert str(caught.value) == (
        "Received an invalid value for argument `--grpc-port`, expected a port other than "
        "--port's, got 8600."
    )


@pytest.mark.parametrize("name", ["port", "grpc_port"])
def test_a_port_another_socket_holds_is_refused_by_its_flag_before_anything_loads(name, tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        ports = {"port": 0, "grpc_port": 0, name: port}
        settings = server_module.ServerSettings(str(tmp_path), "m", **ports)
        with pytest.raises(ValueError) as caught:
            settings.checked(_flag)
    assert str(caught.value) == (
        f"Received an invalid value for argument `{_flag(name)}`, expected a port no other process "
        f"holds on 127.0.0.1, got {port} (in use: 127.0.0.1:{port})."
    )


def test_a_config_files_label_of_a_version_that_does_not_load_stops_the_start(tmp_path):
    (tmp_path / "a").mkdir()  # no version yet
    config = tmp_path / "models.config"
    config.write_text(
        'model_config_list { config { name: "a" base_path: "%s" model_platform: "tensorflow"'
        ' version_labels { key: "stable" value: 1 } } }' % (tmp_path / "a")
    )
    with pytest.raises(ValueError) as caught:
        server_module.make_server(model_config_file=str(config), port=0)
    assert str(caught.value) == (
        "Received an invalid value for argument `model_config_file`, expected labels of "
        "versions that load, got label 'stable' of model a names version 1, which is not "
        "served (served: none)."
    )


@pytest.mark.parametrize(
    "host, warned",
    [("127.0.0.1", False), ("127.0.0.2", False), ("::1", False), ("localhost", False),
     ("0.0.0.0", True), ("192.0.2.1", True), ("example.org", True)],
)  # fmt: skip
def test_binding_beyond_loopback_warns_that_there_is_no_authentication(
    host, warned, tmp_path, monkeypatch, caplog
):
    def bind_nothing(self, *args, **kwargs):  # the warning comes first; nothing is bound here
        raise OSError("not bound in this test")

    monkeypatch.setattr(server_module.ServerThread, "__init__", bind_nothing)
    with caplog.at_level(logging.WARNING, logger="serving"):
        with pytest.raises(OSError, match="not bound"):
            server_module.make_server(str(tmp_path), "m", host=host)
    warnings = [
        r.getMessage() for r in caplog.records
        if r.name == "serving.local.server" and r.getMessage().startswith("Binding")
    ]  # fmt: skip
    expected = (f"Binding {host}: this server has no authentication, anyone who can reach it "
                "can query the model")  # fmt: skip
    assert warnings == ([expected] if warned else [])


def test_make_server_refuses_a_version_folder_and_a_non_positive_poll(tmp_path):
    version = tmp_path / "1"
    version.mkdir()
    (version / "saved_model.pb").write_bytes(b"pb")
    with pytest.raises(ValueError) as caught:
        server_module.make_server(str(version), "m")
    assert str(caught.value) == (
        "Received an invalid value for argument `model_base_path`, expected a folder of "
        f"numbered version folders, got {str(version)!r} holds a saved_model.pb itself: it is a "
        "version folder, the base path is its parent (versions are numbered sub-folders)."
    )
    with pytest.raises(ValueError) as caught:
        server_module.make_server(str(tmp_path), "m", poll_seconds=0)
    assert str(caught.value) == (
        "Received an invalid value for argument `poll_seconds`, expected a positive number, got 0."
    )


def test_help_keeps_the_description_s_own_line_breaks(capsys):
    with pytest.raises(SystemExit):
        server_module.main(["--help"])
    command = "    python -m serving.server --model-base-path models/antisym --model-name antisym"
    assert f"\n{command} --port 8501\n" in capsys.readouterr().out
