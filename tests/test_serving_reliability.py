"""The local server under careless and hostile use: restarts under traffic, failed
deploys, oversized `Expect: 100-continue` bodies, stalled clients, bad CLI input.

Every server runs on 127.0.0.1 and is stopped by the test, even on failure; every
test is bounded in time and in requests.
"""

import http.client
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.limits import limit
from tests.serving_helpers import (
    REPO_ROOT,
    ServerProcess,
    ThreadServer,
    exported,
    http_call,
    work_dir,
)

pytestmark = pytest.mark.timeout(240)

PREDICT_BODY = json.dumps({"instances": [[[0.5]] * 64] * 8})


def _host_port(url):
    host, port = re.match(r"http://([^/:]+):(\d+)", url).groups()
    return host, int(port)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- draining on SIGTERM -------------------------------------------------------------


class _Traffic:
    """Client threads sending predictions on fresh connections until stopped.

    A refused connection is retried (the server is restarting); a request that was
    sent and then got no HTTP answer (a reset, a close, a timeout) is counted as
    unanswered.
    """

    def __init__(self, port, model, clients=4, limit=600):
        self.port, self.path = port, f"/v1/models/{model}:predict"
        self.limit = limit
        self.lock = threading.Lock()
        self.answered, self.unanswered, self.refused, self.statuses = 0, [], 0, {}
        self.reset_after_connect = 0  # connections the kernel completed, then reset
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=limit(30))

    @property
    def sent(self):
        return self.answered + len(self.unanswered)

    def _run(self):
        while not self.stop.is_set() and self.sent < self.limit:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=limit(30))
            try:
                conn.connect()
            except OSError:  # refused: the server is down, retry soon
                with self.lock:
                    self.refused += 1
                time.sleep(0.05)
                continue
            try:
                conn.request("POST", self.path, PREDICT_BODY, {"Connection": "close"})
            except OSError:
                # Reset while sending: the kernel completed the handshake into the listen
                # backlog after the draining server's last accept. Counted (a draining server
                # must not let the kernel complete handshakes it will not answer), then
                # retried: the server never read this request.
                conn.close()
                with self.lock:
                    self.reset_after_connect += 1
                time.sleep(0.05)
                continue
            try:
                response = conn.getresponse()
                response.read()
            except (OSError, http.client.HTTPException) as error:
                with self.lock:
                    self.unanswered.append(repr(error))
            else:
                with self.lock:
                    self.answered += 1
                    self.statuses[response.status] = self.statuses.get(response.status, 0) + 1
            finally:
                conn.close()


def _wait_count(traffic, count, timeout):
    deadline = time.monotonic() + timeout
    while traffic.sent < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert traffic.sent >= count, f"{traffic.sent} of {count} requests sent in {timeout} s"


@pytest.mark.parametrize(
    ("restarts", "per_restart"),
    [(1, 150),
     pytest.param(20, 50, marks=[pytest.mark.slow, pytest.mark.timeout(900)],
                  id="20-in-a-row")],
)  # fmt: skip
def test_sigterm_restart_under_traffic_answers_every_request(restarts, per_restart):
    """SIGTERM under 4 clients: in-flight requests answered, exit 0; the restarted
    server takes over on the same port; no request sent goes unanswered and no connection
    is reset, also over 20 restarts in a row."""
    _, base = exported("antisymmetric")
    port = _free_port()
    args = ["--port", str(port), "--drain-seconds", "10"]
    servers = [ServerProcess(base, "antisym", extra_args=args)]
    try:
        # A bound on the clients, with room for what they send while a server starts.
        with _Traffic(port, "antisym", limit=4 * per_restart * (restarts + 1)) as traffic:
            _wait_count(traffic, per_restart, 60)
            for restart in range(restarts):
                before = traffic.sent
                start = time.monotonic()
                servers[-1].process.send_signal(signal.SIGTERM)
                status = servers[-1].process.wait(timeout=limit(30))
                drained = time.monotonic() - start
                servers.append(ServerProcess(base, "antisym", extra_args=args))
                _wait_count(traffic, traffic.sent + per_restart, 60)
                summary = (
                    f"restart {restart + 1}: {traffic.sent} requests ({before} before SIGTERM), "
                    f"{traffic.answered} answered, {len(traffic.unanswered)} unanswered, "
                    f"{traffic.refused} refused connects retried, {traffic.reset_after_connect} "
                    f"connections reset before an answer; the server exited {status} "
                    f"{drained:.2f} s after SIGTERM"
                )
                print("\n" + summary)
                log = "".join(servers[-2].log[-20:])
                assert status == 0, log
                assert not traffic.unanswered, (summary, traffic.unanswered[:5])
                assert traffic.reset_after_connect == 0, summary
                assert any("draining" in line for line in servers[-2].log), log
        assert traffic.statuses == {200: traffic.answered}, traffic.statuses
    finally:
        for server in servers:
            server.stop()
    assert servers[-1].process.returncode == 0  # stopped by SIGTERM with nothing in flight


# --- Expect: 100-continue ------------------------------------------------------------


def test_signals_while_the_server_closes_and_exits_change_nothing():
    """SIGTERM every 50 ms from the first on, until the process is gone: with no request
    in progress the status is the drain's 0 wherever one lands (in the drain, the close
    or the process' exit), never death by the signal, and each one after the drain is
    one line (logged while the server closes, printed while the process exits)."""
    _, base = exported("antisymmetric")
    server = ServerProcess(base, "antisym")
    sent = 0
    try:
        deadline = time.monotonic() + limit(60)
        while server.process.poll() is None and time.monotonic() < deadline:
            server.process.send_signal(signal.SIGTERM)
            sent += 1
            time.sleep(0.05)
        server.process.wait(timeout=limit(30))
    finally:
        server.stop()
    time.sleep(0.2)  # the reader thread takes the last lines
    text = "".join(server.log)
    assert server.process.returncode == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    told = [line for line in server.log if "SIGTERM while" in line]
    assert sent >= 1 and len(told) < sent, (sent, text[-3000:])
    for line in told:
        assert line.rstrip().endswith(
            ("SIGTERM while closing: the server is stopping already",
             "python -m serving.server: SIGTERM while exiting: its work was done (exit status 0)")
        ), line  # fmt: skip


def _expect_continue(url, length, body_budget):
    """Headers with `Expect: 100-continue`; sends the body only if invited.

    Returns `(interim, final status, body bytes the server was sent before answering)`.
    """
    host, port = _host_port(url)
    head = (
        "POST /v1/models/antisym:predict HTTP/1.1\r\nHost: x\r\n"
        f"Content-Length: {length}\r\nExpect: 100-continue\r\n\r\n"
    ).encode()
    received, sent = b"", 0
    with socket.create_connection((host, port), timeout=limit(10)) as sock:
        sock.sendall(head)
        ready, _, _ = select.select([sock], [], [], 3)
        if ready:
            received = sock.recv(65536)
        interim = received.startswith(b"HTTP/1.1 100")
        if interim:
            received = received.split(b"\r\n\r\n", 1)[1]
            chunk = b" " * 65536
            while sent < body_budget and b"\r\n\r\n" not in received:
                try:
                    sent += sock.send(chunk)
                except OSError:
                    break
                if select.select([sock], [], [], 0)[0]:
                    data = sock.recv(65536)
                    if not data:
                        break
                    received += data
        deadline = time.monotonic() + limit(10)
        while b"\r\n\r\n" not in received and time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except OSError:
                break
            if not data:
                break
            received += data
    status = int(received.split(b" ", 2)[1]) if received.startswith(b"HTTP/") else None
    return interim, status, sent


def test_expect_continue_over_the_cap_is_refused_before_the_body():
    _, base = exported("antisymmetric")
    cap = 1 << 20
    server = ThreadServer(base, "antisym", max_body_bytes=cap)
    try:
        interim, status, sent = _expect_continue(server.url, cap + 1, 4 * cap)
        print(f"\nExpect: 100-continue, Content-Length cap + 1: 100 Continue {interim}, "
              f"{status}, {sent} body bytes sent")  # fmt: skip
        assert (interim, status, sent) == (False, 413, 0)
        # Within the cap the client is invited to send, and gets an answer.
        interim, status, _ = _expect_continue(server.url, 10, 10)
        assert interim and status == 400
        assert http_call(f"{server.url}/v1/models/antisym")[0] == 200
    finally:
        server.stop()


# --- stalled clients -----------------------------------------------------------------


def _stall(url, count):
    host, port = _host_port(url)
    sockets = []
    for _ in range(count):
        sock = socket.create_connection((host, port), timeout=limit(10))
        sock.sendall(b"POST /v1/models/antisym:predict HTTP/1.1\r\nHost: x\r\n")
        sockets.append(sock)
    return sockets


def test_stalled_clients_do_not_starve_a_good_request():
    """200 half-sent requests held open (default limits): a good predict is answered fast."""
    if not sys.platform.startswith("linux"):
        pytest.skip("counts file descriptors under /proc")
    _, base = exported("antisymmetric")
    server = ServerProcess(base, "antisym")
    sockets = []
    try:
        sockets = _stall(server.url, 200)
        time.sleep(0.5)
        start = time.monotonic()
        status, answer = http_call(
            f"{server.url}/v1/models/antisym:predict", "POST", PREDICT_BODY, timeout=limit(45)
        )
        waited = time.monotonic() - start
        print(f"\n200 stalled connections: a good predict answered in {waited:.2f} s")
        assert status == 200, answer
        assert waited < 2.0, waited
        # The stalled ones are closed after the header deadline, unanswered.
        for sock in sockets:
            sock.settimeout(20)
            assert sock.recv(100) == b""
    finally:
        for sock in sockets:
            sock.close()
        server.stop()


def test_drain_answers_in_flight_requests_then_stops(monkeypatch):
    """`drain`: new connections refused at once, the held request answered (with
    `Connection: close`), the loop returns; past the deadline the rest is counted."""
    from serving.local import rest

    _, base = exported("antisymmetric")
    release, started = threading.Event(), threading.Event()
    real_predict = rest.predict_body

    def held_predict(*args):
        started.set()
        release.wait(timeout=limit(60))
        return real_predict(*args)

    monkeypatch.setattr(rest, "predict_body", held_predict)
    for seconds, released, dropped in ((30.0, True, 0), (0.5, False, 1)):
        release.clear(), started.clear()
        server = ThreadServer(base, "antisym", threads=1)
        host, port = _host_port(server.url)
        results = []
        predict_url = f"{server.url}/v1/models/antisym:predict"
        client = threading.Thread(
            target=lambda url=predict_url, out=results: out.append(
                http_call(url, "POST", PREDICT_BODY)
            ),
            daemon=True,
        )
        try:
            client.start()
            assert started.wait(timeout=limit(60))
            # A keep-alive connection, no request.
            idle = socket.create_connection((host, port), timeout=limit(10))
            server.server.drain(seconds)
            deadline = time.monotonic() + limit(10)
            while True:  # the listener closes within a loop turn
                try:
                    # A SYN sent between the SYN filter and the close is dropped; the
                    # client's retry (a second later) finds the port closed: refused.
                    socket.create_connection((host, port), timeout=5).close()
                except (ConnectionRefusedError, ConnectionResetError):
                    # Reset: the kernel completed the handshake into the backlog just
                    # before the listener closed; refused from then on.
                    break
                assert time.monotonic() < deadline, "still accepting while draining"
                time.sleep(0.05)
            assert idle.recv(10) == b""  # idle connections are closed, not waited for
            idle.close()
            if released:
                release.set()
            server.thread.join(timeout=limit(30))
            assert not server.thread.is_alive()
            assert server.server.dropped == dropped
        finally:
            release.set()
            server.stop()
        client.join(timeout=limit(30))
        if released:
            assert results and results[0][0] == 200, results


CLI_LIMIT = limit(120)


def _run_cli(module, *args, timeout=CLI_LIMIT):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.startswith("python -m")]
    return done.returncode, lines, done.stderr


@pytest.mark.parametrize(
    "args, argument",
    [
        # Every flag is checked in process (tests/test_serving_server_main.py); these two
        # go through the real command: one of argparse's errors, one of ours.
        (["--model-name", "my/model"], "--model-name"),
        (["--model-name", "m", "--header-timeout", "x"], "--header-timeout"),
    ],
)
def test_server_refuses_bad_flags_in_one_line(args, argument):
    _, base = exported("antisymmetric")
    status, lines, stderr = _run_cli("serving.server", "--model-base-path", base, *args)
    assert status == 2, stderr
    assert len(lines) == 1 and argument in lines[0], stderr
    assert "Traceback" not in stderr


def test_server_refuses_a_version_folder_as_base_path():
    _, base = exported("antisymmetric")
    version = os.path.join(base, "1")
    status, lines, stderr = _run_cli(
        "serving.server", "--model-base-path", version, "--model-name", "m"
    )
    assert status == 2 and len(lines) == 1, stderr
    assert "version folder" in lines[0] and "--model-base-path" in lines[0]


def _copy_version(source, target):
    import shutil

    shutil.copytree(source, target)


def _corrupt_variables(version_folder):
    folder = os.path.join(version_folder, "variables")
    for name in os.listdir(folder):
        if name.startswith("variables.data"):
            with open(os.path.join(folder, name), "r+b") as f:
                f.truncate(8)


def test_failed_and_odd_versions_are_reported_over_rest(tmp_path):
    """A corrupt deploy, `007`, the int64 maximum, a clash and an empty folder: each in
    the status with its state and error; predictions name why a version is missing."""
    from serving.names import MAX_VERSION

    _, exported_base = exported("antisymmetric")
    one = os.path.join(exported_base, "1")
    base = str(tmp_path / "base")
    os.makedirs(base)
    _copy_version(one, os.path.join(base, "007"))
    _copy_version(one, os.path.join(base, "8"))
    _corrupt_variables(os.path.join(base, "8"))
    server = ThreadServer(base, "m", poll_seconds=0.2)
    try:
        status_url = f"{server.url}/v1/models/m"
        status, body = http_call(status_url)
        assert status == 200, body
        entries = {e["version"]: e for e in body["model_version_status"]}
        assert list(entries) == ["8", "7"]
        assert entries["7"]["state"] == "AVAILABLE"
        assert entries["7"]["status"] == {"error_code": "OK", "error_message": ""}
        assert entries["8"]["state"] == "END"
        assert entries["8"]["status"]["error_code"] not in ("OK", "")
        assert entries["8"]["status"]["error_message"]
        status, body = http_call(f"{status_url}/versions/8")
        assert status == 200 and body["model_version_status"] == [entries["8"]]
        status, body = http_call(f"{status_url}/versions/07")
        assert body["model_version_status"][0]["version"] == "7", body
        status, body = http_call(f"{status_url}/versions/8:predict", "POST", PREDICT_BODY)
        assert status == 404 and "version 8 is not loaded" in body["error"], body
        status, _ = http_call(f"{status_url}/versions/7:predict", "POST", PREDICT_BODY)
        assert status == 200

        _copy_version(one, os.path.join(base, str(MAX_VERSION)))
        _copy_version(one, os.path.join(base, "7"))  # 7 and 007: a clash
        os.makedirs(os.path.join(base, "9"))  # no saved_model.pb
        deadline = time.monotonic() + limit(60)
        while http_call(status_url)[1]["model_version_status"][0]["state"] != "AVAILABLE":
            assert time.monotonic() < deadline, http_call(status_url)
            time.sleep(0.2)
        entries = {e["version"]: e for e in http_call(status_url)[1]["model_version_status"]}
        assert list(entries) == [str(MAX_VERSION), "9", "8", "7"]
        assert entries[str(MAX_VERSION)]["state"] == "AVAILABLE"
        assert entries["9"]["status"]["error_code"] == "NOT_FOUND"
        assert entries["7"]["status"]["error_code"] == "FAILED_PRECONDITION"
        assert "'007' and '7'" in entries["7"]["status"]["error_message"]
    finally:
        server.stop()


def test_a_base_path_without_versions_says_so(tmp_path, caplog):
    import logging

    base = str(tmp_path / "empty")
    os.makedirs(base)
    with caplog.at_level(logging.WARNING, logger="serving"):
        server = ThreadServer(base, "m")
    try:
        assert "No versions of servable m found under base path" in caplog.text
        for path in ("/v1/models/m", "/v1/models/m:predict"):
            status, body = http_call(
                server.url + path, "POST" if "predict" in path else "GET", PREDICT_BODY
                if "predict" in path else None,
            )  # fmt: skip
            assert status == 404 and "No versions of servable m" in body["error"], body
    finally:
        server.stop()


def test_make_server_refuses_unreachable_names_and_version_folders():
    from apputil.errors import UsageError
    from serving.local.server import make_server

    _, base = exported("antisymmetric")
    for name in ("my/model", "", "a:b", "..", "tab\there"):
        with pytest.raises(UsageError, match="model_name"):
            make_server(base, name, port=0)
    with pytest.raises(UsageError, match="version folder"):
        make_server(os.path.join(base, "1"), "m", port=0)


def test_version_names_are_one_rule():
    from apputil.errors import UsageError
    from serving.names import MAX_VERSION, check_version, parse_version

    assert [parse_version(n) for n in ("7", "007", "0", str(MAX_VERSION))] == [
        7, 7, 0, MAX_VERSION,
    ]  # fmt: skip
    for name in (str(MAX_VERSION + 1), "²", "٣", "-1", "+1", " 1", "1.0", "", "0x1", "9" * 5000):
        assert parse_version(name) is None, name
    assert check_version(MAX_VERSION) == MAX_VERSION
    for bad in (0, -1, MAX_VERSION + 1, True, 1.0, "1"):
        with pytest.raises(UsageError, match="`version`"):
            check_version(bad)


def test_unknown_input_names_are_named():
    _, base = exported("antisymmetric")
    server = ThreadServer(base, "antisym")
    try:
        url = f"{server.url}/v1/models/antisym:predict"
        status, body = http_call(url, "POST", {"inputs": {"seqence": [[[0.5]] * 64]}})
        assert status == 400 and "seqence" in body["error"], body
        status, body = http_call(url, "POST", {"instances": [{"seqence": [[0.5]] * 64}]})
        assert status == 400 and "seqence" in body["error"], body
    finally:
        server.stop()


def test_export_errors_are_one_line(monkeypatch, capsys):
    """A full disk, an unwritable base, a base that is a file, out-of-range and
    clashing versions: one line each, status 1 or 2, no traceback."""
    import tensorflow as tf

    from serving.exports import export

    exported("antisymmetric")
    model = work_dir("antisymmetric.keras")
    base = work_dir("export-errors")
    os.makedirs(os.path.join(base, "007"), exist_ok=True)
    a_file = work_dir("export-errors-file")
    with open(a_file, "w") as f:
        f.write("x")

    def main(*args):
        capsys.readouterr()
        status = export.main(["--model", model, *args])
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in err[0], err
        return status, err[0]

    def full_disk(self, *args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")

    cases = [
        (["--export-base", base, "--version", str(2**63)], 2, "`version`"),
        (["--export-base", base, "--version", "7"], 2, "007"),
        (["--export-base", a_file, "--version", "1"], 2, "`export_base`"),
        (["--export-base", "/proc/keras-antisym-export", "--version", "1"], 1, "cannot write"),
    ]
    for args, expected_status, words in cases:
        status, line = main(*args)
        assert status == expected_status and words in line, line
    import keras

    archive_class = type(keras.export.ExportArchive())  # a backend-specific subclass
    monkeypatch.setattr(archive_class, "write_out", full_disk)
    status, line = main("--export-base", base, "--version", "1")
    assert status == 1 and "No space left on device" in line, line
    assert not [n for n in os.listdir(base) if n != "007"]  # no staging folder left


@pytest.mark.parametrize(
    "args, argument",
    [
        (["--url", "nonsense", "--model", "m", "status"], "`url`"),
        (["--url", "http://127.0.0.1:99999", "--model", "m", "status"], "`url`"),
        (["--url", "http://127.0.0.1:1", "--model", "my/model", "status"], "`model`"),
        (["--url", "http://127.0.0.1:1", "--model", "m", "--timeout", "-1", "status"], "`timeout`"),
    ],
)
def test_client_refuses_bad_flags_in_one_line(args, argument, capsys):
    from serving import client

    assert client.main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and argument in lines[0], lines
