"""Shared pieces of the command line: the `forkpoint` group, pair and store options, error translation.

Core exceptions become clean CLI errors at this edge (no tracebacks for user mistakes).
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

import click

from core.errors import ForkpointError

POLICY_CHOICES = ("base_only", "reason_only", "guided", "entropy_gated", "random_positions", "early_only")


def _fail_cleanly(fn):
    """Show ForkpointError messages as CLI errors, not tracebacks."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ForkpointError as err:
            raise click.ClickException(str(err)) from err

    return wrapper


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


def _store(path: str | None):
    from core.io.store import TraceStore, default_store_path

    return TraceStore(path or default_store_path())


def _problems(path: str | None, limit: int | None, opts: dict[str, Any] | None = None):
    if path is None:
        from core.demo.pair import demo_problems

        problems = demo_problems()
        return problems[:limit] if limit else problems
    from core.evaluation.problems import load_problems

    opts = opts or {}
    return load_problems(path, question_field=opts.get("question_field"), answer_field=opts.get("answer_field"),
                         limit=limit)


class _Bar:
    """A tqdm bar driven by core's progress(done, total) callbacks."""

    def __init__(self, desc: str) -> None:
        from tqdm import tqdm

        self.bar = tqdm(desc=desc, unit="tok", leave=False, file=sys.stderr)

    def __call__(self, done: int, total: int) -> None:
        self.bar.total = total
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def make_policy(name: str, budget: float, ratio_gate: Any = None, threshold: float = 1.0, seed: int = 0):
    """A policy object from CLI names (the same objects the app builds)."""
    from core.decoding import policies as p

    if name == "guided":
        if ratio_gate is None:
            raise click.UsageError("guided needs a gate: pass --tau/--lam or run `forkpoint calibrate` first")
        return p.Guided.from_gate(ratio_gate, budget=budget)
    builders = {
        "base_only": lambda: p.BaseOnly(),
        "reason_only": lambda: p.ReasonOnly(),
        "entropy_gated": lambda: p.EntropyGated(threshold=threshold, budget=budget),
        "random_positions": lambda: p.RandomPositions(rate=budget, seed=seed),
        "early_only": lambda: p.EarlyOnly(rate=budget),
    }
    return builders[name]()


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log what core does.")
def main(verbose: bool) -> None:
    """forkpoint: where a base and a reasoning model disagree, token by token."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not verbose:
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            hf_logging.set_verbosity_error()
        except ImportError:  # pragma: no cover
            pass

