"""The names the exporter writes and the server reads: versions, models, signatures.

One rule for both sides, so that what `serving.export` writes is what
`serving.server` (and TensorFlow Serving) serves:

- a version folder's name is ASCII digits whose value fits TensorFlow Serving's
  int64 versions (0 to 2**63 - 1). Leading zeros are read as TensorFlow Serving
  reads them: `007` is version 7 (and is loaded from `007`). Two folders naming
  one version (`7` and `007`) are a conflict: that version is not loaded.
  Exports write versions 1 to 2**63 - 1 without leading zeros;
- a model name must be reachable in `/v1/models/NAME`: not empty, no `/` or `:`
  (they end the name in the URL), no control characters, not `.` or `..`
  (clients remove such path segments).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from apputil.errors import invalid

#: The signatures and inputs of an export's contract, beside `serving_default`: `stream`
#: (a chunk of `sequence` with the recurrent states in and out, each state input named
#: `STATE_PREFIX` + its layer) and `padded` (`sequence` with each row's `length`).
#: The signature a request without a `signature_name` calls (TensorFlow's
#: `DEFAULT_SERVING_SIGNATURE_DEF_KEY`).
DEFAULT_SIGNATURE = "serving_default"
STREAM_SIGNATURE = "stream"
PADDED_SIGNATURE = "padded"
SEQUENCE_INPUT = "sequence"
LENGTH_INPUT = "length"
STATE_PREFIX = "state_"

def unknown_signature(name: str, signatures: Iterable[str]) -> str:
    """TensorFlow Serving's words for a signature a version lacks, with the ones it has."""
    there = ", ".join(sorted(signatures)) or "none"
    return f'Serving signature name: "{name}" not found in signature def (signatures: {there})'


MAX_VERSION = 2**63 - 1  # TensorFlow Serving's versions are int64
_DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() accepts "²", int() rejects it
_UNREACHABLE = re.compile(r"[/:\x00-\x1f\x7f]")


def parse_version(name: str) -> int | None:
    """The version a folder name (or a URL's `versions/V`) stands for, or None."""
    if not _DIGITS.fullmatch(name):
        return None
    digits = name.lstrip("0") or "0"
    if len(digits) > len(str(MAX_VERSION)):  # int() of huge digit strings is slow or refused
        return None
    value = int(digits)
    return value if value <= MAX_VERSION else None


def check_version(version: object) -> int:
    """`version` if an export may write it (1 to 2**63 - 1), else a `UsageError`."""
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        raise invalid("version", f"a positive integer up to {MAX_VERSION}", version)
    return version


def version_folder(version: int) -> str:
    """The folder name an export writes for `version`."""
    return str(version)


def check_model_name(name: object, argument: str = "model_name") -> str:
    """`name` if `/v1/models/NAME` can reach it, else a `UsageError`."""
    if not isinstance(name, str) or not name or name in (".", "..") or _UNREACHABLE.search(name):
        raise invalid(
            argument,
            "a name usable in /v1/models/NAME (not empty, no '/', ':' or control characters)",
            name,
        )
    return name
