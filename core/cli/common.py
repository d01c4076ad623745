"""Shared pieces of the command line: the `forkpoint` group, pair and store options, error translation.

Core exceptions become clean CLI errors at this edge (no tracebacks for user mistakes).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from core import settings
from core.cli.options import (  # noqa: F401  (re-exported: every command imports its options from here)
    FiniteFloat,
    calibration_option,
    float_list,
    gate_rhos_option,
    option,
    policy_kwargs,
    policy_options,
    policy_params,
    preset_setting_option,
    router_folder_option,
    sample_temperature_option,
    setting_option,
    settings_options,
)
from core.errors import ForkpointError
from core.pair.formats import PromptFormat, format_spec


# What stored or imported text may not send to a terminal: C0 controls but tab and newline (ESC starts CSI and
# OSC sequences, BEL ends OSC, CR rewrites the line), DEL and C1 controls, bidirectional overrides (they reorder
# what is shown) and lone surrogates (they cannot be printed at all).
_UNSAFE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{settings.BIDI_CONTROLS}\ud800-\udfff]")


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


def pair_max_new_tokens(pair: Any, given: int) -> int:
    """--max-new-tokens for `pair`: as given on the command line, else the pair's default
    (`ModelPair.default_max_new_tokens`: the setting, at most half its shorter context; 96 on the demo pair), so
    a default never overruns a small context and an explicit length that does is warned about. A PairSpec (--ray:
    the driver holds no model) keeps the setting."""
    source = click.get_current_context().get_parameter_source("max_new_tokens")
    if source in (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT):
        return given
    fit = getattr(pair, "default_max_new_tokens", None)
    return fit(given) if fit is not None else given


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


def overwrite_option(what: str = "--out", note: str = ""):
    """--overwrite: replace `what` when it exists (without it a command refuses, naming the flag: `free_output`)."""
    return click.option("--overwrite", is_flag=True, help=f"Replace {what} when it exists{note}.")


def free_output(out: str | os.PathLike[str], overwrite: bool, *, own: Callable[[Path], bool] | None = None,
                command: str = "") -> Path:
    """`out` as a Path, unless it exists and --overwrite was not given: then a CLI error naming --overwrite.

    `own(path)`: whether an existing `out` is this resumable command's own output (`command`, e.g. "eval"), which
    a rerun rewrites without --overwrite; anything else that exists is still refused."""
    path = Path(out)
    if path.exists() and not overwrite and not (own is not None and own(path)):
        whose = f" and is not `forkpoint {command}` output" if own is not None else ""
        raise click.ClickException(f"{path} exists{whose}; pass --overwrite to replace it (or choose another --out)")
    return path


def given_traces(store: Any, keys: tuple[str, ...], hint: str) -> list[Any]:
    """The stored traces under `keys`; else a usage error naming every key not readable there and `hint`, the
    option or argument that gave them as the command's --help shows it (--key, KEY)."""
    missing = [k for k in keys if k not in store]
    if missing:
        raise click.BadParameter(f"no readable trace {', '.join(map(repr, missing))} in {store.path} (see "
                                 "`forkpoint ls`)", param_hint=hint)
    return [store.get(k) for k in keys]


def read_problems(path: str | None, limit: int | None):
    if path is None:
        from core.demo.pair import demo_problems

        problems = demo_problems()
        return problems[:limit] if limit else problems
    from core.evaluation.problems import load_problems

    return load_problems(path, limit=limit)


def read_source(source: str | None, limit: int | None) -> list:
    """Problems from a source (a file, hf:<id>, a benchmark short name); None: the demo test set."""
    if source is None:
        return read_problems(None, limit)
    from core.evaluation.sources import load_source

    return load_source(source, limit=limit)


def problems_and_calibration(problems_path: str | None, calibration: str | None, limit: int | None,
                             n: int, verb: str = "running") -> tuple[list, list]:
    """(the problems a run evaluates, the ones its gates calibrate on): --problems (first --limit), split by
    `calibration_split` with at most `n` (--calibration-problems) calibration problems."""
    calibration_set, problems = calibration_split(calibration, read_source(problems_path, limit), problems_path, n,
                                                  verb=verb)
    return problems, calibration_set


def calibration_split(calibration: str | None, problems: list[Any], problems_path: str | None, n: int, *,
                      prompt: str | None = None, verb: str = "running") -> tuple[list[Any], list[Any]]:
    """(calibration problems, problems to run), at most `n` (the calibration_problems setting) calibrating: the
    first n of --calibration SOURCE; 'in-sample': the first n of the problems, still run (said on stderr); the
    demo calibration set's first n with the demo problems or one --prompt; else n held out from --problems (at
    most a quarter; said on stderr), which are then not run. The one split of generate, eval and gates."""
    # deferred: torch, transformers and pandas, which a command loads only once it runs
    from core.demo.pair import demo_problems
    from core.evaluation.sources import load_source
    from core.reports.reproduce import split_calibration

    if calibration == "in-sample":
        echo(f"calibrating IN-SAMPLE on {min(n, len(problems))} of the problems it then runs: the gate sees its "
             "own evaluation problems (use --calibration SOURCE, or leave it out to hold problems out)", err=True)
        return problems[:n], problems
    if calibration:
        return load_source(calibration, limit=n), problems
    if prompt or problems_path is None:
        if prompt:
            echo("a single --prompt holds nothing out: calibrating on the demo calibration set (pass "
                 "--calibration SOURCE for another pair's problems)", err=True)
        return demo_problems("calib", limit=n), problems
    held, rest = split_calibration({"problems": problems}, n)
    echo(f"holding out {len(held)} problems for calibration; {verb} the other {len(rest['problems'])}", err=True)
    return held, rest["problems"]


_OPEN_BARS: list[Any] = []  # tqdm bars on screen now; closed before an error message is printed
LOG_INTERVAL_S = 30.0  # on a stderr that is not a terminal (a log file), a bar prints at most this often


def close_bars() -> None:
    """Clear every progress bar still on screen (leave=False bars erase their line)."""
    while _OPEN_BARS:
        _close(_OPEN_BARS.pop())


def _close(bar: Any) -> None:
    bar.close()
    sys.stderr.flush()  # a left bar's last newline, before what the command prints next


def open_bar(**kwargs: Any) -> Any:
    """A tqdm bar on stderr that `close_bars` clears when the command fails. On a terminal it redraws in place
    (and is erased when done); on anything else (a log file, a pipe) it prints when it starts, at most every
    LOG_INTERVAL_S seconds, and its final count when it ends: tqdm's mininterval, not a line per update."""
    from tqdm import tqdm

    terminal = sys.stderr.isatty()
    interval = {} if terminal else {"mininterval": LOG_INTERVAL_S, "maxinterval": LOG_INTERVAL_S}
    bar = tqdm(leave=not terminal, file=sys.stderr, **interval, **kwargs)
    _OPEN_BARS.append(bar)
    return bar


def _advance(bar: Any, done: int, total: int) -> None:
    """Move a bar to `done` of `total`; tqdm redraws it only as often as its mininterval allows."""
    bar.total = total
    bar.update(done - bar.n)


class Bar:
    """A tqdm bar driven by core's progress(done, total) callbacks, counting `unit`s."""

    def __init__(self, desc: str, unit: str) -> None:
        self.bar = open_bar(desc=desc, unit=unit)

    def __call__(self, done: int, total: int) -> None:
        _advance(self.bar, done, total)

    def close(self) -> None:
        if self.bar in _OPEN_BARS:
            _OPEN_BARS.remove(self.bar)
        _close(self.bar)


class StageBars:
    """One tqdm bar per stage, driven by core's progress(stage, done, total) callbacks, counting `unit`s."""

    def __init__(self, unit: str = "problem", prefix: str = "") -> None:
        self.stage: str | None = None
        self.bar: Any = None
        self.unit, self.prefix = unit, prefix

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage != self.stage:
            self.close()
            self.stage, self.bar = stage, open_bar(desc=self.prefix + stage, total=total, unit=self.unit)
        _advance(self.bar, done, total)

    def close(self) -> None:
        if self.bar is not None:
            close_bars()
            self.bar = None


class _TqdmLogHandler(logging.Handler):
    """Log records printed above the progress bars (tqdm.write), never onto a bar's line."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(terminal_text(self.format(record)), file=sys.stderr)
        except Exception:  # noqa: BLE001  logging must never fail the command
            self.handleError(record)


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

