"""waitress, tightened for the local server: JSON errors, strict framing, deadlines.

waitress parses HTTP (one Content-Length made of digits, chunked decoding, size
caps, idle timeout, connection limit, a fixed pool of worker threads) and reads
each whole request before the app sees it. On top, this module:

- answers waitress's own errors (400, 413, 431, 500) as `{"error": ...}` JSON
  and turns its 501 for an unknown Transfer-Encoding into a 400;
- refuses ambiguous framing that waitress tolerates (Transfer-Encoding with
  Content-Length, or on HTTP/1.0) with a 400 and closes the connection;
- closes connections that take longer than `header_timeout` to send a request's
  line and headers (counted from the connection's start for its first request) or
  `request_timeout` to send one whole request, which waitress's idle timeout misses;
- never invites a refused request's body: `Expect: 100-continue` with a
  Content-Length over the cap (or any other error in the head) gets the error at
  once, not "100 Continue";
- drains on request (`ServerThread.drain`, for SIGTERM): stops the kernel from
  completing new connections (`stop_handshakes`), accepts those it completed, closes
  the listener, answers what is in flight with `Connection: close`, then stops;
- reads and drops what a refused client still sends for a few seconds before
  closing ("lingering close"), so that it reads the error instead of a reset.
"""

from __future__ import annotations

import ctypes
import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser, ParsingError
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask, ThreadedTaskDispatcher
from waitress.utilities import BadRequest

log = logging.getLogger(__name__)

LINGER_SECONDS = 5.0
LINGER_FACTOR = 4  # drop at most this many times the body cap while lingering
# A draining server waits this long for the first request of a connection that has sent
# nothing yet: a client writes its request just after connecting.
FIRST_REQUEST_GRACE = 1.0
SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)  # Linux's number


class StrictParser(HTTPRequestParser):
    """waitress's parser, refusing framing that two parsers could read differently."""

    error: Any
    completed: bool

    def __init__(self, adj):
        super().__init__(adj)
        self.started = time.monotonic()  # the request timeout counts from the first byte

    def received(self, data):
        consumed = self._received(data)
        if self.error is not None:
            # waitress would still send "100 Continue" (and read the whole body) for a
            # request it has refused from its head, e.g. a Content-Length over the cap.
            self.expect_continue = False
        return consumed

    def _received(self, data):
        if self.body_rcv is None and not self.completed:
            # waitress waits for CRLF CRLF; a request ended by bare LFs would hang until
            # the request timeout, so refuse it now.
            head = self.header_plus + data
            bare, end = head.find(b"\n\n"), head.find(b"\r\n\r\n")
            if bare >= 0 and (end < 0 or bare < end):
                self.parse_header(b"GET / HTTP/1.0\r\n")  # sets what the error answer needs
                self.error = BadRequest("Bare LF in the request head (CRLF required)")
                self.completed = True
                return len(data)
        return super().received(data)

    def parse_header(self, header_plus):
        super().parse_header(header_plus)
        if self.chunked and "CONTENT_LENGTH" in self.headers:
            raise ParsingError("Both Transfer-Encoding and Content-Length")
        if self.version != "1.1" and "TRANSFER_ENCODING" in self.headers:
            raise ParsingError(f"Transfer-Encoding on HTTP/{self.version}")


class JsonErrorTask(ErrorTask):
    """waitress's error answer, as `{"error": ...}` JSON; the connection closes after it."""

    def execute(self):
        error = self.request.error
        code, reason = error.code, error.reason
        if code == 501:  # an unknown Transfer-Encoding: bad framing from the client
            code, reason = 400, "Bad Request"
        message = f"{reason}: {error.body}" if error.body else reason
        if code == 413:
            limit = self.channel.adj.max_request_body_size - 1  # waitress refuses >= its cap
            message = f"Request body exceeds the limit of {limit} bytes"
        body = json.dumps({"error": message}).encode()
        self.status = f"{code} {reason}"
        self.response_headers.append(("Content-Type", "application/json"))
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)
        self.channel.linger = True


class LingeringChannel(HTTPChannel):
    """A waitress channel that drains a refused client's input before closing."""

    error_task_class = JsonErrorTask
    parser_class = StrictParser
    linger = False  # set by JsonErrorTask: the client may still be sending
    linger_until = None
    seen_request = False  # a request arrived whole: later silence is keep-alive idling

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.opened = time.monotonic()  # the first request's header deadline counts from here

    def received(self, data):
        result = super().received(data)
        if self.requests:
            self.seen_request = True
            if self.server.draining:
                _close_after(self.requests)
        return result

    def busy(self) -> bool:
        """Whether a request is in progress here (partly received, queued, running, or
        its answer unsent or lingering); an idle keep-alive connection is not."""
        partial = self.request is not None and (
            self.request.header_plus or self.request.headers_finished
        )
        return (
            bool(self.requests or partial or self.total_outbufs_len or self.linger_until)
            and self.connected
        )

    def handle_close(self):
        if self.linger and self.linger_until is None and self.connected:
            try:
                self.socket.shutdown(socket.SHUT_WR)  # the answer is flushed: FIN, keep reading
            except OSError:
                pass
            else:
                self.linger_until = time.monotonic() + LINGER_SECONDS
                self.linger_left = LINGER_FACTOR * self.adj.max_request_body_size
                self.will_close = self.close_when_flushed = False
                return
        self.linger_until = 0.0
        super().handle_close()

    def readable(self):
        return bool(self.linger_until) or super().readable()

    def writable(self):
        return not self.linger_until and super().writable()

    def handle_read(self):
        if not self.linger_until:
            return super().handle_read()
        try:
            data = self.socket.recv(1 << 16)
        except OSError:
            data = b""
        self.linger_left -= len(data)
        if not data or self.linger_left <= 0 or time.monotonic() > self.linger_until:
            self.linger_until = 0.0
            super().handle_close()


# A classic BPF socket filter that drops a SYN without ACK (a new connection) and keeps
# every other packet. A listener's filter sees the TCP header at offset 0; its flags are
# byte 13 (SYN 0x02, ACK 0x10). The ACK that completes a handshake already under way
# still passes, so that connection reaches the backlog instead of being reset later.
_DROP_NEW_SYNS = b"".join(
    struct.pack("HBBI", code, jt, jf, k)
    for code, jt, jf, k in (
        (0x30, 0, 0, 13),  # ldb [13]: the flags
        (0x45, 2, 0, 0x10),  # jset #ACK: keep
        (0x45, 0, 1, 0x02),  # jset #SYN: drop, else keep
        (0x06, 0, 0, 0),  # ret #0: drop
        (0x06, 0, 0, 0xFFFFFFFF),  # ret #-1: keep the whole packet
    )
)
#: How long a draining server waits, after new SYNs are dropped, for the handshakes it
#: answered already to complete into the backlog (their ACK is in flight).
HANDSHAKE_GRACE_SECONDS = 0.05


def stop_handshakes(listener: socket.socket) -> str:
    """Make the kernel complete no new connection on `listener`; returns how.

    On Linux a socket filter that drops new SYNs is attached to it: they no
    longer reach it (the client sends its SYN again a second later), while the
    handshakes under way complete and the connections completed wait in its
    backlog, for `accept`. Elsewhere
    (or where the filter is refused) the backlog shrinks to its minimum
    (`listen(0)`), which leaves a shorter window. Returns `"filter"`, `"backlog"`
    or `"none"` (both failed: the socket is closed or not listening).
    """
    program = ctypes.create_string_buffer(_DROP_NEW_SYNS)
    fprog = struct.pack("HL", len(_DROP_NEW_SYNS) // 8, ctypes.addressof(program))  # sock_fprog
    try:
        listener.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
        return "filter"
    except (OSError, AttributeError):
        pass
    try:
        listener.listen(0)
        return "backlog"
    except OSError:
        return "none"


def _close_after(requests) -> None:
    """Answer these requests with `Connection: close` (waitress reads the header)."""
    for request in requests:
        request.headers["CONNECTION"] = "close"


def _has_input(sock: socket.socket) -> bool:
    """Whether bytes (or the client's FIN) wait unread on `sock`."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # b"" (a FIN) counts too
    except BlockingIOError:
        return False
    except OSError:
        return True  # let the channel's own read find the error
    return True


class LocalWSGIServer(TcpWSGIServer):
    """waitress's TCP server with header and request deadlines and the channel above."""

    channel_class = LingeringChannel
    request_timeout = 30.0
    header_timeout = 10.0
    draining = False

    def maintenance(self, now):
        super().maintenance(now)
        mono = time.monotonic()
        for channel in list(self.active_channels.values()):
            request = channel.request
            if channel.linger_until and mono > channel.linger_until:
                # Closed by the loop's write pass, as waitress closes channels: this runs
                # while the loop collects the sockets to select on, and closing here
                # would leave a closed one among them (select fails, the loop dies).
                channel.linger_until = 0.0
                channel.will_close = True
            elif channel.requests:
                continue  # complete: a worker answers it
            elif request is None:
                # Nothing sent yet on a new connection: it holds a slot like a slow
                # header. Idle keep-alive connections are waitress's channel_timeout's.
                if not channel.seen_request and mono - channel.opened > self.header_timeout:
                    channel.will_close = True
            elif mono - request.started > self.request_timeout or (
                not request.headers_finished
                and mono - (request.started if channel.seen_request else channel.opened)
                > self.header_timeout
            ):
                channel.will_close = True  # too slow: close without an answer

    def accept_pending(self) -> int:
        """Accept every connection waiting in the listen backlog; returns how many."""
        accepted = 0
        while True:
            try:
                pair = self.socket.accept()
            except OSError:  # EAGAIN: the backlog is empty
                return accepted
            conn, addr = pair
            conn.setblocking(False)
            try:
                self.set_socket_options(conn)
            except OSError:  # the client is gone already
                conn.close()
                continue
            self.channel_class(self, conn, self.fix_addr(addr), self.adj, map=self._map)
            accepted += 1


class ServerThread:
    """A `LocalWSGIServer` with `serve_forever`/`drain`/`shutdown`/`server_close`.

    Args:
        app: The WSGI app.
        host: Interface to bind.
        port: TCP port (0: any free one).
        request_timeout: Seconds to receive one request's headers and body.
        header_timeout: Seconds to receive a request's line and headers (for a
            connection's first request, from when it was accepted).
        **adjustments: waitress adjustments (threads, connection_limit, ...).
    """

    def __init__(
        self,
        app: Callable,
        host: str,
        port: int,
        request_timeout: float,
        header_timeout: float = 10.0,
        **adjustments: Any,
    ):
        self.adj = Adjustments(host=host, port=port, **adjustments)
        self._map: dict[int, Any] = {}
        self.dispatcher = ThreadedTaskDispatcher()
        self.dispatcher.set_thread_count(self.adj.threads)
        self.server = LocalWSGIServer(
            app, self._map, dispatcher=self.dispatcher, adj=self.adj, sockinfo=self.adj.listen[0]
        )
        self.server.request_timeout = request_timeout
        self.server.header_timeout = header_timeout
        self.server_address = (self.server.effective_host, int(self.server.effective_port))
        self._stop = threading.Event()
        self._stopped = threading.Event()
        # Plain attributes, not locks: `drain` is called from signal handlers.
        self._drain_deadline: float | None = None
        self._force = False
        self.dropped = 0  # requests cut off when a drain ran out of time or was forced

    def queued(self) -> int:
        """Requests waiting for a worker thread."""
        return len(self.dispatcher.queue)

    def drain(self, seconds: float) -> None:
        """Stop accepting, finish the requests in progress within `seconds`, then stop.

        Safe to call from a signal handler. A second call stops at once. After
        `serve_forever` returns, `dropped` counts the requests left unanswered.
        """
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + seconds
        else:
            self._force = True
        self.server.pull_trigger()  # a write to a pipe: wakes the event loop

    def serve_forever(self) -> None:
        """Run the event loop until `shutdown()`, or until a `drain` is done."""
        timeout = self.adj.asyncore_loop_timeout
        try:
            while not self._stop.is_set() and not self._force:
                if self._drain_deadline is not None:
                    if not self.server.draining:
                        self._begin_drain()
                        timeout = min(timeout, 0.1)  # check progress often
                    busy = self._close_idle()
                    if not busy:
                        log.info("drained: every HTTP request in progress was answered")
                        return
                    if time.monotonic() > self._drain_deadline:
                        break
                    self.server.maintenance(time.time())  # the listener ran it before
                wasyncore.loop(
                    timeout=timeout, map=self._map, use_poll=self.adj.asyncore_use_poll, count=1
                )
            if self.server.draining:
                self.dropped = self._close_idle(final=True)
                log.warning("stopped draining with %d HTTP requests unanswered", self.dropped)
        finally:
            self._stopped.set()

    def _begin_drain(self) -> None:
        server = self.server
        server.draining = True
        # Connections the kernel completed are clients that sent (or will send) a
        # request believing they were accepted: take them before closing the socket,
        # which would reset them. First the kernel is told to complete no more: new
        # SYNs are dropped, so a client retries its SYN and then finds the port closed
        # (refused, safe to retry) or the restarted server; none is completed between
        # the last accept and the close. A handshake the kernel answered before the
        # filter completes (its ACK passes): it is given a moment to reach the backlog.
        if stop_handshakes(server.socket) == "filter":
            time.sleep(HANDSHAKE_GRACE_SECONDS)
        accepted = server.accept_pending()
        server.accepting = False
        server.del_channel()
        server.socket.close()
        for channel in list(server.active_channels.values()):
            _close_after(channel.requests)
        left = (self._drain_deadline or time.monotonic()) - time.monotonic()
        log.info(
            "draining: not accepting connections (%d taken from the backlog), answering "
            "the requests in progress within %.1f s",
            accepted,
            max(left, 0.0),
        )

    def _close_idle(self, final: bool = False) -> int:
        """Close connections with no request in progress; returns how many have one.

        A connection opened less than `FIRST_REQUEST_GRACE` ago that has sent nothing
        yet is a client with its first request on the way (it connected, then writes):
        it is waited for, unless `final`. Idle keep-alive connections close at once.
        """
        busy = 0
        now = time.monotonic()
        for channel in list(self.server.active_channels.values()):
            arriving = (
                not final
                and channel.connected
                and not channel.seen_request
                and now - channel.opened < FIRST_REQUEST_GRACE
            )
            if channel.busy() or (channel.connected and _has_input(channel.socket)) or arriving:
                busy += 1
            else:
                channel.linger = False
                channel.handle_close()
        return busy

    def shutdown(self) -> None:
        """Stop the event loop (from another thread) and wait for it."""
        self._stop.set()
        self.server.pull_trigger()
        self._stopped.wait(10)

    def server_close(self) -> None:
        """Close the listening socket, the connections and the worker threads."""
        self.dispatcher.shutdown(timeout=5)
        wasyncore.close_all(self._map)
