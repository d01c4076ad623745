"""forkpoint score | generate | calibrate: traces from a model pair."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from core.cli.common import POLICY_CHOICES, _Bar, _fail_cleanly, _pair, _problems, _store, main, make_policy, pair_options, store_option
from core.metrics import DEFAULT_SCORE, SCORES


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
    from core.spike_rules import Gate
    from core.decoding.engine import calibrate as run_calibrate
    from core.decoding.engine import generate as run_generate

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
    from core.evaluation.grading import extract_answer, grade

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
    from core.decoding.engine import calibrate as run_calibrate

    pair = _pair(opts)
    problems = _problems(problems_path, limit)
    bar = _Bar("calibrate")
    gate = run_calibrate(pair, problems, ratio=ratio, window=window, score=score_name, max_new_tokens=max_new_tokens,
                         store=_store(store_path), progress=bar)
    bar.close()
    click.echo(json.dumps({"tau": gate.tau, "lam": gate.lam, "window": gate.window, "ratio": ratio,
                           "score": score_name}))


