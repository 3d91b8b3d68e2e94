"""The README's main command: train, export, serve, predict over REST, stop.

The demo runs in this process (its training, export and server are processes of their
own, as for a user), so that what it does itself is checked line by line.
"""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from apputil.net import free_port
from serving import demo
from serving.client import ServingClient
from training.tasks.catalog import get_task


@pytest.fixture
def quiet_tensorflow(monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def test_main_job_end_to_end(tmp_path, capfd, quiet_tensorflow):
    run, base = tmp_path / "run", tmp_path / "models" / "m"
    argv = ["--steps", "300", "--examples", "16", "--output-dir", str(run)]
    assert demo.main([*argv, "--export-base", str(base)]) == 0
    out = capfd.readouterr().out
    assert (run / "model.keras").is_file()
    assert (base / "1" / "saved_model.pb").is_file()
    assert f"[train] -m training.train --task digits --steps 300 --output-dir {run}" in out
    assert f"--model {run / 'model.keras'} --export-base {base} --version 1" in out
    assert f"[serve] -m serving.server --model-base-path {base} --model-name antisym" in out
    assert '"state": "AVAILABLE"' in out
    assert "[predict] POST /v1/models/antisym:predict with 16 test digits" in out
    rows = re.findall(r"true (\d)  predicted (\d)  p=([0-9.]+)", out)
    assert len(rows) == 16
    assert all(0.1 <= float(p) <= 1.0 for _, _, p in rows)  # the top class of 10
    correct = int(re.search(r"\[predict\] (\d+)/16 correct \(model version 1\)", out).group(1))
    assert correct == sum(t == p for t, p, _ in rows)
    assert correct >= 6, out  # 300 steps: far above chance (1.6 of 16)
    assert out.rstrip().endswith("[stop] server stopped")


def test_stream_demo_prints_the_prediction_after_every_chunk(tmp_path, capfd, quiet_tensorflow):
    argv = ["--stream", "--steps", "30", "--timesteps", "72", "--chunk", "16", "--examples", "3"]
    argv += ["--output-dir", str(tmp_path / "run"), "--export-base", str(tmp_path / "models")]
    assert demo.main(argv) == 0
    out = capfd.readouterr().out
    assert "--task digits --steps 30 --timesteps 72" in out
    label = int(re.search(r"\[stream\] a test digit \((\d)\): 64 informative steps", out)[1])
    assert label == int(get_task("digits").examples("test")[1][2])  # the third, of --examples 3
    assert "then 8 steps of noise, 16 steps per request" in out
    rows = re.findall(r"steps +(\d+)/72 \((digit|noise)\)  predicted (\d)  p=([0-9.]+)  (#*)", out)
    # 72 steps in chunks of 16: answers after 16, 32, 48, 64 and 72 steps.
    assert [int(seen) for seen, *_ in rows] == [16, 32, 48, 64, 72]
    assert [part for _, part, *_ in rows] == ["digit"] * 4 + ["noise"]
    for *_, p, bar in rows:
        assert len(bar) == round(20 * float(p))
    predicted = [int(c) for _, _, c, _, _ in rows]
    final = predicted[-1]
    settled = min(int(rows[i][0]) for i in range(5) if all(c == final for c in predicted[i:]))
    assert (
        f"[stream] true {label}  predicted {final}, unchanged from step {settled} on "
        "(model version 1)"
    ) in out
    assert out.rstrip().endswith("[stop] server stopped")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--chunk", "0"], "argument `--chunk`, expected a positive number of steps, got 0"),
        (["--timesteps", "63"],
         "argument `--timesteps`, expected at least 64 (a digit's own steps), got 63"),
        (["--litert", "--export-base", "m", "--litert-base", "m/"],
         "argument `--litert-base`, expected a folder other than --export-base, got 'm/'"),
    ],
)  # fmt: skip
def test_stream_demo_refuses_bad_flags_before_training(tmp_path, capsys, flags, message):
    argv = ["--stream", *flags, "--output-dir", str(tmp_path / "run")]
    assert demo.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_next_version_follows_the_highest_numbered_folder(tmp_path):
    assert demo._next_version(str(tmp_path / "none")) == 1
    assert demo._next_version(str(tmp_path)) == 1
    for name in ("1", "3", "007", "²", "4a", "tmp"):
        (tmp_path / name).mkdir()
    assert demo._next_version(str(tmp_path)) == 8


def test_a_failed_step_names_itself_and_its_status(capsys):
    with pytest.raises(demo.DemoError, match=r"^step 'train' failed with exit status 3$"):
        demo._run(["-c", "import sys; sys.exit(3)"], "train")
    assert capsys.readouterr().out == "[train] -c import sys; sys.exit(3)\n"
    demo._run(["-c", "pass"], "export")  # status 0: no error


def test_waiting_for_the_server_stops_when_it_exits_or_the_time_is_up():
    client = ServingClient(f"http://127.0.0.1:{free_port()}", "antisym", timeout=1)
    exited = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(4)"])
    exited.wait()
    with pytest.raises(demo.DemoError, match="^the server exited with status 4$"):
        demo._wait_until_serving(client, exited, deadline_seconds=30)
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(demo.DemoError, match=r"^the server did not answer within 0.5 s$"):
            demo._wait_until_serving(client, running, deadline_seconds=0.5)
    finally:
        demo._stop(running)
    assert running.returncode == -15  # SIGTERM was enough


def test_stop_kills_a_server_that_ignores_sigterm(monkeypatch, capsys):
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print(1, flush=True); time.sleep(60)"
    )
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    server.stdout.readline()  # SIGTERM is ignored from here on
    real_wait = server.wait
    waits = []

    def short_wait(timeout=None):
        waits.append(timeout)
        return real_wait(timeout=0.5 if timeout else None)

    monkeypatch.setattr(server, "wait", short_wait)
    demo._stop(server)
    assert waits == [30, None] and server.returncode == -9
    assert capsys.readouterr().out == "[stop] server stopped\n"
    server.stdout.close()


def test_default_folders_depend_on_the_mode(monkeypatch):
    seen = []
    monkeypatch.setattr(demo, "_demo", lambda args: seen.append(args))
    assert demo.main([]) == 0
    assert demo.main(["--stream"]) == 0
    plain, stream = seen
    assert (plain.output_dir, plain.export_base) == ("runs/demo", os.path.join("models", "antisym"))
    assert (stream.output_dir, stream.export_base, stream.litert_base) == (
        "runs/demo-stream",
        os.path.join("models", "antisym-stream"),
        os.path.join("models", "antisym-stream-litert"),
    )
    assert (plain.steps, plain.examples, plain.timesteps, plain.chunk) == (2000, 8, 256, 8)
    assert not plain.stream and stream.stream


def test_help_names_the_demo_flags(capsys):
    with pytest.raises(SystemExit) as exit_:
        demo.main(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--examples EXAMPLES test digits to predict" in text
    assert "--chunk CHUNK --stream: steps per request" in text


def test_litert_stream_demo_answers_as_the_keras_model_on_each_prefix(
    tmp_path, capfd, quiet_tensorflow
):
    """`--stream --litert`: the interpreter's answer after each chunk is the trained
    model's own class for the steps received so far."""
    import keras

    argv = ["--stream", "--litert", "--steps", "30", "--timesteps", "72", "--chunk", "16"]
    argv += ["--examples", "3", "--output-dir", str(tmp_path / "run")]
    argv += ["--export-base", str(tmp_path / "models")]
    assert demo.main(argv) == 0
    out = capfd.readouterr().out
    # Its own base path: the SavedModel's has version 1 only, a server of it meets no LiteRT.
    assert f"--export-base {tmp_path / 'models-litert'} --version 1 --format litert" in out
    assert sorted(os.listdir(tmp_path / "models-litert")) == ["1"]
    assert sorted(os.listdir(tmp_path / "models-litert" / "1")) == ["model.tflite"]
    assert sorted(os.listdir(tmp_path / "models")) == ["1"]
    assert "saved_model.pb" in os.listdir(tmp_path / "models" / "1")
    assert "[litert]" in out
    rows = re.findall(r"steps +(\d+)/72 \((?:digit|noise)\)  predicted (\d)  p=([0-9.]+)", out)
    assert [int(seen) for seen, *_ in rows] == [16, 32, 48, 64, 72]
    model = keras.saving.load_model(tmp_path / "run" / "model.keras")
    x, _ = get_task("digits", timesteps=72).make_batch(
        *[part[:3] for part in get_task("digits").examples("test")], np.zeros(2, "int32")
    )
    for seen, predicted, p in rows:
        logits = keras.ops.convert_to_numpy(model(np.asarray(x)[2:3, : int(seen)]))[0]
        assert int(predicted) == logits.argmax()
        softmax = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        assert abs(float(p) - softmax.max()) < 2e-3
    assert "(model version 1)" in out and "server" not in out.split("[litert]")[1]


def test_litert_demo_needs_stream(tmp_path, capsys):
    assert demo.main(["--litert", "--output-dir", str(tmp_path / "run")]) == 2
    assert "argument `--litert`, expected with --stream" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
