"""The code blocks of README.md and of the guide pages in docs/ run as pasted.

Each page's blocks run in order, in a fresh working directory of their own.
Every ```python, ```bash and ```sh block runs unless an HTML comment right above
it says `tests/test_readme.py does not run this block: REASON` (long jobs,
servers in the foreground, installs, other machines, Docker); such a comment
must give a reason. Bash (and sh) blocks run with `-e -o pipefail`, each python
block in a fresh interpreter, each block within BLOCK_TIMEOUT seconds. Blocks in
other languages (yaml, text, unlabeled output) are only shown.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.limits import limit

ROOT = Path(__file__).resolve().parents[1]
SKIP = re.compile(r"<!-- tests/test_readme\.py does not run this block: (?P<reason>.+?) -->\s*$")
FENCE = re.compile(r"^```(?P<language>\w*)\s*$")
RUNNABLE = {"python", "bash", "sh"}
# Written by `python -m training.reproduce`; tests/test_reproduce.py runs its commands.
GENERATED = {"docs/reproduction.md"}
PAGES = ["README.md"] + sorted(
    path
    for path in (p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
    if path not in GENERATED
)
# The longest block is a 30-second training run; a loaded CI machine takes a few times that.
BLOCK_TIMEOUT = limit(300)
# Pages whose blocks take half a minute or more together (LiteRT and ONNX conversions; a
# model trained, exported, served and asked over REST; the stability probes; the training
# commands): CI's slow pass runs them, the README's command not.
SLOW_PAGES = {"docs/devices.md", "docs/serving.md", "docs/stability.md", "docs/training.md"}


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


def page_blocks(page):
    return readme_blocks((ROOT / page).read_text())


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


def test_pages_are_found():
    assert "docs/serving.md" in PAGES and "docs/training.md" in PAGES, PAGES
    assert not GENERATED & set(PAGES)
    assert SLOW_PAGES <= set(PAGES), SLOW_PAGES - set(PAGES)  # a renamed page stays slow


@pytest.mark.parametrize(
    "page", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW_PAGES else p for p in PAGES]
)
def test_blocks_run_as_pasted_in_order(page, tmp_path):
    run = [
        (language, code, line)
        for language, code, skip, line in page_blocks(page)
        if skip is None and language in RUNNABLE
    ]
    if not run:
        pytest.skip(f"{page} has no block to run")
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
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT
        )
        assert done.returncode == 0, f"{page}:{line}\n{code}\n{done.stdout}\n{done.stderr}"
        if "curl" in code and ":predict" in code:  # a served model's answer: one prediction
            assert '"predictions"' in done.stdout and '"class_id"' in done.stdout, done.stdout


def test_the_readme_runs_its_example():
    languages = {language for language, _, skip, _ in page_blocks("README.md") if skip is None}
    assert "python" in languages, languages


@pytest.mark.parametrize("page", PAGES)
def test_skipped_blocks_say_why(page):
    for language, _, skip, line in page_blocks(page):
        if language in RUNNABLE and skip is not None:
            assert len(skip.split()) >= 2, f"{page}:{line}: give a reason"


def test_every_extra_of_the_package_is_listed_in_the_readme_and_the_install_page():
    import configparser

    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "setup.cfg")
    extras = set(config["options.extras_require"])
    readme = re.search(r"^Extras: (.*?); see", (ROOT / "README.md").read_text(), re.M | re.S)
    assert readme, "README.md: no 'Extras: ...; see' sentence"
    assert set(re.findall(r"`([a-z]+)`", readme[1])) == extras
    table = re.findall(r"^\| `([a-z]+)` \|", (ROOT / "docs" / "install.md").read_text(), re.M)
    assert sorted(table) == sorted(extras)
