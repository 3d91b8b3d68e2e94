"""`training.options`: the flags made from `RunConfig`, their help, and `--config` files."""

import re
import sys

import pytest

from training import options
from training.config import GROUPS, RunConfig, option_fields
from training.sections import flag, key_of


def _action(parser, dest):
    (action,) = [a for a in parser._actions if a.dest == dest]
    return action


def test_each_flag_shows_its_default_unless_it_has_none_or_is_a_switch():
    parser = options.run_parser("prog", "What the command does.")
    assert parser.description == "What the command does."
    assert _action(parser, "units").help == f"default: {RunConfig().model.units}"
    assert _action(parser, "epsilon").help == f"step size ε (default: {RunConfig().model.epsilon})"
    assert "default" not in _action(parser, "jit_compile").help  # a switch: --no-... shows it
    assert "default" not in _action(parser, "lr_boundaries").help  # None: nothing to show


def test_name_valued_flags_take_only_their_registrys_names(capsys):
    parser = options.run_parser("prog", "d")
    assert _action(parser, "model").choices == ("antisymmetric", "gated", "ablation", "lstm")
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--model", "transformer"])
    assert exit_.value.code == 2
    assert "argument --model: invalid choice: 'transformer'" in capsys.readouterr().err


def test_an_extra_field_brings_its_flag_alone_not_its_whole_group():
    parser = options.run_parser("prog", "d", groups=("optimizer",), extra=("units",))
    dests = {a.dest for a in parser._actions}
    assert {"learning_rate", "units"} <= dests
    assert not dests & {"epsilon", "gamma", "model", "steps"}  # units' group, another group


def test_config_file_sets_defaults_that_the_command_line_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("learning-rate: 0.5\nunits: 12\n")
    parser = options.run_parser("prog", "d")
    args = options.parse_with_config(parser, ["--config", str(path), "--units", "7"])
    assert (args.learning_rate, args.units, args.config) == (0.5, 7, str(path))


def test_without_an_argument_list_the_command_line_is_read(tmp_path, monkeypatch):
    path = tmp_path / "run.yaml"
    path.write_text("units: 12\n")
    monkeypatch.setattr(sys, "argv", ["prog", "--learning-rate", "0.25", "--config", str(path)])
    args = options.parse_with_config(options.run_parser("prog", "d"), None)
    assert (args.learning_rate, args.units, args.config) == (0.25, 12, str(path))


def test_the_config_flag_is_documented(capsys):
    with pytest.raises(SystemExit):
        options.parse_with_config(options.run_parser("prog", "d"), ["--help"])
    assert re.search(r"--config CONFIG\s+YAML file of option defaults", capsys.readouterr().out)


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "argument --config: no such file"),
        (
            "a: &x [1]\nb: *x\n",
            "argument --config: {path} is not valid YAML (line 2, column 4): "
            "aliases (*name) are not accepted in an options file\n",
        ),
        ("- 1\n- 2\n", "argument --config: {path} is not a mapping of options"),
        (
            # The problem, not the first line of PyYAML's text ("while parsing a flow node").
            "units: [\n",
            "argument --config: {path} is not valid YAML (line 2, column 1): "
            "expected the node content, but found '<stream end>'\n",
        ),
        (
            "a: b\nc\n",
            "argument --config: {path} is not valid YAML (line 3, column 1): "
            "could not find expected ':'\n",
        ),
        (
            "units: 8\nname: \x01\n",
            "argument --config: {path} is not valid YAML: unacceptable "
            "character #x0001: special characters are not allowed\n",
        ),
        ("colour: red\n", "argument --config: unknown option 'colour' in {path}"),
        # A file names no further file: `config` is the one flag it cannot set.
        ("config: other.yaml\n", "argument --config: unknown option 'config' in {path}"),
    ],
)
def test_bad_config_files_are_one_line_errors_naming_the_flag(tmp_path, capsys, text, message):
    path = tmp_path / "run.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        options.parse_with_config(options.run_parser("prog", "d"), ["--config", str(path)])
    assert exit_.value.code == 2
    assert message.format(path=path) in capsys.readouterr().err


def _groups(parser):
    """`{title: dests}` of the field groups that hold flags; each title is there once."""
    own = (parser._positionals, parser._optionals)  # argparse's: `--help`
    found = [
        (g.title, {a.dest for a in g._group_actions}) for g in parser._action_groups if g not in own
    ]
    titles = [title for title, dests in found if dests]
    assert len(titles) == len(set(titles)), titles
    return {title: dests for title, dests in found if dests}


def _fields(group):
    return {key_of(f) for f in option_fields() if f.metadata["group"] == group}


def test_each_group_of_fields_is_one_titled_section_of_the_help():
    groups = _groups(options.run_parser("prog", "d"))
    for group in GROUPS:
        assert groups[group] == _fields(group), group
    text = options.run_parser("prog", "d").format_help()
    for group in GROUPS:
        assert text.count(f"\n{group}:\n") == 1, group


def test_extra_fields_join_their_group_s_section_or_one_of_their_own():
    parser = options.run_parser("p", "d", groups=("optimizer",), extra=("learning_rate", "units"))
    groups = _groups(parser)
    units_group = {key_of(f): f for f in option_fields()}["units"].metadata["group"]
    assert groups == {"optimizer": _fields("optimizer"), units_group: {"units"}}


def test_any_field_can_be_an_extra_flag():
    for field in option_fields():
        if field.metadata["group"] == "optimizer":
            continue
        key = key_of(field)
        parser = options.run_parser("p", "d", groups=("optimizer",), extra=(key,))
        groups = _groups(parser)
        assert groups[field.metadata["group"]] == {key}, key


def test_the_help_names_each_value_as_its_field_says():
    text = " ".join(options.run_parser("prog", "d").format_help().split())
    named = [f for f in option_fields() if f.metadata["metavar"]]
    assert named
    for field in named:
        assert f"{flag(key_of(field))} {field.metadata['metavar']} " in text, key_of(field)
