"""The HTTP transport in this process: waitress's errors as JSON, lingering close, the drain.

A WSGI app that echoes what it read stands in for the model server (no TensorFlow);
every server listens on 127.0.0.1 only, every socket has a timeout.
"""

import collections
import contextlib
import errno
import json
import socket
import threading
import time
import types

import pytest
from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.parser import HTTPRequestParser

from serving.local import httpd
from tests.limits import limit

pytestmark = pytest.mark.timeout(120)

CAP = 1000  # the largest body the servers here accept
GOOD = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
BARE = b"GET /b HTTP/1.1\nHost: x\n\n"
LIMITS = {"max_request_header_size": 200}


def _echo(environ, start_response):
    body = json.dumps({"read": len(environ["wsgi.input"].read())}).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]


def _holding(release):
    """`_echo`, answering once `release` is set: a request held in flight."""

    def held(environ, start_response):
        release.wait(timeout=limit(60))
        return _echo(environ, start_response)

    return held


def _start(server):
    """`server.serve_forever` in a daemon thread; returns the thread."""
    worker = threading.Thread(target=server.serve_forever, daemon=True)
    worker.start()
    return worker


def _thread(**adjustments):
    """A ServerThread of `_echo`, not yet serving."""
    adjustments.setdefault("max_request_body_size", CAP + 1)  # as serving.local.server sets it
    return httpd.ServerThread(_echo, "127.0.0.1", 0, request_timeout=5.0, **adjustments)


@contextlib.contextmanager
def _serving(**adjustments):
    server = _thread(**adjustments)
    worker = _start(server)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        worker.join(timeout=limit(10))


def _connect(server, timeout=5.0):
    return socket.create_connection(server.server_address, timeout=timeout)


def _read_all(sock, deadline=10.0):
    """Everything the server sends until it closes: `(bytes, closed)`."""
    data, end = b"", time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return data, False
        if not chunk:
            return data, True
        data += chunk
    return data, False


def _answer(data):
    """`(status line, {header: value} as sent, body)` of one raw response."""
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return lines[0], headers, body


def _read_one(sock):
    """One whole response from a connection that stays open."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    line, headers, body = _answer(data)
    while len(body) < int(headers["Content-Length"]):
        body += sock.recv(65536)
    return line, headers, body


def _answers(data):
    """Every response in `data`, in order, as `_answer` gives one."""
    answers = []
    while data:
        line, headers, rest = _answer(data)
        length = int(headers["Content-Length"])
        answers.append((line, headers, rest[:length]))
        data = rest[length:]
    return answers


def _post(length, body=b""):
    head = f"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
    return head.encode() + body


def _waitress_error(data):
    """The error waitress's own parser finds in `data` (the reference)."""
    parser = HTTPRequestParser(Adjustments(max_request_body_size=CAP + 1, **LIMITS))
    while data and not parser.completed:
        data = data[parser.received(data) :]
    return parser.error


GZIP = b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"
NEGATIVE = _post(-1)
LONG_HEAD = b"GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 300 + b"\r\n\r\n"


@pytest.mark.parametrize(
    ("data", "status", "message"),
    [
        # waitress answers an unknown Transfer-Encoding with 501: it is the client's framing
        (GZIP, "400 Bad Request", lambda e: f"Bad Request: {e.body}"),
        (NEGATIVE, "400 Bad Request", lambda e: f"Bad Request: {e.body}"),
        (LONG_HEAD, "431 Request Header Fields Too Large", lambda e: f"{e.reason}: {e.body}"),
        (_post(CAP + 1), "413 Request Entity Too Large",
         lambda e: f"Request body exceeds the limit of {CAP} bytes"),
    ],
    ids=["unknown transfer-encoding", "negative content-length", "head too large", "body over cap"],
)  # fmt: skip
def test_waitress_errors_are_one_json_answer_then_close(data, status, message):
    expected = message(_waitress_error(data))
    with _serving(**LIMITS) as server, _connect(server) as sock:
        sock.sendall(data)
        raw, closed = _read_all(sock)
    line, headers, body = _answer(raw)
    assert line.split(" ", 1)[1] == status  # HTTP/1.0 when the head was not read
    assert headers["Content-Type"] == "application/json"
    assert headers["Connection"] == "close"
    assert int(headers["Content-Length"]) == len(body)
    assert json.loads(body) == {"error": expected}
    assert closed


CHUNKED = (
    "POST /x HTTP/{}\r\nHost: x\r\nTransfer-Encoding: chunked\r\n{}\r\n5\r\nhello\r\n0\r\n\r\n"
)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (CHUNKED.format("1.1", "Content-Length: 5\r\n").encode() + GOOD,
         "Bad Request: Both Transfer-Encoding and Content-Length"),
        (CHUNKED.format("1.0", "").encode() + GOOD, "Bad Request: Transfer-Encoding on HTTP/1.0"),
    ],
    ids=["chunked with content-length", "chunked on HTTP/1.0"],
)  # fmt: skip
def test_ambiguous_framing_is_refused_and_nothing_after_it_is_read(data, message):
    with _serving() as server, _connect(server) as sock:
        sock.sendall(data)
        raw, closed = _read_all(sock)
    (answer,) = _answers(raw)  # GOOD, after the body, is never read as a request
    assert answer[0].split(" ", 1)[1] == "400 Bad Request"
    assert json.loads(answer[2]) == {"error": message}
    assert closed


def test_http_1_0_without_transfer_encoding_is_answered():
    with _serving() as server, _connect(server) as sock:
        sock.sendall(_post(2, b"{}").replace(b"HTTP/1.1", b"HTTP/1.0"))
        raw, _ = _read_all(sock)
    line, _, body = _answer(raw)
    assert (line, json.loads(body)) == ("HTTP/1.0 200 OK", {"read": 2})


def test_a_chunked_body_is_read():
    with _serving() as server, _connect(server) as sock:
        sock.sendall(CHUNKED.format("1.1", "").encode())
        line, _, body = _read_one(sock)
    assert (line, json.loads(body)) == ("HTTP/1.1 200 OK", {"read": 5})


def test_a_body_of_exactly_the_cap_is_read():
    with _serving() as server, _connect(server) as sock:
        sock.sendall(_post(CAP, b"x" * CAP))
        line, _, body = _read_one(sock)
    assert line == "HTTP/1.1 200 OK"
    assert json.loads(body) == {"read": CAP}


def test_a_refused_client_still_sending_reads_its_answer():
    """The server reads and drops the rest of a refused body instead of resetting the
    connection, which would destroy the answer in the client's buffer."""
    with _serving() as server, _connect(server) as sock:
        sock.sendall(_post(64 * CAP))
        time.sleep(0.3)  # the answer is sent and the server has closed its side
        with contextlib.suppress(OSError):
            for _ in range(16):
                sock.sendall(b"y" * (4 * CAP))
                time.sleep(0.01)
        raw, closed = _read_all(sock)
    line, _, body = _answer(raw)
    assert line.startswith("HTTP/1.1 413"), raw[:200]
    assert "exceeds the limit" in json.loads(body)["error"]
    assert closed


def test_has_input_peeks_without_consuming():
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)  # as the channels' sockets are
        assert httpd._has_input(a) is False
        b.sendall(b"xy")
        time.sleep(0.05)
        assert httpd._has_input(a) is True
        assert a.recv(10) == b"xy"  # still there for the channel's own read
        assert httpd._has_input(a) is False
        b.shutdown(socket.SHUT_WR)
        time.sleep(0.05)
        assert httpd._has_input(a) is True  # the client's FIN counts
    assert httpd._has_input(a) is True  # closed: the channel's read finds the error


def test_close_after_asks_every_request_for_connection_close():
    class Request:
        def __init__(self):
            self.headers = {"CONNECTION": "keep-alive", "HOST": "x"}

    requests = [Request(), Request()]
    httpd._close_after(requests)
    assert [r.headers for r in requests] == [{"CONNECTION": "close", "HOST": "x"}] * 2


def test_draining_answers_keep_alive_requests_with_connection_close():
    with _serving() as server, _connect(server) as sock:
        server.server.draining = True
        sock.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
        raw, closed = _read_all(sock)
    line, headers, _ = _answer(raw)
    assert line == "HTTP/1.1 200 OK"
    assert headers["Connection"] == "close"
    assert closed


def _pump(server, until, seconds=5.0):
    end = time.monotonic() + seconds
    while not until() and time.monotonic() < end:
        wasyncore.loop(timeout=0.05, map=server._map, count=1)
    assert until()


def test_accept_pending_takes_the_whole_backlog():
    server = _thread()
    try:
        clients = [_connect(server) for _ in range(3)]
        time.sleep(0.1)  # the kernel completes the handshakes
        assert server.server.accept_pending() == 3
        assert server.server.accept_pending() == 0
        channels = list(server.server.active_channels.values())
        assert len(channels) == 3
        assert all(not channel.socket.getblocking() for channel in channels)
        names = sorted(client.getsockname() for client in clients)
        assert sorted(channel.addr for channel in channels) == names
        for client in clients:
            client.close()
    finally:
        server.server_close()


def test_accept_pending_skips_a_client_gone_before_its_options(monkeypatch):
    server = _thread()
    set_options, calls = server.server.set_socket_options, []

    def flaky(conn):
        calls.append(conn)
        if len(calls) == 1:
            raise OSError("gone")
        set_options(conn)

    monkeypatch.setattr(server.server, "set_socket_options", flaky)
    try:
        clients = [_connect(server) for _ in range(3)]
        time.sleep(0.1)
        assert server.server.accept_pending() == 2
        assert len(server.server.active_channels) == 2
        assert calls[0].fileno() == -1  # closed
        for client in clients:
            client.close()
    finally:
        server.server_close()


def test_busy_is_a_request_in_progress_on_an_open_connection():
    server = _thread()
    try:
        with _connect(server) as client:
            time.sleep(0.1)
            assert server.server.accept_pending() == 1
            (channel,) = server.server.active_channels.values()
            assert channel.busy() is False  # idle keep-alive
            client.sendall(b"GET /x HTTP/1.1\r\nHo")  # half a head
            _pump(server, lambda: channel.request is not None)
            assert channel.request.header_plus and not channel.request.headers_finished
            assert channel.busy() is True
            channel.request = None
            assert channel.busy() is False
            channel.total_outbufs_len = 10  # an answer not yet flushed
            assert channel.busy() is True
            channel.total_outbufs_len = 0
            channel.linger_until = time.monotonic() + 1  # reading what a refused client sends
            assert channel.busy() is True
            channel.linger_until = None
            channel.connected = False
            channel.total_outbufs_len = 10
            assert channel.busy() is False  # gone: nothing left to answer
    finally:
        server.server_close()


class _ListenFails:
    """A listening socket whose `listen` fails (the drain must go on without it)."""

    def __init__(self, sock):
        self._sock = sock

    def listen(self, backlog):
        raise OSError("listen failed")

    def __getattr__(self, name):
        return getattr(self._sock, name)


@pytest.mark.parametrize("listen_fails", [False, True], ids=["listen", "listen fails"])
def test_drain_answers_the_backlog_and_says_so(caplog, listen_fails):
    """Connections the kernel completed before the drain are clients with a request on
    the way: taken from the backlog and answered (closing), then the loop returns."""
    server = _thread()
    if listen_fails:
        server.server.socket = _ListenFails(server.server.socket)
    clients = [_connect(server) for _ in range(2)]
    for client in clients:
        client.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.1)
    worker = threading.Thread(target=server.serve_forever, daemon=True)
    try:
        with caplog.at_level("INFO", logger="serving"):
            server.drain(0.9)  # under a second: the log shows it, not a floor of 1
            worker.start()
            worker.join(timeout=limit(10))
        assert not worker.is_alive()
        for client in clients:
            raw, closed = _read_all(client)
            line, headers, body = _answer(raw)
            assert (line, headers["Connection"], closed) == ("HTTP/1.1 200 OK", "close", True)
        assert server.dropped == 0
        first, last = caplog.messages[0], caplog.messages[-1]
        within = float(first.rsplit(" ", 2)[1])
        assert first == (
            "draining: not accepting connections (2 taken from the backlog), answering "
            f"the requests in progress within {within:.1f} s"
        )
        assert 0.0 < within <= 0.9
        assert last == "drained: every HTTP request in progress was answered"
    finally:
        for client in clients:
            client.close()
        server.server_close()


class _RecordedSleeps:
    """`time` as `serving.local.httpd` sees it, with every `sleep` recorded."""

    def __init__(self):
        self.sleeps = []

    def __getattr__(self, name):
        return getattr(time, name)

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        time.sleep(seconds)


@pytest.mark.parametrize("how", ["filter", "backlog", "none"])
def test_the_drain_waits_for_late_handshakes_only_after_a_filter(monkeypatch, how):
    """A handshake the kernel answered before the filter still completes: the drain gives
    it a moment to reach the backlog. A shrunken backlog completes none, so no wait."""
    clock = _RecordedSleeps()
    monkeypatch.setattr(httpd, "time", clock)
    monkeypatch.setattr(httpd, "stop_handshakes", lambda listener: how)
    monkeypatch.setattr(httpd, "HANDSHAKE_GRACE_SECONDS", 0.0173)  # told apart from others
    server = _thread()
    worker = threading.Thread(target=server.serve_forever, daemon=True)
    try:
        server.drain(0.5)
        worker.start()
        worker.join(timeout=limit(10))
        assert not worker.is_alive()
    finally:
        server.server_close()
    assert clock.sleeps.count(0.0173) == (1 if how == "filter" else 0)


def test_after_stop_handshakes_the_kernel_completes_no_connection_but_keeps_the_backlog():
    """Linux: the listener drops SYNs (a client's connect waits), while a connection
    completed before waits in the backlog and is accepted and answered."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = listener.getsockname()
        early = socket.create_connection(address, timeout=5)
        assert httpd.stop_handshakes(listener) == "filter"
        late = socket.socket()
        late.settimeout(0.5)
        with pytest.raises(TimeoutError):
            late.connect(address)  # its SYN was dropped: no connection to reset later
        accepted, _ = listener.accept()
        with accepted, early:
            early.sendall(b"ping")
            assert accepted.recv(4) == b"ping"
        late.close()


def test_stop_handshakes_falls_back_to_the_smallest_backlog():
    class NoFilter:
        backlog = None

        def setsockopt(self, *args):
            raise OSError("no socket filters here")

        def listen(self, backlog):
            self.backlog = backlog

    listener = NoFilter()
    assert httpd.stop_handshakes(listener) == "backlog" and listener.backlog == 0

    class Closed(NoFilter):
        def listen(self, backlog):
            raise OSError("not listening")

    assert httpd.stop_handshakes(Closed()) == "none"


def _hammer(port, stop, outcomes):
    """A client sending one request per connection until `stop`: counts each outcome."""
    while not stop.is_set():
        sock = socket.socket()
        sock.settimeout(10)
        try:
            sock.connect(("127.0.0.1", port))
        except OSError as error:  # refused (or reset) before anything was sent: retried
            outcomes.append("refused" if error.errno == errno.ECONNREFUSED else "reset early")
            sock.close()
            time.sleep(0.002)
            continue
        try:
            sock.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            raw, _ = _read_all(sock)
            outcomes.append("answered" if raw.startswith(b"HTTP/1.1 200") else "lost")
        except OSError:  # reset after the request went out: the client cannot tell
            outcomes.append("lost")
        finally:
            sock.close()


def test_twenty_drains_under_traffic_lose_no_request():
    """4 clients connect and send a request on a fresh connection again and again while
    the server drains: every request sent is answered, every refusal comes before a
    request was sent, in 20 drains in a row. (Closing the listener with connections
    the kernel completed after the last accept resets them: a few per 40 drains.)"""
    for run in range(20):
        server = _thread(threads=2)
        worker = _start(server)
        stop, outcomes = threading.Event(), []
        clients = [
            threading.Thread(target=_hammer, args=(server.server_address[1], stop, outcomes),
                             daemon=True)
            for _ in range(4)
        ]  # fmt: skip
        for client in clients:
            client.start()
        deadline = time.monotonic() + limit(10)
        while outcomes.count("answered") < 20 and time.monotonic() < deadline:
            time.sleep(0.005)
        server.drain(5)
        worker.join(timeout=limit(10))
        stop.set()
        for client in clients:
            client.join(timeout=limit(30))
        server.server_close()
        assert server.dropped == 0, run
        assert outcomes.count("answered") >= 20, run
        assert set(outcomes) <= {"answered", "refused"}, (run, collections.Counter(outcomes))


def test_a_second_drain_stops_at_once_and_counts_what_it_cut_off():
    release = threading.Event()

    server = httpd.ServerThread(_holding(release), "127.0.0.1", 0, request_timeout=5.0, threads=2)
    worker = _start(server)
    clients = [_connect(server) for _ in range(2)]
    try:
        for client in clients:
            client.sendall(GOOD)
        time.sleep(0.3)  # both requests are with the app
        server.drain(60.0)
        worker.join(timeout=0.5)
        assert worker.is_alive()  # waiting for the held requests
        server.drain(60.0)
        worker.join(timeout=5)
        assert not worker.is_alive()
        assert server.dropped == 2
    finally:
        release.set()
        for client in clients:
            client.close()
        server.server_close()


def test_drain_closes_idle_connections_without_waiting_for_them():
    server = _thread()
    worker = _start(server)
    try:
        with _connect(server) as idle:
            idle.sendall(GOOD)
            assert _read_one(idle)[0] == "HTTP/1.1 200 OK"
            start = time.monotonic()
            server.drain(3.0)
            worker.join(timeout=limit(10))
            assert time.monotonic() - start < 2.5  # not the drain's 3 s
            assert server.dropped == 0
            assert _closed_within(idle, 1)
    finally:
        server.server_close()


BARE_LF = "Bad Request: Bare LF in the request head (CRLF required)"


@pytest.mark.parametrize(
    ("data", "answered"),
    [
        (BARE, 0),
        (b"\n\n" + GOOD, 0),  # bare line ends from the first byte
        (GOOD + BARE + GOOD, 1),  # the first is answered, the bare one ends the connection
        (BARE + GOOD + b"\n\n", 0),  # a later CRLF CRLF does not excuse the bare one
    ],
    ids=["bare", "leading bare", "good, bare, good", "bare, good"],
)
def test_bare_lf_heads_are_refused_where_they_start(data, answered):
    """A head ended by bare LFs is refused at once, not left to wait for a CRLF CRLF that
    a lax parser would find in the next request."""
    with _serving() as server, _connect(server) as sock:
        sock.sendall(data)
        raw, closed = _read_all(sock)
    answers = _answers(raw)
    assert [a[0].split(" ", 1)[1] for a in answers] == ["200 OK"] * answered + ["400 Bad Request"]
    assert json.loads(answers[-1][2]) == {"error": BARE_LF}
    assert closed


def test_blank_lines_inside_a_body_are_not_framing():
    body = b"\n\n{}\n\n"
    with _serving() as server, _connect(server) as sock:
        sock.sendall(_post(len(body)))
        time.sleep(0.1)  # the body arrives after the head was parsed
        sock.sendall(body)
        line, _, answer = _read_one(sock)
    assert (line, json.loads(answer)) == ("HTTP/1.1 200 OK", {"read": len(body)})


def _closed_within(sock, seconds):
    """Whether the server closes `sock` (without an answer) within `seconds`."""
    sock.settimeout(seconds)
    try:
        return sock.recv(100) == b""
    except TimeoutError:
        return False


def test_slow_heads_and_bodies_are_cut_off():
    """No answer, the connection closed: nothing sent or half a head past
    `header_timeout`, a trickling body past `request_timeout`; an idle keep-alive
    connection after a whole request is not a slow head."""
    server = httpd.ServerThread(
        _echo, "127.0.0.1", 0, request_timeout=2.5, header_timeout=1.0, cleanup_interval=1
    )
    worker = _start(server)
    try:
        silent, half, trickle, idle = (_connect(server) for _ in range(4))
        start = time.monotonic()
        half.sendall(b"GET /x HTTP/1.1\r\nHo")
        trickle.sendall(_post(20))
        idle.sendall(GOOD)
        assert _read_one(idle)[0] == "HTTP/1.1 200 OK"
        assert _closed_within(silent, 5) and _closed_within(half, 5)
        assert time.monotonic() - start < 4.0
        while time.monotonic() - start < 2.0:  # past the header timeout, within the request's
            trickle.sendall(b"x")
            time.sleep(0.2)
        assert not _closed_within(trickle, 0.1)
        assert _closed_within(trickle, 5)
        assert not _closed_within(idle, 0.5)
        idle.sendall(GOOD)
        assert _read_one(idle)[0] == "HTTP/1.1 200 OK"
        for sock in (silent, half, trickle, idle):
            sock.close()
    finally:
        server.shutdown()
        server.server_close()
        worker.join(timeout=limit(10))


def test_server_close_closes_the_listener_and_every_connection():
    server = _thread()
    with _connect(server) as client:
        time.sleep(0.1)
        assert server.server.accept_pending() == 1
        server.server_close()
        assert _closed_within(client, 5)
    with pytest.raises(ConnectionRefusedError):
        _connect(server).close()


def _wait_until(condition, seconds):
    end = time.monotonic() + seconds
    while not condition() and time.monotonic() < end:
        time.sleep(0.02)
    return condition()


def _refused(server):
    """A connection whose request was refused (body over the cap): answer read, lingering."""
    sock = _connect(server)
    sock.sendall(_post(64 * CAP))
    line, headers, _ = _read_one(sock)
    assert line == "HTTP/1.1 413 Request Entity Too Large"
    assert sock.recv(10) == b""  # the server's FIN: the answer is complete
    assert len(server.server.active_channels) == 1  # still reading what the client sends
    return sock


def test_lingering_reads_and_drops_until_the_client_closes(monkeypatch):
    monkeypatch.setattr(httpd, "LINGER_SECONDS", 30.0)
    with _serving(cleanup_interval=1) as server:
        with _refused(server) as sock:
            sock.sendall(GOOD)  # read and dropped: no answer to a request after a refusal
            time.sleep(0.6)
            assert len(server.server.active_channels) == 1
            sock.shutdown(socket.SHUT_WR)
            assert _wait_until(lambda: not server.server.active_channels, 2)
            assert sock.recv(10) == b""


def test_lingering_stops_after_four_times_the_cap(monkeypatch):
    monkeypatch.setattr(httpd, "LINGER_SECONDS", 30.0)
    with _serving(cleanup_interval=1) as server, _refused(server) as sock:
        budget = httpd.LINGER_FACTOR * (CAP + 1)  # of waitress's max_request_body_size
        sock.sendall(b"y" * (budget - 100))
        time.sleep(0.3)
        assert len(server.server.active_channels) == 1  # under the budget: still reading
        with contextlib.suppress(OSError):
            sock.sendall(b"y" * 100)  # exactly the budget
        assert _wait_until(lambda: not server.server.active_channels, 2)


@pytest.mark.parametrize("use_poll", [False, True], ids=["select", "poll"])
def test_lingering_stops_after_its_seconds(monkeypatch, use_poll):
    monkeypatch.setattr(httpd, "LINGER_SECONDS", 0.5)
    with _serving(cleanup_interval=1, asyncore_use_poll=use_poll) as server, _refused(server):
        start = time.monotonic()
        assert _wait_until(lambda: not server.server.active_channels, 5)
        assert 0.4 < time.monotonic() - start < 2.5  # the next maintenance after 0.5 s
        time.sleep(1.5)  # the loop goes on (closing under its select would have ended it)
        with _connect(server) as sock:
            sock.sendall(GOOD)
            assert _read_one(sock)[0] == "HTTP/1.1 200 OK"


def test_drain_returns_soon_after_the_last_answer():
    release = threading.Event()

    server = httpd.ServerThread(_holding(release), "127.0.0.1", 0, request_timeout=5.0)
    worker = _start(server)
    try:
        with _connect(server) as client:
            client.sendall(GOOD)
            time.sleep(0.3)
            server.drain(30.0)
            time.sleep(0.3)
            released = time.monotonic()
            release.set()
            worker.join(timeout=limit(10))
            assert time.monotonic() - released < 2.0
            assert _read_one(client)[1]["Connection"] == "close"
            assert server.dropped == 0
    finally:
        release.set()
        server.server_close()


def test_drain_stops_at_its_deadline_without_waiting_for_events(caplog):
    release = threading.Event()

    server = httpd.ServerThread(_holding(release), "127.0.0.1", 0, request_timeout=5.0)
    worker = _start(server)
    try:
        with _connect(server) as client:
            client.sendall(GOOD)
            time.sleep(0.3)
            start = time.monotonic()
            with caplog.at_level("INFO", logger="serving"):
                server.drain(0.3)
                worker.join(timeout=limit(10))
            # Checked every 0.1 s while draining: the deadline is not overrun by the
            # loop's idle wait (1 s, and 30 s for waitress's loop), though no socket stirs.
            assert 0.3 <= time.monotonic() - start < 0.9
            assert server.dropped == 1
            assert caplog.messages[-1] == "stopped draining with 1 HTTP requests unanswered"
    finally:
        release.set()
        server.server_close()


def test_server_thread_defaults():
    server = httpd.ServerThread(_echo, "127.0.0.1", 0, request_timeout=7.0)
    try:
        assert (server.server.request_timeout, server.server.header_timeout) == (7.0, 10.0)
        assert server.server_address[0] == "127.0.0.1" and server.server_address[1] > 0
        assert server.dropped == 0
    finally:
        server.server_close()


def test_a_request_being_answered_does_not_shield_a_slow_client():
    release = threading.Event()

    server = httpd.ServerThread(
        _holding(release),
        "127.0.0.1",
        0,
        request_timeout=30.0,
        header_timeout=1.0,
        cleanup_interval=1,
    )
    worker = _start(server)
    try:
        with _connect(server) as answered, _connect(server) as slow:
            answered.sendall(GOOD)  # first in the server's table of connections
            slow.sendall(b"GET /x HTTP/1.1\r\nHo")
            assert _closed_within(slow, 5)
            release.set()
            assert _read_one(answered)[0] == "HTTP/1.1 200 OK"
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        worker.join(timeout=limit(10))


def test_a_connection_closed_after_its_answer_is_released_at_once():
    """Only a refused client is lingered on; `Connection: close` ends the connection."""
    with _serving() as server, _connect(server) as sock:
        sock.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw, closed = _read_all(sock)
        assert _answer(raw)[0] == "HTTP/1.1 200 OK" and closed
        assert _wait_until(lambda: not server.server.active_channels, 1.0)  # sock still open


def test_a_client_resetting_while_lingered_on_is_released_at_once(monkeypatch):
    import struct

    monkeypatch.setattr(httpd, "LINGER_SECONDS", 30.0)
    with _serving(cleanup_interval=1) as server:
        sock = _refused(server)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset, not a FIN: the server's read fails
        assert _wait_until(lambda: not server.server.active_channels, 2.0)


def test_an_idle_keep_alive_connection_costs_no_cpu():
    """The loop sleeps in select while a connection waits: nothing to write is not writable."""
    import resource

    def cpu():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    with _serving() as server, _connect(server) as sock:
        sock.sendall(GOOD)
        assert _read_one(sock)[0] == "HTTP/1.1 200 OK"
        before = cpu()
        time.sleep(1.0)
        assert cpu() - before < 0.3  # a loop spinning on a writable socket takes the second


@pytest.mark.parametrize("use_poll", [True, False])
def test_the_event_loop_polls_or_selects_as_adjusted(monkeypatch, use_poll):
    """`asyncore_use_poll` reaches the loop: select() fails on descriptors above 1,023."""
    server = _thread(asyncore_use_poll=use_poll)
    calls = []

    def loop(**kwargs):
        calls.append(kwargs)
        server._stop.set()

    monkeypatch.setattr(httpd.wasyncore, "loop", loop)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    assert calls == [{"timeout": server.adj.asyncore_loop_timeout, "map": server._map,
                      "use_poll": use_poll, "count": 1}]  # fmt: skip


# --- Deadlines at their boundaries, on a stand-in clock ------------------------------------------


class _Request:
    def __init__(self, started, headers_finished=False):
        self.started, self.headers_finished = started, headers_finished


class _Channel:
    """What `maintenance` reads and writes of a channel."""

    def __init__(self, opened=0.0, seen_request=False, request=None, linger_until=0.0):
        self.opened, self.seen_request, self.request = opened, seen_request, request
        self.linger_until, self.requests = linger_until, []
        self.last_activity = time.time()  # idle by waitress's own measure: never
        self.will_close = False


def _closed_at(monkeypatch, channel, mono):
    """Whether one maintenance pass at monotonic time `mono` closes `channel`."""
    server = object.__new__(httpd.LocalWSGIServer)  # the pass reads only these attributes
    server.active_channels = {0: channel}
    server.adj = Adjustments(channel_timeout=3600)
    channel.will_close = False
    with monkeypatch.context() as patched:
        patched.setattr(httpd.time, "monotonic", lambda: mono)
        server.maintenance(time.time())
    return channel.will_close


def test_a_silent_new_connection_is_closed_only_after_the_header_timeout(monkeypatch):
    timeout = httpd.LocalWSGIServer.header_timeout
    channel = _Channel(opened=100.0)
    assert not _closed_at(monkeypatch, channel, 100.0 + timeout)
    assert _closed_at(monkeypatch, channel, 100.0 + timeout + 0.5)


def test_a_request_is_cut_off_only_after_the_request_timeout(monkeypatch):
    timeout = httpd.LocalWSGIServer.request_timeout
    channel = _Channel(opened=0.0, seen_request=True, request=_Request(50.0, True))
    assert not _closed_at(monkeypatch, channel, 50.0 + timeout)
    assert _closed_at(monkeypatch, channel, 50.0 + timeout + 0.5)


def test_a_keep_alive_request_s_header_deadline_counts_from_its_start(monkeypatch):
    """On a connection that was answered before, a slow head is timed from when it began,
    not from when the connection opened; the first head from the opening."""
    timeout = httpd.LocalWSGIServer.header_timeout
    later = _Channel(opened=0.0, seen_request=True, request=_Request(100.0))
    assert not _closed_at(monkeypatch, later, 100.0 + timeout / 2)
    assert not _closed_at(monkeypatch, later, 100.0 + timeout)
    assert _closed_at(monkeypatch, later, 100.0 + timeout + 0.5)
    first = _Channel(opened=100.0, request=_Request(103.0))
    assert not _closed_at(monkeypatch, first, 100.0 + timeout)
    assert _closed_at(monkeypatch, first, 100.0 + timeout + 0.5)


def test_lingering_ends_only_after_its_deadline(monkeypatch):
    channel = _Channel(opened=199.0, seen_request=True, linger_until=200.0)
    assert not _closed_at(monkeypatch, channel, 200.0)
    assert channel.linger_until == 200.0
    assert _closed_at(monkeypatch, channel, 200.5)
    assert channel.linger_until == 0.0


class _Socket:
    def __init__(self, data):
        self.data = data

    def recv(self, size):
        data, self.data = self.data[:size], self.data[size:]
        return data


def test_lingering_reads_on_while_one_byte_of_its_allowance_is_left(monkeypatch):
    closed = []
    monkeypatch.setattr(httpd.HTTPChannel, "handle_close", lambda self: closed.append(self))
    channel = object.__new__(httpd.LingeringChannel)  # handle_read reads only these
    channel.linger_until, channel.linger_left = time.monotonic() + limit(60), 10
    channel.socket = _Socket(b"x" * 9)
    channel.handle_read()
    assert (channel.linger_left, closed) == (1, [])
    channel.socket = _Socket(b"y")
    channel.handle_read()
    assert (channel.linger_left, closed, channel.linger_until) == (0, [channel], 0.0)


def test_drain_waits_for_the_first_request_of_a_connection_just_accepted():
    """A client that connected before the drain writes its request a moment later: it is
    answered (closing), not cut off as an idle connection."""
    server = _thread()
    worker = _start(server)
    try:
        with _connect(server) as client:
            assert _wait_until(lambda: len(server.server.active_channels) == 1, 5)
            server.drain(3.0)
            time.sleep(0.3)  # the drain has begun: the connection is still open
            client.sendall(GOOD)
            raw, closed = _read_all(client)
            line, headers, _ = _answer(raw)
            assert (line, headers["Connection"], closed) == ("HTTP/1.1 200 OK", "close", True)
        worker.join(timeout=limit(10))
        assert not worker.is_alive() and server.dropped == 0
    finally:
        server.server_close()


class _StandInChannel:
    """What `_close_idle` reads of a channel, and whether it closed it."""

    def __init__(self, opened, seen_request=False, busy=False):
        self.opened, self.seen_request, self._busy = opened, seen_request, busy
        self.connected, self.socket, self.linger, self.closed = True, None, True, False

    def busy(self):
        return self._busy

    def handle_close(self):
        self.closed = True


@pytest.mark.parametrize("final", [False, True])
def test_close_idle_waits_only_for_a_first_request_within_its_grace(final, monkeypatch):
    """On a stand-in clock at 100 s: a connection opened exactly `FIRST_REQUEST_GRACE` ago
    with nothing sent is idle, one opened half of it ago is arriving (unless `final`), a
    keep-alive one that has had a request is idle whatever its age, a busy one stays.
    Closed ones do not linger."""
    # The module's clock alone (other threads keep the real one).
    clock = types.SimpleNamespace(monotonic=lambda: 100.0, time=time.time, sleep=time.sleep)
    monkeypatch.setattr(httpd, "time", clock)
    monkeypatch.setattr(httpd, "_has_input", lambda sock: False)
    grace = httpd.FIRST_REQUEST_GRACE
    channels = {
        "at the grace": _StandInChannel(100.0 - grace),
        "arriving": _StandInChannel(100.0 - grace / 2),
        "kept alive": _StandInChannel(100.0 - grace / 2, seen_request=True),
        "busy": _StandInChannel(0.0, seen_request=True, busy=True),
    }
    server = _thread()
    try:
        server.server.active_channels = dict(enumerate(channels.values()))
        busy = server._close_idle(final=final)
    finally:
        server.server.active_channels = {}
        server.server_close()
    open_ = {"busy"} if final else {"busy", "arriving"}
    assert busy == len(open_)
    for name, channel in channels.items():
        assert channel.closed == (name not in open_), name
        assert channel.linger is (name in open_), name  # closed: no lingering read


def test_a_drain_that_runs_out_closes_a_silent_new_connection_without_counting_it(caplog):
    """A client that connected and has sent nothing when the deadline (well within its
    first request's grace) passes has no request to cut off: it is closed, not counted."""
    server = _thread()
    worker = _start(server)
    try:
        with _connect(server) as client:
            assert _wait_until(lambda: len(server.server.active_channels) == 1, 5)
            with caplog.at_level("INFO", logger="serving"):
                server.drain(0.2)
                worker.join(timeout=limit(10))
            assert not worker.is_alive() and server.dropped == 0
            assert caplog.messages[-1] == "stopped draining with 0 HTTP requests unanswered"
            assert _read_all(client) == (b"", True)
    finally:
        server.server_close()
