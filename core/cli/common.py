"""Shared pieces of the command line: the `forkpoint` group, pair and store options, error translation.

Core exceptions become clean CLI errors at this edge (no tracebacks for user mistakes).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from core import settings
from core.decoding.policies import Param, list_policies
from core.errors import ForkpointError
from core.pair.formats import PromptFormat, format_spec


# What stored or imported text may not send to a terminal: C0 controls but tab and newline (ESC starts CSI and
# OSC sequences, BEL ends OSC, CR rewrites the line), DEL and C1 controls, bidirectional overrides (they reorder
# what is shown) and lone surrogates (they cannot be printed at all).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def terminal_text(text: Any) -> str:
    """`text` as it may be printed: every control or escape character (and lone surrogate) shown escaped
    (\\x1b, \\x07, \\u202e), so no stored or imported text can drive the terminal. The one sanitiser
    for everything the CLI prints (`echo`, error messages, log lines)."""
    return _UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                       str(text))


def echo(message: Any = "", *, err: bool = False, nl: bool = True) -> None:
    """click.echo through `terminal_text`: how every CLI command prints."""
    click.echo(terminal_text(message), err=err, nl=nl)


def fail_cleanly(fn):
    """Show ForkpointError messages as CLI errors, not tracebacks, naming CLI flags for Python arguments."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ForkpointError as err:
            close_bars()  # the message starts on a clean line, not on a progress bar's
            raise click.ClickException(terminal_text(cli_words(str(err)))) from err
        except (click.ClickException, KeyboardInterrupt):
            close_bars()
            raise

    return wrapper


def cli_words(message: str) -> str:
    """A core message as the CLI user reads it: argument names with an underscore become their flags
    (max_new_tokens -> --max-new-tokens); one-word names (score, rate) are plain words and stay."""
    names = sorted({n for n in (*settings.SETTINGS, *policy_params()) if "_" in n}, key=len, reverse=True)
    pattern = r"(?<![\w.-])(" + "|".join(map(re.escape, names)) + r")\b"
    message = re.sub(pattern, lambda m: "--" + m.group(1).replace("_", "-"), message)
    return re.sub(r"(?<![\w.-])(format|score|store)=(?![\w'\"])", r"--\1", message)  # "give format=" -> "give --format"


def checked_text(ctx: click.Context | None, param: click.Parameter | None, value: Any) -> Any:
    """Click callback for every free-text option or argument: `settings.check_text` (lone surrogates or bytes
    that are not UTF-8, NUL, size) at the edge, a usage error naming the flag, before anything loads."""
    if value is None:
        return None
    if isinstance(value, tuple):
        return tuple(checked_text(ctx, param, v) for v in value)
    flag = max(param.opts, key=len) if isinstance(param, click.Option) else (param.human_readable_name if param else "text")
    try:
        return settings.check_text(value, flag, from_bytes=True)  # argv is decoded with surrogateescape
    except ForkpointError as err:
        raise click.BadParameter(str(err).removeprefix(f"{flag} "), ctx, param) from None


def checked_format(ctx: click.Context | None, param: click.Parameter | None, value: Any) -> Any:
    """--base-format / --reason-format: text checked, then parsed as a prompt format (a template without
    {problem}, a bad chat spec) before anything loads, for the demo pair and any other alike."""
    value = checked_text(ctx, param, value)
    if value is not None:
        try:
            PromptFormat(format_spec(value))
        except ForkpointError as err:
            raise click.BadParameter(str(err), ctx, param) from None
    return value


def _check_device(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """--device's spelling, checked before anything loads (whether that CUDA device exists is the loader's
    check, which needs torch)."""
    if value is not None and not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value):
        raise click.BadParameter(f"unknown device {value!r}; use auto, cpu, cuda or cuda:N", ctx, param)
    return value


def pair_options(fn):
    """--base/--reason/... : the model pair (the bundled demo pair when neither is given), one option per row of
    core/pair/options.py PAIR_OPTIONS (settings rows through `setting_option`: their ranges and choices)."""
    from core.pair.options import PAIR_OPTIONS

    checks = {"device": _check_device, "base_format": checked_format, "reason_format": checked_format}
    options = [
        setting_option(o.name, **({"callback": checks[o.name]} if o.name in checks else {})) if o.setting
        else click.option(o.flag, is_flag=True, help=o.describe()) if o.switch
        else click.option(o.flag, help=o.describe(), **({"callback": checks[o.name]} if o.name in checks else {}))
        for o in PAIR_OPTIONS
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def store_option(fn):
    return click.option("--store", "store_path", type=click.Path(file_okay=False),
                        help="Trace store directory (default: $FORKPOINT_STORE or ./forkpoint-store).")(fn)


def pair_from_options(opts: dict[str, Any]):
    from core.pair.loading import load_pair
    from core.pair.options import load_pair_arguments

    if not opts.get("base") and not opts.get("reason"):
        import torch

        from core.demo.pair import demo_pair

        torch.set_num_threads(1)  # the demo models are tiny: more threads only add overhead
        dtype = opts.get("dtype", settings.DTYPE)
        return demo_pair(device=opts.get("device", settings.DEVICE), **({} if dtype == "auto" else {"dtype": dtype}),
                         base_format=opts.get("base_format"), reason_format=opts.get("reason_format"))
    if not (opts.get("base") and opts.get("reason")):
        raise click.UsageError("Give both --base and --reason (or neither, for the demo pair).")
    from core.errors import ModelLoadError, VocabularyMismatchError

    try:
        return load_pair(**load_pair_arguments(opts))
    except VocabularyMismatchError as err:  # a usage error: these two models cannot make a pair
        raise click.BadParameter(cli_words(str(err)), param_hint="--base / --reason") from None
    except ModelLoadError as err:
        flag = {"base": "--base", "reason": "--reason"}.get(err.side or "", "--base / --reason")
        if "does not exist" in str(err):
            raise click.BadParameter(str(err), param_hint=flag) from None
        raise click.ClickException(terminal_text(f"{flag}: {cli_words(str(err))}")) from err


def ray_option(fn):
    """--ray [ADDRESS], --workers N, --gpus-per-worker G: run on Ray workers (docs/SCALE.md)."""
    fn = click.option("--gpus-per-worker", type=FiniteFloat(min=0), default=None, metavar="G",
                      help="With --ray: GPUs per worker (default 1; above 1, whole GPUs, and each worker spreads "
                           "the pair over its GPUs: a pair larger than one GPU).")(fn)
    fn = click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
                      help="With --ray: how many workers (default: as many as the free GPUs, else CPUs, hold).")(fn)
    return click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
                        help="Run on Ray workers: alone for a local Ray, or auto / ray://host:port to join a "
                             "cluster (needs the ray extra; see docs/SCALE.md).")(fn)


def make_executor(ray_address: str | None, opts: dict[str, Any] | None = None):
    """A RayExecutor for --ray (progress shows in the command's own bar), or None: in-process. Takes
    --workers and --gpus-per-worker out of `opts`."""
    opts = {} if opts is None else opts
    workers, gpus = opts.pop("workers", None), opts.pop("gpus_per_worker", None)
    if ray_address is None:
        if workers is not None or gpus is not None:
            raise click.UsageError("--workers and --gpus-per-worker need --ray (they size the Ray workers).")
        return None
    from core.scale import RayExecutor

    return RayExecutor(address=None if ray_address == "local" else ray_address, workers=workers,
                       gpus_per_worker=1 if gpus is None else gpus)


def pair_or_spec(opts: dict[str, Any], executor: Any):
    """With an executor, the pair as a PairSpec (only the workers load it); else the loaded pair."""
    if executor is None:
        return pair_from_options(opts)
    from core.pair.options import load_pair_arguments
    from core.scale import PairSpec

    if not opts.get("base") and not opts.get("reason"):
        return PairSpec.demo(opts.get("base_format"), opts.get("reason_format"))
    if not (opts.get("base") and opts.get("reason")):
        raise click.UsageError("Give both --base and --reason (or neither, for the demo pair).")
    return PairSpec(**load_pair_arguments(opts, per_worker=False))


def close_executor(executor: Any) -> None:
    """Print the Ray workers' throughput (stderr) and stop them."""
    if executor is None:
        return
    summary = executor.summary()
    if not summary.empty:
        echo("per-worker throughput:\n" + summary.to_string(index=False), err=True)
    executor.close()


def open_store(path: str | None):
    from core.io.store import TraceStore, default_store_path

    return TraceStore(path or default_store_path())


def read_problems(path: str | None, limit: int | None):
    if path is None:
        from core.demo.pair import demo_problems

        problems = demo_problems()
        return problems[:limit] if limit else problems
    from core.evaluation.problems import load_problems

    return load_problems(path, limit=limit)


_OPEN_BARS: list[Any] = []  # tqdm bars on screen now; closed before an error message is printed


def close_bars() -> None:
    """Clear every progress bar still on screen (leave=False bars erase their line)."""
    while _OPEN_BARS:
        _OPEN_BARS.pop().close()


def open_bar(**kwargs: Any) -> Any:
    """A tqdm bar on stderr that `close_bars` clears when the command fails."""
    from tqdm import tqdm

    bar = tqdm(leave=False, file=sys.stderr, **kwargs)
    _OPEN_BARS.append(bar)
    return bar


class Bar:
    """A tqdm bar driven by core's progress(done, total) callbacks, counting `unit`s."""

    def __init__(self, desc: str, unit: str) -> None:
        self.bar = open_bar(desc=desc, unit=unit)

    def __call__(self, done: int, total: int) -> None:
        self.bar.total = total
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar in _OPEN_BARS:
            _OPEN_BARS.remove(self.bar)
        self.bar.close()


class _TqdmLogHandler(logging.Handler):
    """Log records printed above the progress bars (tqdm.write), never onto a bar's line."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(terminal_text(self.format(record)), file=sys.stderr)
        except Exception:  # noqa: BLE001  logging must never fail the command
            self.handleError(record)


class FiniteFloat(click.FloatRange):
    """A float option that refuses NaN and ±inf (they pass every range comparison), then checks the range:
    the one float type of every CLI option, so a bad number is refused before anything loads (exit 2)."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            where = self._describe_range() if (self.min is not None or self.max is not None) else "a finite number"
            self.fail(f"{value!r} is not a finite number; give a number {where}", param, ctx)
        return super().convert(number, param, ctx)


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


def check_output(path: str | os.PathLike[str], flag: str, *, folder: bool = False, parents: bool = True,
                 offer_parents: bool = False) -> Path:
    """Check, before any model loads, that `path` (a file, or a folder) can be written; else a usage error
    naming the flag. Missing folders are refused unless `parents` (they are then made by the writer);
    `offer_parents`: the command has a --parents flag to name in that message."""
    from core.io.atomic import os_error_reason

    target = Path(path)
    if not folder and target.is_dir():
        raise click.BadParameter(f"{target} is a folder; give a file name", param_hint=flag)
    if folder and target.exists() and not target.is_dir():
        raise click.BadParameter(f"{target} is a file, not a folder", param_hint=flag)
    parent = target if folder else target.parent
    existing = parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise click.BadParameter(f"cannot write {target}: {existing} is not a folder", param_hint=flag)
    if existing != parent and not parents:
        raise click.BadParameter(f"the folder {parent} does not exist; create it first"
                                 + (" or pass --parents" if offer_parents else ""), param_hint=flag)
    try:  # a real probe: permissions alone do not tell (root, read-only mounts, /proc)
        fd, probe = tempfile.mkstemp(prefix=".forkpoint-probe.", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise click.BadParameter(f"cannot write {target}: {os_error_reason(exc)} in {existing}",
                                 param_hint=flag) from None
    return target


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
    users = {name: [s.label for s in specs if any(p.name == name for p in s.params)] for name in policy_params()}
    options = [click.option("--policy", "policy_name", type=click.Choice([s.name for s in specs]), default="base_only",
                            show_default=True, help="Takeover policy: " + "; ".join(f"{s.name} ({s.help.rstrip('.')})" for s in specs))]
    for name, p in policy_params().items():
        who = f" [{', '.join(users[name])}]"
        if name in settings.SETTINGS:
            options.append(setting_option(name, p, help=settings.SETTINGS[name].help + who))
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
            flags = ", ".join("--" + n.replace("_", "-") for n in sorted(takes - {"tau", "lam", "window"})) or "none"
            raise click.UsageError(f"--{name.replace('_', '-')} does not apply to --policy {policy_name} "
                                   f"(its options: {flags})")
    return {n: values[n] for n in takes if n in values and values[n] is not None}


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log what core does.")
def main(verbose: bool) -> None:
    """forkpoint: where a base and a reasoning model disagree, token by token."""
    handler = _TqdmLogHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
    if not verbose:  # read when transformers loads: file-only commands (ls, export) never import it
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        if "transformers" in sys.modules:  # already loaded (a test runner, a notebook): tell it directly
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            hf_logging.set_verbosity_error()

