"""core/pair/options.py: one table of pair options read by the CLI's flags, the app's start-up arguments,
`PairChoice` and `PairSpec` (they cannot drift apart)."""

from __future__ import annotations

import dataclasses
import inspect

import click

from app.config import PairChoice, _parser, parse_args
from core import settings
from core.cli.common import pair_options
from core.pair.loading import load_pair
from core.pair.options import PAIR_OPTION_NAMES, PAIR_OPTIONS, load_pair_arguments
from core.scale.spec import PairSpec


def _cli_params() -> dict[str, click.Option]:
    @click.command()
    @pair_options
    def command(**_: object) -> None:
        pass

    return {p.name: p for p in command.params}


def test_every_option_is_a_load_pair_argument_with_its_default():
    params = inspect.signature(load_pair).parameters
    for o in PAIR_OPTIONS:
        assert o.name in params, o.name
        if params[o.name].default is not inspect.Parameter.empty and o.setting:
            assert params[o.name].default == o.default == settings.SETTINGS[o.name].value, o.name


def test_the_cli_flags_are_the_table():
    params = _cli_params()
    assert list(params) == list(PAIR_OPTION_NAMES)
    for o in PAIR_OPTIONS:
        assert params[o.name].opts == [o.flag] and bool(params[o.name].is_flag) == o.switch, o.name
        if o.setting:
            assert params[o.name].default == settings.SETTINGS[o.name].value


def test_the_app_arguments_are_the_table_and_fill_pair_choice():
    flags = {a.option_strings[0]: a for a in _parser()._actions if a.option_strings}
    for o in PAIR_OPTIONS:
        assert o.flag in flags and flags[o.flag].default == o.default, o.name
    assert [f.name for f in dataclasses.fields(PairChoice)] == ["demo", *PAIR_OPTION_NAMES]
    assert [f.default for f in dataclasses.fields(PairChoice)][1:] == [o.default for o in PAIR_OPTIONS]
    argv = ["--base", "b/x", "--reason", "r/y", "--base-format", "Q: {problem}", "--reason-format", "chat",
            "--base-revision", "v1", "--reason-revision", "v2", "--device", "cpu", "--dtype", "float16",
            "--trust-remote-code"]
    choice = parse_args(argv).pair
    assert choice.load_arguments() == {"base": "b/x", "reason": "r/y", "base_format": "Q: {problem}",
                                       "reason_format": "chat", "base_revision": "v1", "reason_revision": "v2",
                                       "device": "cpu", "dtype": "float16", "trust_remote_code": True}


def test_pair_spec_carries_the_table_but_the_per_worker_device():
    assert [f.name for f in dataclasses.fields(PairSpec)] == [o.name for o in PAIR_OPTIONS if not o.per_worker]
    assert [o.name for o in PAIR_OPTIONS if o.per_worker] == ["device"]


def test_load_arguments_fill_defaults_and_empty_means_core_default():
    args = load_pair_arguments({"base": "b", "reason": "r", "base_format": "", "dtype": None})
    assert args == {"base": "b", "reason": "r", "base_format": None, "reason_format": None, "base_revision": None,
                    "reason_revision": None, "device": settings.DEVICE, "dtype": settings.DTYPE,
                    "trust_remote_code": False}
    assert "device" not in load_pair_arguments({"base": "b", "reason": "r"}, per_worker=False)
