"""waitress, tightened for the local server: JSON errors, strict framing, deadlines.

waitress parses HTTP (one Content-Length made of digits, chunked decoding, size
caps, idle timeout, connection limit, a fixed pool of worker threads) and reads
each whole request before the app sees it. On top, this module:

- answers waitress's own errors (400, 413, 431, 500) as `{"error": ...}` JSON
  and turns its 501 for an unknown Transfer-Encoding into a 400;
- refuses ambiguous framing that waitress tolerates (Transfer-Encoding with
  Content-Length, or on HTTP/1.0) with a 400 and closes the connection;
- closes connections that take longer than `request_timeout` to send one
  request (slow headers or body), which waitress's idle timeout misses;
- reads and drops what a refused client still sends for a few seconds before
  closing ("lingering close"), so that it reads the error instead of a reset.
"""

from __future__ import annotations

import json
import socket
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

LINGER_SECONDS = 5.0
LINGER_FACTOR = 4  # drop at most this many times the body cap while lingering


class StrictParser(HTTPRequestParser):
    """waitress's parser, refusing framing that two parsers could read differently."""

    def __init__(self, adj):
        super().__init__(adj)
        self.started = time.monotonic()  # the request timeout counts from the first byte

    def received(self, data):
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


class LocalWSGIServer(TcpWSGIServer):
    """waitress's TCP server with `request_timeout` and the channel above."""

    channel_class = LingeringChannel
    request_timeout = 30.0

    def maintenance(self, now):
        super().maintenance(now)
        mono = time.monotonic()
        for channel in list(self.active_channels.values()):
            request = channel.request
            if channel.linger_until and mono > channel.linger_until:
                channel.linger_until = 0.0
                HTTPChannel.handle_close(channel)
            elif (
                request is not None
                and not channel.requests
                and mono - request.started > self.request_timeout
            ):
                channel.will_close = True  # too slow: close without an answer


class ServerThread:
    """A `LocalWSGIServer` with `serve_forever`/`shutdown`/`server_close`.

    Args:
        app: The WSGI app.
        host: Interface to bind.
        port: TCP port (0: any free one).
        request_timeout: Seconds to receive one request's headers and body.
        **adjustments: waitress adjustments (threads, connection_limit, ...).
    """

    def __init__(
        self, app: Callable, host: str, port: int, request_timeout: float, **adjustments: Any
    ):
        self.adj = Adjustments(host=host, port=port, **adjustments)
        self._map = {}
        self.dispatcher = ThreadedTaskDispatcher()
        self.dispatcher.set_thread_count(self.adj.threads)
        self.server = LocalWSGIServer(
            app, self._map, dispatcher=self.dispatcher, adj=self.adj, sockinfo=self.adj.listen[0]
        )
        self.server.request_timeout = request_timeout
        self.server_address = (self.server.effective_host, int(self.server.effective_port))
        self._stop = threading.Event()
        self._stopped = threading.Event()

    def queued(self) -> int:
        """Requests waiting for a worker thread."""
        return len(self.dispatcher.queue)

    def serve_forever(self) -> None:
        """Run the event loop until `shutdown()`."""
        try:
            while not self._stop.is_set():
                wasyncore.loop(
                    timeout=self.adj.asyncore_loop_timeout,
                    map=self._map,
                    use_poll=self.adj.asyncore_use_poll,
                    count=1,
                )
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop the event loop (from another thread) and wait for it."""
        self._stop.set()
        self.server.pull_trigger()
        self._stopped.wait(10)

    def server_close(self) -> None:
        """Close the listening socket, the connections and the worker threads."""
        self.dispatcher.shutdown(timeout=5)
        wasyncore.close_all(self._map)
