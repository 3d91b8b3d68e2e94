"""The local server under abuse: slow and idle connections, huge bodies, saturation.

Each test starts a real server on 127.0.0.1 and is bounded in time.
"""

import json
import os
import re
import sys
import threading
import time

import pytest

from tests.serving_helpers import ServerProcess, ThreadServer, exported, http_call

pytestmark = pytest.mark.timeout(180)


def _proc_status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith(field + ":")))


def _cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module")
def limited():
    """A server with short timeouts under `ulimit -n 256`, default body and element caps."""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc and sets RLIMIT_NOFILE")
    _, base = exported("antisymmetric")
    server = ServerProcess(
        base, "antisym", nofile=256,
        extra_args=["--request-timeout", "1", "--channel-timeout", "2", "--threads", "2"],
    )  # fmt: skip
    try:
        yield server
    finally:
        server.stop()


def test_slow_and_idle_connections_are_bounded(limited):
    """300 connections sending partial headers or nothing: no thread each, no spin, closed."""
    import socket

    pid, url = limited.process.pid, limited.url
    host, port = re.match(r"http://([^/:]+):(\d+)", url).groups()
    threads_before = _proc_status(pid, "Threads")
    cpu_before = _cpu_seconds(pid)
    sockets = []
    try:
        for i in range(300):
            sock = socket.create_connection((host, int(port)), timeout=10)
            sockets.append(sock)
            if i % 2:
                sock.sendall(b"POST /v1/models/antisym:predict HTTP/1.1\r\nHost: x\r\n")
        time.sleep(1.5)
        assert _proc_status(pid, "Threads") <= threads_before + 2
        start = time.monotonic()
        status, answer = http_call(f"{url}/v1/models/antisym", timeout=30)
        waited = time.monotonic() - start
        assert status == 200, answer
        assert waited < 20, waited
        assert _cpu_seconds(pid) - cpu_before < 0.5 * (time.monotonic() - start + 1.5) + 1
        for sock in sockets:  # each one closed by the server, none answered
            sock.settimeout(15)
            assert sock.recv(100) == b""
    finally:
        for sock in sockets:
            sock.close()
    assert limited.process.poll() is None
    print(f"\n300 slow connections: a good request waited {waited:.1f} s")


def test_large_bodies_are_refused_cheaply(limited):
    """4 concurrent 16 MiB bodies of `[0],`: 400 within seconds, little memory."""
    pid, url = limited.process.pid, limited.url
    body = b'{"instances": [' + b"[0]," * ((16 << 20) // 4 - 8) + b"[0]]}"
    rss_before = _proc_status(pid, "VmRSS")
    results = []

    def post():
        start = time.monotonic()
        status, answer = http_call(f"{url}/v1/models/antisym:predict", "POST", body, timeout=60)
        results.append((status, time.monotonic() - start, answer))

    threads = [threading.Thread(target=post) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert [r[0] for r in results] == [400] * 4, [r[2] for r in results]
    assert all("--max-input-elements" in r[2]["error"] for r in results)
    assert max(r[1] for r in results) < 10
    grown = (_proc_status(pid, "VmHWM") - rss_before) / 1024
    assert grown < 300, f"peak RSS grew {grown:.0f} MiB"
    slowest = max(r[1] for r in results)
    print(f"\n4 x 16 MiB bodies: 400 in at most {slowest:.2f} s, peak RSS +{grown:.0f} MiB")
    assert http_call(f"{url}/v1/models/antisym")[0] == 200


def test_saturated_server_answers_503(monkeypatch):
    """One worker, at most one queued request: a request that finds more waiting gets a 503."""
    from serving.local import rest

    _, base = exported("antisymmetric")
    release, started = threading.Event(), threading.Event()
    real_predict = rest.predict_body

    def held_predict(*args):  # the first prediction holds the only worker until released
        if not started.is_set():
            started.set()
            release.wait(timeout=60)
        return real_predict(*args)

    monkeypatch.setattr(rest, "predict_body", held_predict)
    server = ThreadServer(base, "antisym", threads=1, max_queued_requests=1)
    body = json.dumps({"instances": [[[0.5]] * 64] * 4})
    url = f"{server.url}/v1/models/antisym:predict"
    results = []

    def post():
        results.append(http_call(url, "POST", body))

    threads = [threading.Thread(target=post) for _ in range(7)]
    try:
        threads[0].start()
        assert started.wait(timeout=60)  # the worker is busy from here on
        for thread in threads[1:]:
            thread.start()
        deadline = time.monotonic() + 60
        while server.server.rest.queued() < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.server.rest.queued() == 6
        release.set()
        for thread in threads:
            thread.join(timeout=60)
        assert http_call(f"{server.url}/v1/models/antisym")[0] == 200
    finally:
        release.set()
        server.stop()
    # First in, first out: the k-th queued request sees 6 - k behind it; more than 1: 503.
    statuses = sorted(status for status, _ in results)
    assert statuses == [200] * 3 + [503] * 4, results
    assert all("overloaded" in answer["error"] for status, answer in results if status == 503)


def test_public_host_warns_and_connection_limit_fits_ulimit(caplog, monkeypatch):
    import logging

    from serving.local import server as server_module

    monkeypatch.setattr(server_module.resource, "getrlimit", lambda _: (256, 256))
    _, base = exported("antisymmetric")
    with caplog.at_level(logging.WARNING, logger="serving"):
        server = server_module.make_server(
            base, "antisym", host="0.0.0.0", port=0, connection_limit=1000
        )
        server.close()
    assert "no authentication" in caplog.text
    assert "connection limit 1000 lowered to 192" in caplog.text
    with pytest.raises(ValueError, match="request_timeout"):
        server_module.make_server(base, "antisym", port=0, request_timeout=0)
