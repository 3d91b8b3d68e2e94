"""keras_antisym's type hints: mypy finds no error in the package, and a user's checker
reads them (PEP 561: `py.typed` in the package, shipped by setup.cfg)."""

import configparser
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.limits import limit

ROOT = Path(__file__).resolve().parents[1]


def mypy(*args, cwd=ROOT):
    """mypy's output and exit status, run with the project's configuration."""
    pytest.importorskip("mypy")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=limit(300),
        env={**os.environ, "MYPY_FORCE_COLOR": "0"},
    )
    return proc.stdout + proc.stderr, proc.returncode


def test_mypy_reports_no_error_in_the_package():
    output, status = mypy("keras_antisym")
    assert status == 0, output
    assert "Success: no issues found" in output


def test_py_typed_ships_with_the_package():
    assert (ROOT / "keras_antisym" / "py.typed").is_file()
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    assert config["options.package_data"]["keras_antisym"].split() == ["py.typed"]


def test_a_users_checker_reads_the_public_api(tmp_path):
    """Wrong argument types are reported; return types are the documented ones."""
    user = tmp_path / "user_code.py"
    user.write_text(
        textwrap.dedent(
            """
            from keras_antisym import AntisymmetricRNN, FanInNormal, stability

            layer = AntisymmetricRNN(8, epsilon=0.1, fused_kernel="auto")
            reveal_type(layer.fused_kernel)
            reveal_type(layer.units)
            reveal_type(stability.transition_matrix(layer))
            reveal_type(stability.end_to_end_jacobian(layer, [[0.0]], return_final_state=True))
            AntisymmetricRNN("8")
            AntisymmetricRNN(8, fused_kernel="yes")
            FanInNormal(sigma="1")
            """
        )
    )
    output, status = mypy("--no-incremental", str(user))
    assert status == 1, output
    # Older mypy releases spell builtins as `builtins.int`; NumPy's array types vary.
    lines = [
        line.split(": ", 1)[1].replace("builtins.", "")
        for line in output.splitlines()
        if line.startswith(str(user))
    ]
    assert len(lines) == 7, output
    assert lines[0] == "note: Revealed type is \"bool | Literal['auto']\""
    assert lines[1] == 'note: Revealed type is "int"'
    assert lines[2].startswith('note: Revealed type is "numpy.ndarray[') and lines[2].endswith(
        'numpy.dtype[numpy.float64]]"'
    )
    assert lines[3].startswith('note: Revealed type is "tuple[numpy.ndarray[')
    assert lines[3].count("numpy.float64") == 2
    assert lines[4:] == [
        'error: Argument 1 to "AntisymmetricRNN" has incompatible type "str"; expected "int"  '
        "[arg-type]",
        'error: Argument "fused_kernel" to "AntisymmetricRNN" has incompatible type '
        "\"Literal['yes']\"; expected \"bool | Literal['auto']\"  [arg-type]",
        'error: Argument "sigma" to "FanInNormal" has incompatible type "str"; expected "float"  '
        "[arg-type]",
    ], output
