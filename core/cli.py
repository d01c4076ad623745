"""`forkpoint ...`: the command line. Turns flags into core arguments, calls core, shows results.

Core exceptions become clean CLI errors at this edge (no tracebacks for user mistakes).
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from pathlib import Path
from typing import Any

import click

from core.divergence import DEFAULT_SCORE, SCORES
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
    from core.models import load_pair

    if not opts.get("base") and not opts.get("reason"):
        import torch

        from core.demo import demo_pair

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
    from core.store import TraceStore, default_store_path

    return TraceStore(path or default_store_path())


def _problems(path: str | None, limit: int | None, opts: dict[str, Any] | None = None):
    if path is None:
        from core.demo import demo_problems

        problems = demo_problems()
        return problems[:limit] if limit else problems
    from core.problems import load_problems

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
    from core import policies as p

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


@main.command()
@pair_options
@store_option
@click.option("--prompt", required=True, help="The problem text.")
@click.option("--response", required=True, help="The response text to score (or @file to read it).")
@click.option("--top", default=10, show_default=True, help="Rows to print, highest score first.")
@click.option("--score", "score_name", type=click.Choice(SCORES), default=DEFAULT_SCORE, show_default=True)
@_fail_cleanly
def score(prompt: str, response: str, top: int, score_name: str, store_path: str | None, **opts: Any) -> None:
    """Score a response under both models and print the most disagreeing tokens."""
    from core.scoring import score as run_score

    if response.startswith("@"):
        response = Path(response[1:]).read_text(encoding="utf-8")
    pair = _pair(opts)
    trace = run_score(pair, prompt, response, store=_store(store_path) if store_path else None)
    frame = trace.frame()
    cols = ["pos", "token", score_name, "entropy_base", "rank_base", "reason_top_rank_in_base"]
    click.echo(frame.sort_values(score_name, ascending=False)[cols].head(top).to_string(index=False))
    click.echo(f"key {trace.key}  tokens {len(trace)}")


@main.command()
@pair_options
@store_option
@click.option("--problems", "problems_path", type=click.Path(exists=True, dir_okay=False),
              help="JSONL/CSV problem set (default: the demo test set).")
@click.option("--prompt", help="Generate for this single problem text instead of a set.")
@click.option("--limit", type=int, help="Use the first N problems.")
@click.option("--policy", "policy_name", type=click.Choice(POLICY_CHOICES), default="base_only", show_default=True)
@click.option("--budget", default=0.1, show_default=True, help="Takeover budget / rate (fraction of tokens).")
@click.option("--tau", type=float, help="Guided gate threshold (else calibrated on the problems).")
@click.option("--lam", type=float, default=1.0, show_default=True, help="Guided gate relative threshold.")
@click.option("--window", default=16, show_default=True, help="Guided gate window W.")
@click.option("--threshold", default=1.0, show_default=True, help="EntropyGated threshold in nats.")
@click.option("--max-new-tokens", default=256, show_default=True)
@click.option("--temperature", default=0.0, show_default=True)
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--samples", default=1, show_default=True, help="Samples per problem (pass@k).")
@click.option("--batch-size", default=8, show_default=True)
@_fail_cleanly
def generate(store_path: str | None, problems_path: str | None, prompt: str | None, limit: int | None,
             policy_name: str, budget: float, tau: float | None, lam: float, window: int, threshold: float,
             max_new_tokens: int, temperature: float, top_p: float, seed: int, samples: int, batch_size: int,
             **opts: Any) -> None:
    """Generate traces with a takeover policy into the store."""
    from core.annotate import Gate
    from core.decoding import calibrate as run_calibrate
    from core.decoding import generate as run_generate

    pair = _pair(opts)
    store = _store(store_path)
    problems = [prompt] if prompt else _problems(problems_path, limit)
    gate = Gate(tau, lam, window) if tau is not None else None
    if policy_name == "guided" and gate is None:
        click.echo("calibrating the gate on base rollouts ...", err=True)
        gate = run_calibrate(pair, problems[:32], ratio=budget, window=window, max_new_tokens=max_new_tokens,
                             store=store)
    policy = make_policy(policy_name, budget, gate, threshold, seed)
    from tqdm import tqdm

    keys = []
    for start in tqdm(range(0, len(problems), batch_size), desc=f"generate {policy.name}", unit="batch", file=sys.stderr):
        traces = run_generate(pair, problems[start:start + batch_size], policy, max_new_tokens=max_new_tokens,
                              temperature=temperature, top_p=top_p, seed=seed, samples=samples, store=store)
        keys += [_graded_put(store, t) for t in traces]
    click.echo(f"{len(keys)} traces in {store.path}")


def _graded_put(store: Any, trace: Any) -> str:
    """Grade a trace against its problem's gold answer (when known) and store it."""
    from core.grading import extract_answer, grade

    gold = (trace.meta.get("problem") or {}).get("gold")
    if gold is not None and trace.meta.get("correct") is None:
        trace.meta["answer"] = extract_answer(trace.text)
        trace.meta["correct"] = grade(trace.text, gold)
        return store.put(trace, overwrite=True)
    return store.put(trace)


@main.command()
@pair_options
@store_option
@click.option("--problems", "problems_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--limit", type=int, default=64, show_default=True)
@click.option("--ratio", default=0.05, show_default=True, help="Target takeover ratio r.")
@click.option("--window", default=16, show_default=True)
@click.option("--score", "score_name", type=click.Choice(SCORES), default=DEFAULT_SCORE, show_default=True)
@click.option("--max-new-tokens", default=256, show_default=True)
@_fail_cleanly
def calibrate(store_path: str | None, problems_path: str | None, limit: int, ratio: float, window: int,
              score_name: str, max_new_tokens: int, **opts: Any) -> None:
    """Fit the Guided gate (tau, lam) on base rollouts; prints it as JSON."""
    from core.decoding import calibrate as run_calibrate

    pair = _pair(opts)
    problems = _problems(problems_path, limit)
    bar = _Bar("calibrate")
    gate = run_calibrate(pair, problems, ratio=ratio, window=window, score=score_name, max_new_tokens=max_new_tokens,
                         store=_store(store_path), progress=bar)
    bar.close()
    click.echo(json.dumps({"tau": gate.tau, "lam": gate.lam, "window": gate.window, "ratio": ratio,
                           "score": score_name}))


@main.command(name="ls")
@store_option
@click.option("--unreadable", is_flag=True, help="List files that could not be read, with the reason.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV instead of a table.")
@_fail_cleanly
def ls(store_path: str | None, unreadable: bool, as_csv: bool) -> None:
    """Summary table of the stored traces."""
    store = _store(store_path)
    if unreadable:
        for path, reason in store.unreadable():
            click.echo(f"{path}\t{reason}")
        return
    frame = store.summaries()
    click.echo(frame.to_csv(index=False) if as_csv else frame.to_string(index=False, max_colwidth=40))


@main.command()
@store_option
@click.argument("keys", nargs=-1)
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "parquet", "html"]), default="jsonl",
              show_default=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Output file.")
@click.option("--score", "score_name", type=click.Choice(SCORES), default=DEFAULT_SCORE, show_default=True,
              help="Heatmap metric (html).")
@click.option("--overwrite", is_flag=True)
@_fail_cleanly
def export(store_path: str | None, keys: tuple[str, ...], fmt: str, out: str, score_name: str, overwrite: bool) -> None:
    """Export traces (all, or the given keys) as JSONL, CSV, Parquet or self-contained HTML."""
    from tqdm import tqdm

    from core.export import export as run_export

    store = _store(store_path)
    keys = keys or tuple(store.keys())
    traces = [store.get(k) for k in tqdm(keys, desc="read", file=sys.stderr, leave=False)]
    kwargs = {"score": score_name} if fmt == "html" else {}
    run_export(traces, out, fmt, overwrite=overwrite, **kwargs)
    click.echo(f"{len(traces)} traces -> {out}")


@main.command(name="import")
@pair_options
@store_option
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@_fail_cleanly
def import_(path: str, store_path: str | None, **opts: Any) -> None:
    """Score a JSONL of {id, prompt, response[, answer]} made elsewhere into the store."""
    from core.export import import_jsonl

    pair = _pair(opts)
    bar = _Bar("import")
    report = import_jsonl(pair, path, _store(store_path), progress=bar)
    bar.close()
    click.echo(json.dumps(report.to_dict(), default=str))


@main.command()
@store_option
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--score", "score_name", type=click.Choice(SCORES), default=DEFAULT_SCORE, show_default=True)
@_fail_cleanly
def analyze(store_path: str | None, out: str, score_name: str) -> None:
    """Write a self-contained HTML report with every analysis, and the tables as CSV."""
    from core.analysis_report import report_html, report_tables

    store = _store(store_path)
    traces = [store.get(k) for k in store.keys()]
    if not traces:
        raise click.ClickException(f"The store {store.path} has no traces; generate some first")
    Path(out).mkdir(parents=True, exist_ok=True)
    report_html(traces, str(Path(out) / "report.html"), score=score_name)
    report_tables(traces, out, score=score_name)
    click.echo(f"report -> {Path(out) / 'report.html'}")


@main.command(name="eval")
@pair_options
@store_option
@click.option("--problems", "problems_path", type=click.Path(exists=True, dir_okay=False),
              help="JSONL/CSV problem set (default: the demo test set).")
@click.option("--calibration", "calibration_path", type=click.Path(exists=True, dir_okay=False),
              help="Problems whose base rollouts calibrate the gate (default: demo calibration set, "
                   "or the first quarter of --problems).")
@click.option("--limit", type=int, help="Use the first N problems.")
@click.option("--budgets", default="0.05", show_default=True,
              help="Comma-separated calibration ratios r, e.g. 0.01,0.02,0.05,0.1,0.2.")
@click.option("--window", default=16, show_default=True)
@click.option("--samples", default=1, show_default=True, help="Samples per problem (pass@k uses all).")
@click.option("--temperature", default=0.0, show_default=True)
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--max-new-tokens", default=256, show_default=True)
@click.option("--shard", help="i/n: run only the i-th of n deterministic shards (rerun without it to summarise).")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the table as CSV, plus .md and a recovery plot .html.")
@_fail_cleanly
def eval_(store_path: str | None, problems_path: str | None, calibration_path: str | None, limit: int | None,
          budgets: str, window: int, samples: int, temperature: float, top_p: float, max_new_tokens: int,
          shard: str | None, out: str | None, **opts: Any) -> None:
    """Accuracy, pass@k, realised rate and recovery: base, reasoner, Guided at each budget, and the
    random / early baselines at Guided's realised rate. Every trace is stored; reruns resume."""
    from core.evaluate import budget_sweep, shard_of, to_markdown

    pair = _pair(opts)
    problems = _problems(problems_path, limit)
    if calibration_path:
        calibration = _problems(calibration_path, None)
    elif problems_path is None:
        from core.demo import demo_problems

        calibration = demo_problems("calib")
    else:
        calibration, problems = problems[: max(1, len(problems) // 4)], problems[max(1, len(problems) // 4):]
    if shard:
        try:
            i, n = (int(x) for x in shard.split("/"))
        except ValueError as err:
            raise click.BadParameter(f"--shard must look like 0/4, got {shard!r}") from err
        problems = shard_of(problems, (i, n))
    ratios = [float(b) for b in budgets.split(",") if b.strip()]
    bar = _Bar("eval")
    table = budget_sweep(pair, problems, calibration, ratios, window=window, samples=samples,
                         store=_store(store_path), temperature=temperature, top_p=top_p,
                         max_new_tokens=max_new_tokens, progress=bar)
    bar.close()
    table = table.assign(policy=[p if r != r else f"{p} (r={r:g})" for p, r in zip(table["policy"], table["ratio"])])
    markdown = to_markdown(table, columns=["accuracy", "pass@k", "rho", "mean_tokens", "recovery", "recovery@k"])
    click.echo(markdown)
    if out:
        from core.analysis_report import recovery_figure

        table.to_csv(out, index=False)
        Path(out).with_suffix(".md").write_text(markdown + "\n", encoding="utf-8")
        curve = table.dropna(subset=["ratio"]).assign(policy=lambda f: f["policy"].str.replace(r" \(r=.*\)", "", regex=True))
        recovery_figure(curve).write_html(Path(out).with_suffix(".html"), include_plotlyjs=True)


@main.group()
def demo() -> None:
    """The bundled demo model pair."""


@demo.command(name="train")
@click.option("--out", type=click.Path(file_okay=False), help="Output directory (default: assets/demo).")
@click.option("--size", type=click.Choice(["full", "tiny"]), default="full", show_default=True)
@click.option("--seed", default=0, show_default=True)
@_fail_cleanly
def demo_train(out: str | None, size: str, seed: int) -> None:
    """Train the demo base / reasoning pair on the synthetic task (CPU, minutes)."""
    from core.demo import DEMO_DIR
    from core.demo_train import train_demo_pair

    train_demo_pair(out or DEMO_DIR, size=size, seed=seed, progress=True)


@main.command()
@click.option("--port", default=8501, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True, help="Bind address (localhost by default).")
@click.argument("app_args", nargs=-1, type=click.UNPROCESSED)
def app(port: int, address: str, app_args: tuple[str, ...]) -> None:
    """Start the Streamlit app (demo pair unless --base/--reason follow after --)."""
    import subprocess

    main_py = Path(__file__).resolve().parent.parent / "app" / "main.py"
    cmd = [sys.executable, "-m", "streamlit", "run", str(main_py), "--server.address", address,
           "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
           "--", *app_args]
    raise SystemExit(subprocess.call(cmd))


if __name__ == "__main__":  # pragma: no cover
    main()
