"""The container files are consistent (no Docker engine here to run them)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_dockerfile_has_one_pinned_tf_serving_base():
    lines = (ROOT / "serving" / "Dockerfile").read_text().splitlines()
    bases = [line for line in lines if line.startswith("FROM")]
    assert len(bases) == 1, bases
    assert re.fullmatch(r"FROM tensorflow/serving:\d+\.\d+\.\d+(-gpu)?", bases[0]), bases[0]
    for name in ("models.config", "batching.config", "monitoring.config"):
        assert f"/config/{name}" in "\n".join(lines)
        assert (ROOT / "serving" / name).is_file()


def test_batching_sizes_end_at_max_batch_size():
    text = (ROOT / "serving" / "batching.config").read_text()
    max_batch = int(re.search(r"max_batch_size \{ value: (\d+) \}", text).group(1))
    allowed = [int(v) for v in re.findall(r"^allowed_batch_sizes: (\d+)", text, re.M)]
    assert allowed == sorted(allowed) and allowed[-1] == max_batch


def test_compose_serves_the_export_base_on_the_standard_ports():
    text = (ROOT / "docker-compose.yml").read_text()
    assert re.search(r"8501:8501", text) and re.search(r"8500:8500", text)
    assert "./models/antisym:/models/antisym" in text
    models = (ROOT / "serving" / "models.config").read_text()
    assert 'base_path: "/models/antisym"' in models and 'name: "antisym"' in models
