"""What a run or a search depends on: recorded when it starts, checked when it goes on.

A resumed run (`config.yaml` in its folder) and a continued search
(`search.json` in its project) must be the same one they were; both refuse a
changed setting in the same words, naming the flag, the recorded value and
the record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from apputil.errors import invalid, shown

#: A setting the record does not hold (a setting newer than the record): not compared.
MISSING = object()


def check_unchanged(
    before: Mapping[str, object],
    now: Mapping[str, object],
    *,
    path: str,
    flag: Callable[[str], str],
    hint: Callable[[str, object], str],
    allowed: tuple[str, ...] = (),
    default: Callable[[str], object] = lambda key: MISSING,
) -> dict[str, tuple[object, object]]:
    """Refuses (`UsageError`) the first setting of `now` that differs from `before`.

    Args:
        before: The recorded settings, by key.
        now: The settings of this run or search, by key, in the order to check.
        path: The record, named in the error.
        flag: The flag of a key (`"units"` -> `"--units"`).
        hint: What to do instead, for a key and its recorded value.
        allowed: Keys that may change.
        default: The recorded value of a key the record lacks (`MISSING`: not compared).

    Returns:
        The allowed keys that changed: key -> (before, now).
    """
    changed: dict[str, tuple[object, object]] = {}
    for key, value in now.items():
        previous = before[key] if key in before else default(key)
        if previous is MISSING or previous == value:
            continue
        if key in allowed:
            changed[key] = (previous, value)
            continue
        expected = f"{shown(previous)} as in {path} ({hint(key, previous)})"
        raise invalid(flag(key), expected, value)
    return changed
