"""Every argument listed in the docstring of each class that takes it, written once.

The cells and layers share most arguments (`epsilon`, `gamma`, the initializers, ...).
Each description is written in one docstring, the first class that takes it
(`AntisymmetricCell` for the cell's, `AntisymmetricRNN` for the layer's own), and
`arguments_from(*sources)` fills the `Args:` section of a class that also takes
them: every parameter of its `__init__`, in the signature's order, with its own
description where it has one and the first source's otherwise. So `help()`
and the API reference (read from the imported classes) list every argument
where it is used, and a new argument is described once.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T", bound=type)
_ENTRY = re.compile(r"^    (\w+):")
_SECTIONS = ("Args:", "Call arguments:", "Returns:", "Examples:", "Raises:")


def _lines(cls: type) -> list[str]:
    return inspect.cleandoc(cls.__doc__ or "").splitlines()


def _args_span(lines: list[str]) -> tuple[int, int]:
    """`(first, end)` of the `Args:` section's entries (the header at `first - 1`)."""
    start = lines.index("Args:") + 1
    end = start
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith("    ")):
        end += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return start, end


def argument_docs(cls: type) -> dict[str, list[str]]:
    """`{name: its lines}` of the entries of `cls`'s `Args:` section (none: empty)."""
    lines = _lines(cls)
    if "Args:" not in lines:
        return {}
    start, end = _args_span(lines)
    entries: dict[str, list[str]] = {}
    name = None
    for line in lines[start:end]:
        match = _ENTRY.match(line)
        if match:
            name = match[1]
            entries[name] = []
        if name is None:
            raise ValueError(f"{cls.__name__}: a line before the first argument: {line!r}")
        entries[name].append(line)
    return entries


def parameters(cls: type) -> list[str]:
    """The names of `cls.__init__`'s arguments in order, without `self` and `**kwargs`."""
    signature = inspect.signature(cls.__init__)  # type: ignore[misc]
    kinds = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    return [p.name for p in list(signature.parameters.values())[1:] if p.kind not in kinds]


def arguments_from(*sources: type) -> Callable[[_T], _T]:
    """A class decorator: its `Args:` section lists every argument of its `__init__`.

    Raises:
        ValueError: naming an argument neither the class nor a source describes.
    """

    def decorate(cls: _T) -> _T:
        own = argument_docs(cls)
        known = [own, *(argument_docs(source) for source in sources)]
        body: list[str] = []
        for name in parameters(cls):
            found = next((docs[name] for docs in known if name in docs), None)
            if found is None:
                raise ValueError(f"{cls.__name__}: argument `{name}` has no description")
            body += found
        lines = _lines(cls)
        if "Args:" in lines:
            start, end = _args_span(lines)
            lines[start:end] = body
        else:
            at = next(i for i, line in enumerate(lines) if line in _SECTIONS)
            lines[at:at] = ["Args:", *body, ""]
        cls.__doc__ = "\n".join(lines) + "\n"
        return cls

    return decorate
