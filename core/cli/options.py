"""The CLI's options built from the registries: one option per setting (default, help and range from
`core/settings.py` SETTINGS), one per declared policy parameter (the policy registry), and the float type
every number option uses. `core.cli.common` re-exports them (commands import them from there).
"""

from __future__ import annotations

import math
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
                   **overrides: Any):
    """--name from `core.settings.SETTINGS[name]`: default, help and range from the one table of defaults.

    `param` (a policy parameter of the same name) supplies the type and choices when it is stricter.
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
    return click.option(flag or row.flag, dest or name, **kwargs)


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
        options.append(click.option("--" + name.replace("_", "-"), name, type=_range_type(p.kind, p.low, p.high, p.choices),
                                    default=default, show_default=default is not None, help=p.help + note + who))
    for option in reversed(options):
        fn = option(fn)
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
            flags = ", ".join("--" + n.replace("_", "-") for n in sorted(takes)) or "none"
            raise click.UsageError(f"--{name.replace('_', '-')} does not apply to --policy {policy_name} "
                                   f"(its options: {flags})")
    return {n: values[n] for n in takes if n in values and values[n] is not None}
