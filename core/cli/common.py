"""Shared pieces of the command line: the `forkpoint` group, pair and store options, error translation.

Core exceptions become clean CLI errors at this edge (no tracebacks for user mistakes).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from typing import Any

import click

from core import settings
from core.decoding.policies import Param, list_policies
from core.errors import ForkpointError


def _fail_cleanly(fn):
    """Show ForkpointError messages as CLI errors, not tracebacks, naming CLI flags for Python arguments."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ForkpointError as err:
            raise click.ClickException(cli_words(str(err))) from err

    return wrapper


def cli_words(message: str) -> str:
    """A core message as the CLI user reads it: argument names with an underscore become their flags
    (max_new_tokens -> --max-new-tokens); one-word names (score, rate) are plain words and stay."""
    names = sorted({n for n in (*settings.SETTINGS, *policy_params()) if "_" in n}, key=len, reverse=True)
    pattern = r"(?<![\w.-])(" + "|".join(map(re.escape, names)) + r")\b"
    message = re.sub(pattern, lambda m: "--" + m.group(1).replace("_", "-"), message)
    return re.sub(r"(?<![\w.-])(format|score|store)=(?![\w'\"])", r"--\1", message)  # "give format=" -> "give --format"


def pair_options(fn):
    """--base/--reason/... : the model pair (the bundled demo pair when neither is given)."""
    options = [
        click.option("--base", help="Base model: hub id, local directory or .gguf file (default: demo pair)."),
        click.option("--reason", help="Reasoning model: hub id, local directory or .gguf file."),
        click.option("--base-format", help="Base prompt format: a template with {problem}, or chat[:think|:nothink]."),
        click.option("--reason-format", help="Reasoning prompt format (default: chat template if any)."),
        click.option("--base-revision", help="Pin the base model to a hub revision."),
        click.option("--reason-revision", help="Pin the reasoning model to a hub revision."),
        click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N."),
        click.option("--dtype", default="auto", show_default=True, help="auto, float32, bfloat16 or float16."),
        click.option("--trust-remote-code", is_flag=True, help="Run model code from the hub (only if you trust it)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def store_option(fn):
    return click.option("--store", "store_path", type=click.Path(file_okay=False),
                        help="Trace store directory (default: $FORKPOINT_STORE or ./forkpoint-store).")(fn)


def _pair(opts: dict[str, Any]):
    from core.pair.loading import load_pair

    if not opts.get("base") and not opts.get("reason"):
        import torch

        from core.demo.pair import demo_pair

        torch.set_num_threads(1)  # the demo models are tiny: more threads only add overhead
        return demo_pair(device=opts.get("device", "auto"))
    if not (opts.get("base") and opts.get("reason")):
        raise click.UsageError("Give both --base and --reason (or neither, for the demo pair).")
    return load_pair(
        opts["base"], opts["reason"], device=opts["device"], dtype=opts["dtype"],
        base_format=opts.get("base_format"), reason_format=opts.get("reason_format"),
        base_revision=opts.get("base_revision"), reason_revision=opts.get("reason_revision"),
        trust_remote_code=opts.get("trust_remote_code", False),
    )


def ray_option(fn):
    """--ray [ADDRESS]: run on Ray workers (docs/SCALE.md)."""
    return click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
                        help="Run on Ray workers: alone for a local Ray, or auto / ray://host:port to join a "
                             "cluster (needs the ray extra; see docs/SCALE.md).")(fn)


def _executor(ray_address: str | None):
    """A RayExecutor for --ray (progress shows in the command's own bar), or None: in-process."""
    if ray_address is None:
        return None
    from core.scale import RayExecutor

    return RayExecutor(address=None if ray_address == "local" else ray_address, progress_bar=False)


def _pair_or_spec(opts: dict[str, Any], executor: Any):
    """With an executor, the pair as a PairSpec (only the workers load it); else the loaded pair."""
    if executor is None:
        return _pair(opts)
    from core.scale import PairSpec

    if not opts.get("base") and not opts.get("reason"):
        return PairSpec.demo()
    if not (opts.get("base") and opts.get("reason")):
        raise click.UsageError("Give both --base and --reason (or neither, for the demo pair).")
    return PairSpec(opts["base"], opts["reason"], base_format=opts.get("base_format"),
                    reason_format=opts.get("reason_format"), base_revision=opts.get("base_revision"),
                    reason_revision=opts.get("reason_revision"), dtype=opts.get("dtype", "auto"),
                    trust_remote_code=opts.get("trust_remote_code", False))


def _close_executor(executor: Any) -> None:
    """Print the Ray workers' throughput (stderr) and stop them."""
    if executor is None:
        return
    summary = executor.summary()
    if not summary.empty:
        click.echo("per-worker throughput:\n" + summary.to_string(index=False), err=True)
    executor.close()


def _store(path: str | None):
    from core.io.store import TraceStore, default_store_path

    return TraceStore(path or default_store_path())


def _problems(path: str | None, limit: int | None):
    if path is None:
        from core.demo.pair import demo_problems

        problems = demo_problems()
        return problems[:limit] if limit else problems
    from core.evaluation.problems import load_problems

    return load_problems(path, limit=limit)


class _Bar:
    """A tqdm bar driven by core's progress(done, total) callbacks, counting `unit`s (tokens by default)."""

    def __init__(self, desc: str, unit: str = "tok") -> None:
        from tqdm import tqdm

        self.bar = tqdm(desc=desc, unit=unit, leave=False, file=sys.stderr)

    def __call__(self, done: int, total: int) -> None:
        self.bar.total = total
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def _range_type(kind: type, low: float | None, high: float | None, choices: tuple[str, ...] = ()) -> Any:
    """A click type that checks the range at the edge, so a bad value is reported against its flag."""
    if choices:
        return click.Choice(choices)
    if low is None and high is None:
        return kind
    if kind is int:
        return click.IntRange(None if low is None else int(low), None if high is None else int(high))
    if kind is float:
        return click.FloatRange(low, high)
    return kind


def setting_option(name: str, param: Param | None = None, *, dest: str | None = None, **overrides: Any):
    """--name from `core.settings.SETTINGS[name]`: default, help and range from the one table of defaults.

    `param` (a policy parameter of the same name) supplies the type and choices when it is stricter.
    """
    row = settings.SETTINGS[name]
    kind = type(row.value)
    low, high, choices = row.low, row.high, ()
    if param is not None:
        kind, choices = param.kind, param.choices
        low = param.low if param.low is not None else low
        high = param.high if param.high is not None else high
    if kind is str and not choices and name == "score":
        from core.scoring.registry import SCORES

        choices = SCORES
    kwargs = {"type": _range_type(kind, low, high, choices), "default": row.value, "show_default": True, "help": row.help}
    kwargs.update(overrides)
    return click.option(row.flag, dest or name, **kwargs)


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
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not verbose:  # read when transformers loads: file-only commands (ls, export) never import it
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        if "transformers" in sys.modules:  # already loaded (a test runner, a notebook): tell it directly
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            hf_logging.set_verbosity_error()

