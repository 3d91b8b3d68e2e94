"""Command-line options of `training.train` and `training.tune`, built from `RunConfig`'s fields.

Each field of `training.config.RunConfig` becomes one flag (`sigma_w` ->
`--sigma-w`) with the field's default, type and help, in the field's group;
the choices of the name-valued options come from their registries. `--config
FILE.yaml` sets defaults from a YAML mapping whose keys are option names
(`learning_rate` or `learning-rate`); options given on the command line
override it. Nothing here imports Keras or TensorFlow: `--help` and usage
errors answer at once.
"""

from __future__ import annotations

import argparse
import os
import sys
import typing

import yaml

from apputil.cli import OneLineParser
from apputil.errors import shown
from training.backends.backend import STRATEGIES
from training.config import DTYPE_POLICIES, GROUPS, MODEL_NAMES, option_fields, option_types
from training.errors import ConfigFileError
from training.sections import flag, key_of
from training.tasks.catalog import MNIST_DATASETS, TASK_NAMES
from training.tasks.optimizers import OPTIMIZERS

CHOICES = {
    "task": TASK_NAMES,
    "dataset": MNIST_DATASETS,
    "model": MODEL_NAMES,
    "dtype_policy": DTYPE_POLICIES,
    "optimizer": OPTIMIZERS,
    "strategy": STRATEGIES,
}


def run_parser(
    prog: str,
    description: str,
    groups: tuple[str, ...] = GROUPS,
    extra: tuple[str, ...] = (),
    defaults: dict[str, object] | None = None,
) -> OneLineParser:
    """A parser with the flags of `RunConfig`'s fields in `groups`, and the fields `extra`.

    `defaults` replaces some fields' defaults (e.g. the tuner holds out a
    validation split by default).
    """
    parser = OneLineParser(prog=prog, description=description)
    hints = option_types()
    defaults = defaults or {}
    sections = {group: parser.add_argument_group(group) for group in groups}
    for field in option_fields():
        group, key = field.metadata["group"], key_of(field)
        if group not in sections and key in extra:
            sections[group] = parser.add_argument_group(group)
        if group not in sections or (group not in groups and key not in extra):
            continue
        default = defaults.get(key, field.default)
        kwargs: dict = {"default": default, "help": _help(field.metadata["help"], default)}
        kind = _scalar_type(hints[key])
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = kind
            kwargs["metavar"] = field.metadata["metavar"]
            if key in CHOICES:
                kwargs["choices"] = CHOICES[key]
        sections[group].add_argument(flag(key), **kwargs)
    return parser


def _scalar_type(hint):
    """`int` for `int | None`, `str` for `str`, ..."""
    arms = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return arms[0]


def _help(text, default):
    if default is None or isinstance(default, bool):
        return text
    shown_default = f"default: {default}"
    return f"{text} ({shown_default})" if text else shown_default


def parse_with_config(
    parser: argparse.ArgumentParser, argv: list[str] | None
) -> argparse.Namespace:
    """Parses `argv`, taking defaults from the `--config` YAML file if given."""
    parser.add_argument("--config", default=None, help="YAML file of option defaults")
    argv = sys.argv[1:] if argv is None else list(argv)
    known, _ = parser.parse_known_args(argv)
    if known.config:
        try:
            values = read_yaml_mapping(known.config, "--config")
        except ConfigFileError as error:
            parser.error(str(error))
        dests = {action.dest for action in parser._actions}
        defaults = {}
        for key, value in values.items():
            dest = str(key).replace("-", "_")
            if dest not in dests or dest == "config":
                parser.error(f"argument --config: unknown option {shown(key)} in {known.config}")
            defaults[dest] = value
        parser.set_defaults(**defaults)
    return parser.parse_args(argv)


def read_yaml_mapping(path: str, argument: str) -> dict:
    """The mapping of a YAML file given as `argument`; `ConfigFileError` if it is not one.

    Aliases are refused: a few hundred bytes of nested aliases expand to
    gigabytes, and an options file has no use for them.
    """
    if not os.path.isfile(path):
        raise ConfigFileError(f"argument {argument}: no such file {path!r}")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        text = data.decode("utf-8")
        values = yaml.load(text, Loader=_NoAliasLoader)
    except UnicodeDecodeError:
        raise ConfigFileError(f"argument {argument}: {path} is not a UTF-8 text file") from None
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        # A reader error (a control character) has no problem text: its message's first line.
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigFileError(
            f"argument {argument}: {path} is not valid YAML{at}: {problem}"
        ) from None
    values = values or {}
    if not isinstance(values, dict):
        raise ConfigFileError(f"argument {argument}: {path} is not a mapping of options")
    return values


class _NoAliasLoader(yaml.SafeLoader):
    """YAML's safe loader without aliases (anchors alone are harmless)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.constructor.ConstructorError(
                None, None, "aliases (*name) are not accepted in an options file", mark
            )
        return super().compose_node(parent, index)
