"""The README's main command: train, export, serve, predict over REST, stop."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_main_job_end_to_end(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "serving.demo",
            "--steps",
            "300",
            "--examples",
            "16",
            "--output-dir",
            str(tmp_path / "run"),
            "--export-base",
            str(tmp_path / "models" / "m"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert (tmp_path / "run" / "model.keras").is_file()
    assert (tmp_path / "models" / "m" / "1" / "saved_model.pb").is_file()
    assert '"state": "AVAILABLE"' in out
    rows = re.findall(r"true (\d)  predicted (\d)  p=([0-9.]+)", out)
    assert len(rows) == 16
    correct = int(re.search(r"\[predict\] (\d+)/16 correct", out).group(1))
    assert correct == sum(t == p for t, p, _ in rows)
    assert correct >= 6, out  # 300 steps: far above chance (1.6 of 16)
    assert out.rstrip().endswith("[stop] server stopped")
