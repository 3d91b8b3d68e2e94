"""Typed option sections: frozen dataclasses whose fields are command-line options.

Each field made by `option` carries its help, its option group, its flat key
(`key_of`: the field's name unless given; the flag is `flag(key)`) and whether a
resumed run must keep it (`identity`). A `Section` reads and writes its fields as
flat keys (`from_flat`, `flat`), also those of a nested section (`part`), and
checks their types as YAML and Python give them (`check_types`).
`training.config` defines the run's sections with them.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable

from apputil.errors import invalid

__all__ = ["Section", "check_types", "flag", "key_of", "option", "part"]


def option(
    default: typing.Any,
    help: str | None = None,
    *,
    group: str,
    identity: bool = False,
    metavar: str | None = None,
    key: str | None = None,
) -> typing.Any:
    """A field with what the command line and resume checks need to know of it.

    `key` is its flat name (the flag without dashes), when not the field's own.
    """
    metadata = {"group": group, "help": help, "identity": identity, "metavar": metavar,
                "key": key}  # fmt: skip
    return dataclasses.field(default=default, metadata=metadata)


def key_of(field: dataclasses.Field) -> str:
    """The flat key of a section's field: `name` of `TaskConfig` is `task`."""
    return field.metadata["key"] or field.name


def part(section: type) -> typing.Any:
    """A field that is a section of its own, nested: its fields are options too, with their
    flat keys (the schedule of `OptimizerConfig`)."""
    return dataclasses.field(default_factory=section, metadata={"part": section})


class Section:
    """What every section does: flat keys in and out, and its fields' types checked."""

    @classmethod
    def keys(cls) -> dict[str, str]:
        """Flat key -> field name, of its own options (not of its nested parts)."""
        return {key_of(f): f.name for f in dataclasses.fields(cls) if "part" not in f.metadata}  # type: ignore[arg-type]

    @classmethod
    def parts(cls) -> dict[str, typing.Any]:
        """Field name -> section class, of its nested parts."""
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        return {f.name: f.metadata["part"] for f in fields if "part" in f.metadata}

    @classmethod
    def options(cls) -> tuple[tuple[type, dataclasses.Field], ...]:
        """(the class that holds it, field) of every option, its parts' in place."""
        found: list[tuple[type, dataclasses.Field]] = []
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            part = field.metadata.get("part")
            found += part.options() if part else [(cls, field)]
        return tuple(found)

    @classmethod
    def from_flat(cls, values: dict[str, typing.Any]) -> typing.Any:
        """The section of the flat keys in `values` that are its own (the rest default)."""
        own = {name: values[key] for key, name in cls.keys().items() if key in values}
        parts = {name: part.from_flat(values) for name, part in cls.parts().items()}
        return cls(**own, **parts)

    def flat(self) -> dict[str, object]:
        flat = {key: getattr(self, name) for key, name in self.keys().items()}
        for name in self.parts():
            flat.update(getattr(self, name).flat())
        return flat

    def check_types(self, argument: Callable[[str], str] = str) -> None:
        check_types(self, skip=tuple(self.parts()), argument=argument)
        for name in self.parts():
            getattr(self, name).check_types(argument)


def flag(name: str) -> str:
    """The command-line flag of a field: `sigma_w` -> `--sigma-w`."""
    return "--" + name.replace("_", "-")


def check_types(
    config: object, skip: tuple[str, ...] = (), argument: Callable[[str], str] = flag
) -> None:
    """Raises `UsageError` naming the first field of a dataclass of a wrong type (by
    `argument` of its key: its flag by default)."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):  # type: ignore[arg-type]
        if field.name in skip:
            continue
        value, expected = getattr(config, field.name), hints[field.name]
        if not _is_instance(value, expected):
            raise invalid(argument(field.metadata.get("key") or field.name), _type_words(expected),
                          value)  # fmt: skip


def _is_instance(value: object, expected: typing.Any) -> bool:
    """`isinstance` for the field types used here (bool is no int; an int is a float)."""
    if isinstance(expected, types.UnionType):
        return any(_is_instance(value, arm) for arm in typing.get_args(expected))
    if expected is type(None):
        return value is None
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, expected)


def _type_words(expected: typing.Any) -> str:
    words = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    if isinstance(expected, types.UnionType):
        arms = typing.get_args(expected)
        said = " or ".join(words[a] for a in arms if a is not type(None))
        return said + " (or null)" if type(None) in arms else said
    return words[expected]
