"""The CLI's options built from the registries: one option per setting (default, help and range from
`core/settings.py` SETTINGS), one per declared policy parameter (the policy registry), and the float type
every number option uses. `core.cli.common` re-exports them (commands import them from there).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click

from core import settings
from core.decoding.policies import Param, list_policies
from core.errors import ForkpointError


class FiniteFloat(click.FloatRange):
    """A float option that refuses NaN and ±inf (they pass every range comparison), then checks the range:
    the one float type of every CLI option, so a bad number is refused before anything loads (exit 2)."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            where = self._describe_range()
            self.fail(f"{value!r} is not a finite number" + (f"; give a number {where}" if where else ""), param, ctx)
        return super().convert(number, param, ctx)

    def _describe_range(self) -> str:
        """click's range text ("0.0<=x<=1.0"), or "" when unbounded (click would print "x<=None" in --help)."""
        return super()._describe_range() if self.min is not None or self.max is not None else ""


class AliasedOption(click.Option):
    """An option whose older spellings (`hidden_aliases`) still work but are shown nowhere: --help and error
    messages name only its one spelling, so users' scripts keep running while every command reads alike."""

    def __init__(self, *args: Any, hidden_aliases: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hidden_aliases = tuple(hidden_aliases)

    @contextmanager
    def _shown(self) -> Iterator[None]:
        """`opts` without the hidden aliases, while click writes help or an error hint."""
        opts = self.opts
        self.opts = [o for o in opts if o not in self.hidden_aliases]
        try:
            yield
        finally:
            self.opts = opts

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        with self._shown():
            return super().get_help_record(ctx)

    def get_error_hint(self, ctx: click.Context | None) -> str:
        with self._shown():
            return super().get_error_hint(ctx)


def option(flag: str, *decls: str, aliases: Sequence[str] = (), **kwargs: Any):
    """click.option(flag, *decls) with `aliases`, older spellings of `flag` kept working and hidden."""
    if not aliases:
        return click.option(flag, *decls, **kwargs)
    return click.option(flag, *aliases, *decls, cls=AliasedOption, hidden_aliases=tuple(aliases), **kwargs)


def _range_type(kind: type, low: float | None, high: float | None, choices: tuple[str, ...] = (),
                open_low: bool = False, open_high: bool = False) -> Any:
    """A click type that checks the range at the edge, so a bad value is reported against its flag."""
    if choices:
        return click.Choice(choices)
    if kind is float:
        return FiniteFloat(low, high, min_open=open_low, max_open=open_high)
    if low is None and high is None:
        return kind
    if kind is int:
        return click.IntRange(None if low is None else int(low), None if high is None else int(high),
                              min_open=open_low, max_open=open_high)
    return kind


def setting_option(name: str, param: Param | None = None, *, dest: str | None = None, flag: str | None = None,
                   aliases: Sequence[str] = (), **overrides: Any):
    """--name from `core.settings.SETTINGS[name]`: default, help and range from the one table of defaults.

    `param` (a policy parameter of the same name) supplies the type and choices when it is stricter; `aliases`:
    older spellings of the flag, kept working and hidden.
    """
    row = settings.SETTINGS[name]
    kind = float if row.value is None else type(row.value)
    low, high, choices = row.low, row.high, row.choices
    open_low, open_high = row.open_low, row.open_high
    if param is not None:
        kind, choices = param.kind, param.choices or choices
        if param.low is not None:
            low, open_low = param.low, param.open_range
        if param.high is not None:
            high, open_high = param.high, param.open_range
    if kind is str and not choices and name == "score":
        from core.scoring.registry import SCORES

        choices = SCORES
    kwargs = {"type": _range_type(kind, low, high, choices, open_low, open_high), "default": row.value,
              "show_default": True, "help": row.help}
    kwargs.update(overrides)
    return option(flag or row.flag, dest or name, aliases=aliases, **kwargs)


def preset_setting_option(name: str, preset: str = "preset"):
    """--name from SETTINGS with its range, left None so that a named preset (or the setting) fills it."""
    row = settings.SETTINGS[name]
    return setting_option(name, default=None, show_default=False, help=f"{row.help} [default: {preset} or {row.value}]")


def float_list(text: str, name: str, flag: str) -> list[float]:
    """Comma-separated numbers, each valid for `SETTINGS[name]`; at least one (an empty list is refused)."""
    row = settings.SETTINGS[name]
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise click.BadParameter(f"give at least one number {row.range_text()}, e.g. {row.value}", param_hint=flag)
    out = []
    for x in items:
        if not x:
            continue
        try:
            value = float(x)
        except ValueError:
            raise click.BadParameter(f"takes comma-separated numbers {row.range_text()}, got {x!r}",
                                     param_hint=flag) from None
        try:
            out.append(row.check(value, f"each of {flag}"))
        except ForkpointError as err:
            raise click.BadParameter(str(err), param_hint=flag) from None
    return out


# -- one spelling per concept: options that several commands share -------------------------------------------


def calibration_option(default: str, *, multiple: bool = False, in_sample: bool = False,
                       aliases: Sequence[str] = ()):
    """--calibration SOURCE: the problems whose base rollouts calibrate the gates (generate, eval, gates,
    reproduce); `default` says what a command takes without it, `in_sample` that 'in-sample' is accepted."""
    more = (" 'in-sample' calibrates on the problems that are then run (and says so)." if in_sample else "")
    return option("--calibration", "calibration", aliases=aliases, multiple=multiple,
                  help="Problems whose base rollouts calibrate the gate: a JSONL/CSV file, hf:<dataset id>[:config]"
                       f"[:split] or a benchmark short name{' (repeatable)' if multiple else ''}." + more +
                       f" Default: {default}.")


def gate_rhos_option(default: str | None, help: str, *, aliases: Sequence[str] = ()):
    """--gate-rhos: the shoot-out's comma-separated target takeover rates ρ (gates, reproduce --gate-rhos);
    `default` None: no shoot-out unless given."""
    return option("--gate-rhos", "gate_rhos", aliases=aliases, default=default, show_default=default is not None,
                  help=help)


def router_folder_option(help: str, *, aliases: Sequence[str] = ()):
    """--router DIR: a trained router's folder (gates, reproduce; the router policy's `path` in generate and
    effects, see PARAM_FLAGS)."""
    return option("--router", "router_path", aliases=aliases, type=click.Path(file_okay=False), help=help)


def sample_temperature_option(aliases: Sequence[str] = ()):
    """--sample-temperature: the temperature of children decoded from a stored trace (takeover's children,
    effects' and curve's continuations); None: the trace's own, or the fan temperature for a greedy trace."""
    return setting_option("temperature", dest="sample_temperature", flag="--sample-temperature", aliases=aliases,
                          default=None, show_default=False,
                          help="Sampling temperature of the children decoded from the trace (default: the trace's "
                               "own; sampled children of a greedy trace: the paper's 0.6).")


# A policy parameter whose CLI spelling is not its name: the concept has one spelling in every command (gates and
# reproduce name a trained router's folder --router), and the parameter's own name stays a hidden alias.
PARAM_FLAGS = {"path": "--router"}


def param_flag(name: str) -> str:
    """The CLI flag of policy parameter `name` (--max-takeovers for max_takeovers; PARAM_FLAGS where it differs)."""
    return PARAM_FLAGS.get(name, "--" + name.replace("_", "-"))


def settings_options(*names: str):
    """Decorator: one `setting_option` per name, in the given order."""

    def decorate(fn):
        for name in reversed(names):
            fn = setting_option(name)(fn)
        return fn

    return decorate


def policy_params() -> dict[str, Param]:
    """Every parameter a user may set on some offered policy, one per name (first declaration wins)."""
    out: dict[str, Param] = {}
    for spec in list_policies():
        for p in spec.params:
            out.setdefault(p.name, p)
    return out


def policy_options(fn):
    """--policy plus one option per declared policy parameter, all generated from the policy registry.

    A parameter that is also a setting (seed, window, score) is one option with the setting's default.
    Gate parameters (--tau, --lam) default to "calibrate on the problems".
    """
    specs = list_policies()
    users = {name: [s.label for s in specs if name in s.calibration or any(p.name == name for p in s.params)]
             for name in policy_params()}  # the policies that take it, or whose calibration reads it (ratio)
    options = [click.option("--policy", "policy_name", type=click.Choice([s.name for s in specs]), default="base_only",
                            show_default=True, help="Takeover policy: " + "; ".join(f"{s.name} ({s.help.rstrip('.')})" for s in specs))]
    for name, p in policy_params().items():
        who = f" [{', '.join(users[name])}]"
        if name in settings.SETTINGS:  # a setting has its own use beyond these policies (the seed: all sampling)
            options.append(setting_option(name, p, help=f"{settings.SETTINGS[name].help} [also read by: "
                                                       f"{', '.join(users[name])}]"))
            continue
        default = None if (p.optional or p.from_gate) else p.default
        note = " (default: none)" if p.optional else " (default: calibrated on the problems)" if p.from_gate else ""
        own = "--" + name.replace("_", "-")
        options.append(option(param_flag(name), name, aliases=[own] if own != param_flag(name) else [],
                              type=_range_type(p.kind, p.low, p.high, p.choices), default=default,
                              show_default=default is not None, help=p.help + note + who))
    for decorate in reversed(options):
        fn = decorate(fn)
    return fn


def policy_kwargs(policy_name: str, values: dict[str, Any]) -> dict[str, Any]:
    """The make_policy keyword arguments for `policy_name` from the generated options' values.

    A policy-only option given on the command line for a policy that does not take it is a usage error.
    """
    spec = next(s for s in list_policies() if s.name == policy_name)
    takes = {p.name for p in spec.params}
    ctx = click.get_current_context()
    for name in policy_params():
        if name not in takes and name not in settings.SETTINGS and \
                ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            flags = ", ".join(param_flag(n) for n in sorted(takes)) or "none"
            raise click.UsageError(f"{param_flag(name)} does not apply to --policy {policy_name} "
                                   f"(its options: {flags})")
    return {n: values[n] for n in takes if n in values and values[n] is not None}
