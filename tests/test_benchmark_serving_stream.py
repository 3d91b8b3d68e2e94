"""The streaming benchmark in this process: what it sends, what it times, what it prints."""

import json

import numpy as np
import pytest

from benchmarks import serving_stream

SHAPE = {"steps": 10, "chunk": 3, "features": 2, "units": 4, "repeats": 6, "warmup": 2,
         "block": 3}  # fmt: skip


def test_updates_slide_the_window_and_leave_out_each_blocks_first_update(monkeypatch):
    clock = iter(range(1000))
    monkeypatch.setattr(serving_stream.time, "perf_counter", lambda: float(next(clock)))
    sent = []

    def send_whole(window):
        sent.append(("whole", window.copy()))

    def send_chunk(chunk):
        sent.append(("stream", chunk.copy()))

    times = serving_stream._updates(SHAPE, send_whole, send_chunk)
    # Warm-up (2 each), then 6 // 3 = 2 rounds of a block of 3 + 1 of each kind in turn.
    kinds = [kind for kind, _ in sent]
    block = ["whole"] * 4 + ["stream"] * 4
    assert kinds == ["whole"] * 2 + ["stream"] * 2 + block * 2
    # Each timed call reads the clock twice: every duration is 1, the first of a block kept out.
    assert times == {"whole": [1.0] * 6, "stream": [1.0] * 6}
    wholes = [array for kind, array in sent if kind == "whole"]
    chunks = [array for kind, array in sent if kind == "stream"]
    assert all(w.shape == (1, 10, 2) and w.dtype == np.float32 for w in wholes)
    assert all(c.shape == (1, 3, 2) and c.dtype == np.float32 for c in chunks)
    # Each window slid by one chunk: its steps 3.. come first.
    for before, after in zip(wholes[:-1], wholes[1:], strict=True):
        np.testing.assert_array_equal(after[:, :7], before[:, 3:])
        assert not np.array_equal(after[:, 7:], before[:, 7:])
    assert not np.array_equal(chunks[0], chunks[1])  # new values each update


def test_stats_give_percentiles_and_the_summary():
    seconds = [float(value) for value in range(1, 101)]
    stats = serving_stream._stats(seconds)
    p50, p99 = np.percentile(seconds, [50, 99])
    assert stats == {"median": 50.5, "min": 1.0, "max": 100.0, "repeats": 100,
                     "p50": p50, "p99": p99}  # fmt: skip


def _signature_def(units=(4, 6)):
    dims = [{"size": "-1"}, {"size": "-1"}, {"size": "2"}]
    inputs = {"sequence": {"tensor_shape": {"dim": dims}}}
    for index, size in enumerate(units):
        inputs[f"state_{index}"] = {"tensor_shape": {"dim": [{"size": "-1"}, {"size": str(size)}]}}
    return {"signature_def": {"stream": {"inputs": inputs}}}


def test_state_sizes_come_from_the_stream_signature():
    assert serving_stream._state_sizes(_signature_def()) == {"state_0": 4, "state_1": 6}


class _Connection:
    """http.client.HTTPConnection's calls as `measure` makes them, answered like the server."""

    def __init__(self, status=200):
        self.requests, self.status, self.answer = [], status, None
        self.count = 0

    def request(self, method, path, body=None, headers=None):
        self.requests.append((method, path, json.loads(body) if body else None, headers))
        if method == "GET":
            self.answer = {"metadata": {"signature_def": _signature_def()}}
        elif "instances" in self.requests[-1][2]:
            self.answer = {"predictions": [[0.5] * 10]}
        else:
            self.count += 1
            self.answer = {"outputs": {"logits": [[0.0] * 10],
                                      "state_0": [[float(self.count)] * 4],
                                      "state_1": [[-float(self.count)] * 6]}}  # fmt: skip
        return None

    def getresponse(self):
        answer, status = json.dumps(self.answer).encode(), self.status
        return type("Response", (), {"status": status, "read": lambda self: answer})()


def test_measure_carries_each_answers_states_into_the_next_chunk():
    connection = _Connection()
    times = serving_stream.measure(SHAPE, connection)
    assert set(times) == {"whole", "stream"} and len(times["stream"]) == 6
    method, path, _, _ = connection.requests[0]
    assert (method, path) == ("GET", "/v1/models/bench/metadata")
    posts = [request for request in connection.requests[1:]]
    assert {(m, p) for m, p, _, _ in posts} == {("POST", "/v1/models/bench:predict")}
    assert {h["Content-Type"] for _, _, _, h in posts} == {"application/json"}
    streams = [body for _, _, body, _ in posts if "inputs" in body]
    wholes = [body for _, _, body, _ in posts if "instances" in body]
    assert len(streams) == len(wholes) == 2 + 2 * 4
    assert all(np.shape(body["instances"]) == (1, 10, 2) for body in wholes)
    first = streams[0]
    assert first["signature_name"] == "stream"
    assert np.shape(first["inputs"]["sequence"]) == (1, 3, 2)
    assert first["inputs"]["state_0"] == [[0.0] * 4] and first["inputs"]["state_1"] == [[0.0] * 6]
    for number, body in enumerate(streams[1:], start=1):  # the previous answer's states
        assert body["inputs"]["state_0"] == [[float(number)] * 4]
        assert body["inputs"]["state_1"] == [[-float(number)] * 6]


class _GrpcClient:
    """`serving.client.GrpcClient`'s calls as `measure_grpc` makes them, answered as the
    server would: each stream answer's states count the chunks so far."""

    def __init__(self):
        self.calls, self.count = [], 0

    def stream_states(self):
        return 7, {"state_0": 4, "state_1": 6}

    def metadata(self, version):
        assert version == 7
        inputs = {"sequence": {}}
        return {"metadata": {"signature_def": {"signature_def": {
            "serving_default": {"inputs": inputs}}}}}  # fmt: skip

    def predict(self, inputs, version, signature_name=None):
        self.calls.append(({k: v.copy() for k, v in inputs.items()}, version, signature_name))
        if signature_name is None:
            return {"outputs": {"logits": np.zeros((1, 10), "float32")}}
        self.count += 1
        return {"outputs": {"logits": np.zeros((1, 10), "float32"),
                            "state_0": np.full((1, 4), self.count, "float32"),
                            "state_1": np.full((1, 6), -self.count, "float32")}}  # fmt: skip


def test_measure_grpc_sends_arrays_to_the_pinned_version_and_carries_the_states():
    client = _GrpcClient()
    times = serving_stream.measure_grpc(SHAPE, client)
    assert set(times) == {"whole", "stream"} and len(times["stream"]) == 6
    assert {version for _, version, _ in client.calls} == {7}
    streams = [inputs for inputs, _, signature in client.calls if signature == "stream"]
    wholes = [inputs for inputs, _, signature in client.calls if signature is None]
    assert len(streams) == len(wholes) == 2 + 2 * 4
    assert all(set(inputs) == {"sequence"} and inputs["sequence"].shape == (1, 10, 2)
               and inputs["sequence"].dtype == np.float32 for inputs in wholes)  # fmt: skip
    assert streams[0]["sequence"].shape == (1, 3, 2)
    assert streams[0]["state_0"].tolist() == [[0.0] * 4]
    for number, inputs in enumerate(streams[1:], start=1):  # the previous answer's states
        assert inputs["state_0"].tolist() == [[float(number)] * 4]
        assert inputs["state_1"].tolist() == [[-float(number)] * 6]


def test_a_failed_request_stops_the_benchmark_with_the_servers_answer():
    post = serving_stream._poster(_Connection(status=400), "/v1/models/bench:predict")
    with pytest.raises(serving_stream.common.ChildError, match=r"HTTP 400: \{'outputs'"):
        post({"inputs": {}})


def test_cpu_name_is_the_model_name_line(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz \nflags\t: fpu\n")
    real_open = open
    monkeypatch.setattr(
        "builtins.open",
        lambda path, *a, **k: real_open(cpuinfo if path == "/proc/cpuinfo" else path, *a, **k),
    )
    assert serving_stream._cpu_name() == "Some CPU @ 2.0GHz"
    cpuinfo.write_text("processor\t: 0\n")
    import platform

    monkeypatch.setattr(platform, "processor", lambda: "")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert serving_stream._cpu_name() == "x86_64"


def _latency(median):
    return {"median": median, "min": median / 2, "max": median * 2, "repeats": 4,
            "p50": median, "p99": median * 1.5}  # fmt: skip


def test_main_tables_every_width_with_the_ratios_of_the_medians(monkeypatch, tmp_path, capsys):
    def measured(shape):
        m = shape["features"]
        return {
            "shape": shape,
            "rest": {"latency": {"whole": _latency(0.010 * m), "stream": _latency(0.002)},
                     "ratio_of_medians": 5.0 * m},
            "grpc": {"latency": {"whole": _latency(0.005 * m), "stream": _latency(0.0005)},
                     "ratio_of_medians": 10.0 * m},
            "in_process": {"latency": {"whole": _latency(0.004), "stream": _latency(0.001)},
                           "ratio_of_medians": 4.0},
        }  # fmt: skip

    monkeypatch.setattr(serving_stream, "_measure_width", measured)
    monkeypatch.setattr(serving_stream, "_cpu_name", lambda: "Some CPU")
    monkeypatch.setattr(serving_stream, "FULL_FEATURES", (1, 28, 96))
    monkeypatch.setattr(serving_stream, "QUICK_FEATURES", (1,))
    assert serving_stream.main(["--output", str(tmp_path)]) == 0
    text = (tmp_path / "serving_stream.md").read_text()
    assert capsys.readouterr().out == text
    lines = text.splitlines()
    assert lines[0] == (
        "| features | update (batch 1) | REST p50 | REST p99 | gRPC p50 | gRPC p99 "
        "| signature alone, p50 | repeats |"
    )
    assert lines[2] == (
        "| 1 | whole sequence resent (1000 steps) | 10.00 ms | 15.00 ms | 5.00 ms | 7.50 ms "
        "| 4.00 ms | 4 |"
    )
    assert lines[3] == (
        "| 1 | one 28-step chunk streamed | 2.00 ms | 3.00 ms | 0.50 ms | 0.75 ms | 1.00 ms | 4 |"
    )
    assert lines[6] == (
        "| 96 | whole sequence resent (1000 steps) | 960.00 ms | 1440.00 ms | 480.00 ms "
        "| 720.00 ms | 4.00 ms | 4 |"
    )
    assert len(lines) == 2 + 3 * 3 + 2
    assert lines[8] == ""  # the table, a blank line, the ratios
    assert lines[10] == (
        "28 feature(s) per step: streaming is 140.0x cheaper per update over REST, 280.0x over "
        "gRPC (4.0x for the signatures alone; ratios of the medians)"
    )
    assert lines[-1].startswith("CPU: Some CPU, ") and lines[-1].endswith(" cores")
    results = json.loads((tmp_path / "serving_stream.json").read_text())
    assert [w["shape"]["features"] for w in results["widths"]] == [1, 28, 96]
    assert results["widths"][0]["shape"] == {**serving_stream.FULL, "features": 1}
    assert results["environment"]["cpu"] == "Some CPU"
    assert serving_stream.main(["--quick", "--output", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "serving_stream.json").read_text())
    assert [w["shape"] for w in results["widths"]] == [{**serving_stream.QUICK, "features": 1}]


def test_one_width_measured_for_real_through_a_served_export():
    """A tiny model exported, served by `serving.server` in its own process, and timed."""
    shape = {"steps": 6, "chunk": 2, "features": 3, "units": 4, "repeats": 4, "warmup": 1,
             "block": 2}  # fmt: skip
    result = serving_stream._measure_width(shape)
    assert result["shape"] == shape
    for where in ("rest", "grpc", "in_process"):
        latency = result[where]["latency"]
        for kind in ("whole", "stream"):
            stats = latency[kind]
            assert stats["repeats"] == 4
            assert 0 < stats["min"] <= stats["p50"] <= stats["p99"] <= stats["max"]
        ratio = latency["whole"]["median"] / latency["stream"]["median"]
        assert result[where]["ratio_of_medians"] == pytest.approx(ratio)


def test_the_exported_model_is_the_benchmarks_classifier(tmp_path):
    import os

    from apputil.quiet import import_tensorflow

    shape = {"steps": 5, "features": 3, "units": 4}
    base = serving_stream._export(shape, str(tmp_path))
    assert base == os.path.join(str(tmp_path), "model") and os.listdir(base) == ["1"]
    tf = import_tensorflow()
    loaded = tf.saved_model.load(os.path.join(base, "1"))
    whole = loaded.signatures["serving_default"]
    (spec,) = whole.structured_input_signature[1].values()
    assert spec.shape.as_list() == [None, 5, 3]
    stream = loaded.signatures["stream"]
    states = {n: s for n, s in stream.structured_input_signature[1].items() if n != "sequence"}
    assert [s.shape.as_list() for s in states.values()] == [[None, 4]]
    x = np.random.default_rng(0).random((1, 5, 3)).astype("float32")
    logits = whole(**{spec.name: tf.constant(x)})["logits"].numpy()
    assert logits.shape == (1, 10)
    # The same model, seeded: a second export answers the same logits.
    second = serving_stream._export(shape, str(tmp_path / "b"))
    again = tf.saved_model.load(os.path.join(second, "1"))
    np.testing.assert_allclose(
        again.signatures["serving_default"](**{spec.name: tf.constant(x)})["logits"].numpy(),
        logits, rtol=1e-6,
    )  # fmt: skip


def test_the_widths_measured_include_the_papers_t1000_input():
    """One feature, a Fashion-MNIST row (28) and a CIFAR-10 row of 32 pixels × 3 (96)."""
    assert serving_stream.FULL_FEATURES == (1, 28, 96)
    assert serving_stream.QUICK_FEATURES == (1,)
    assert serving_stream.FULL["steps"] == 1000 and serving_stream.FULL["chunk"] == 28
