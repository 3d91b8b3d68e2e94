"""`serving.names`: the one rule for version folders and model names, case by case."""

import pytest

from apputil.errors import UsageError, shown
from serving import names

MAX = 2**63 - 1  # TensorFlow Serving's versions are int64


@pytest.mark.parametrize(
    "folder, version",
    [
        ("1", 1), ("0", 0), ("007", 7), ("000", 0), ("10", 10),
        (str(MAX), MAX), ("0" * 30 + "5", 5), ("0" + str(MAX), MAX),
        (str(MAX + 1), None), ("9" * 19, None), ("1" + "0" * 19, None), ("1" * 400, None),
        ("", None), ("-1", None), ("+1", None), (" 1", None), ("1 ", None), ("1.0", None),
        ("²", None), ("١", None), ("1a", None), ("0x1", None), ("1\n", None),
    ],
)  # fmt: skip
def test_a_folder_name_is_the_version_tensorflow_serving_reads(folder, version):
    assert names.parse_version(folder) == version


@pytest.mark.parametrize("version", [1, 2, 7, 10**18, MAX])
def test_an_export_writes_positive_int64_versions_without_leading_zeros(version):
    assert names.check_version(version) == version
    assert names.version_folder(version) == str(version)
    assert names.parse_version(names.version_folder(version)) == version


@pytest.mark.parametrize("version", [0, -1, MAX + 1, 2**64, True, False, 1.0, "1", None])
def test_other_versions_are_refused_naming_the_argument(version):
    with pytest.raises(UsageError) as error:
        names.check_version(version)
    message = str(error.value)
    assert "`version`" in message and f"a positive integer up to {MAX}" in message
    assert repr(version) in message


@pytest.mark.parametrize(
    "name", ["antisym", "a b", "modèle", "a.b", "...", "a-b_c", "0", "x" * 300]
)
def test_names_reachable_in_a_url_are_kept(name):
    assert names.check_model_name(name) == name


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "/", "a:b", ":predict", "a\x00", "\x1fa", "a\x7f", "a\nb",
             "a\tb", 5, None, b"antisym"],
)  # fmt: skip
def test_unreachable_names_are_refused_naming_the_argument(name):
    with pytest.raises(UsageError) as error:
        names.check_model_name(name)
    message = str(error.value)
    expected = "a name usable in /v1/models/NAME (not empty, no '/', ':' or control characters)"
    assert "`model_name`" in message and message.endswith(
        f", expected {expected}, got {shown(name)}."
    )
    with pytest.raises(UsageError, match="`--model-name`"):
        names.check_model_name(name, "--model-name")
