"""The README's code blocks run as pasted, in order, in a fresh working directory.

Every ```python and ```bash block runs unless an HTML comment right above it
says `tests/test_readme.py does not run this block: REASON` (long jobs, other
machines, Docker); such a comment must give a reason. Bash blocks run with
`-e -o pipefail`; each python block in a fresh interpreter.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = re.compile(r"<!-- tests/test_readme\.py does not run this block: (?P<reason>.+?) -->\s*$")
FENCE = re.compile(r"^```(?P<language>\w*)\s*$")


def readme_blocks(text):
    """`(language, code, skip_reason or None, line)` of each fenced block."""
    blocks, lines, index = [], text.splitlines(), 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening or not opening["language"]:
            index += 1
            continue
        end = index + 1
        while not lines[end].startswith("```"):
            end += 1
        previous = next((line for line in reversed(lines[:index]) if line.strip()), "")
        skip = SKIP.match(previous)
        code = "\n".join(lines[index + 1 : end]) + "\n"
        blocks.append((opening["language"], code, skip["reason"] if skip else None, index + 1))
        index = end + 1
    return blocks


def test_block_parser_finds_languages_and_reasons():
    text = (
        "x\n```python\nprint(1)\n```\n\n"
        "<!-- tests/test_readme.py does not run this block: slow -->\n```bash\nsleep 9\n```\n"
        "```\nplain output\n```\n"
    )
    assert readme_blocks(text) == [
        ("python", "print(1)\n", None, 2),
        ("bash", "sleep 9\n", "slow", 7),
    ]


def test_readme_blocks_run_as_pasted_in_order(tmp_path):
    blocks = readme_blocks((ROOT / "README.md").read_text())
    run = [(language, code, line) for language, code, skip, line in blocks if skip is None]
    assert {language for language, _, _ in run} == {"python", "bash"}, blocks
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "CUDA_VISIBLE_DEVICES": "",
        "KERAS_BACKEND": "tensorflow",
    }
    for language, code, line in run:
        command = (
            [sys.executable, "-c", code]
            if language == "python"
            else ["bash", "-e", "-o", "pipefail", "-c", code]
        )
        done = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"README.md:{line}\n{code}\n{done.stdout}\n{done.stderr}"
        if "curl" in code:  # the Serve block's answer: one prediction of 10 classes
            assert '"predictions"' in done.stdout and '"class_id"' in done.stdout, done.stdout


@pytest.mark.parametrize("language", ["python", "bash"])
def test_skipped_blocks_say_why(language):
    blocks = readme_blocks((ROOT / "README.md").read_text())
    for block_language, _, skip, line in blocks:
        if block_language == language and skip is not None:
            assert len(skip.split()) >= 2, f"README.md:{line}: give a reason"
