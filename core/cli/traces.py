"""forkpoint score | generate | calibrate: traces from a model pair."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from core import settings
from core.cli.common import (
    _Bar,
    _close_executor,
    _executor,
    _fail_cleanly,
    _pair,
    _pair_or_spec,
    _problems,
    _store,
    main,
    pair_options,
    policy_kwargs,
    policy_options,
    ray_option,
    setting_option,
    settings_options,
    store_option,
)
from core.metrics import GATE_SCORES, score_values

TOP_ROWS = 10  # rows `forkpoint score` prints by default


@main.command()
@pair_options
@store_option
@click.option("--prompt", required=True, help="The problem text.")
@click.option("--response", required=True, help="The response text to score (or @file to read it).")
@click.option("--top", default=TOP_ROWS, show_default=True, type=click.IntRange(1), help="Rows to print, highest score first.")
@setting_option("score", dest="score_name")
@_fail_cleanly
def score(prompt: str, response: str, top: int, score_name: str, store_path: str | None, **opts: Any) -> None:
    """Score a response under both models and print the most disagreeing tokens."""
    from core.scoring import score as run_score

    if response.startswith("@"):
        try:
            response = Path(response[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise click.BadParameter(f"cannot read {response[1:]!r}: {err.strerror if isinstance(err, OSError) else err}",
                                     param_hint="--response") from err
    pair = _pair(opts)
    trace = run_score(pair, prompt, response, store=_store(store_path) if store_path else None)
    frame = trace.frame().assign(_score=score_values(trace.metrics, score_name))  # sign applied (delta_logp)
    cols = list(dict.fromkeys(["pos", "token", score_name, "entropy_base", "rank_base", "reason_top_rank_in_base"]))
    click.echo(frame.sort_values("_score", ascending=False, kind="stable")[cols].head(top).to_string(index=False))
    click.echo(f"key {trace.key}  tokens {len(trace)}")


@main.command()
@pair_options
@store_option
@click.option("--problems", "problems_path", type=click.Path(exists=True, dir_okay=False),
              help="JSONL/CSV problem set (default: the demo test set).")
@click.option("--prompt", help="Generate for this single problem text instead of a set.")
@click.option("--limit", type=click.IntRange(1), help="Use the first N problems.")
@click.option("--calibrate-on", "calibrate_on",
              help="Problems whose base rollouts calibrate a gate policy (file, hf:..., benchmark short name); "
                   "'in-sample' calibrates on the problems generated. Default: held out (the demo calibration set "
                   "with the demo test set, else the first --calibration-problems of --problems, at most a "
                   "quarter, which are then not generated).")
@policy_options
@settings_options("ratio", "calibration_problems", "max_new_tokens", "temperature", "top_p", "samples", "batch_size")
@ray_option
@_fail_cleanly
def generate(store_path: str | None, problems_path: str | None, prompt: str | None, limit: int | None,
             calibrate_on: str | None, policy_name: str, ratio: float, calibration_problems: int, max_new_tokens: int,
             temperature: float, top_p: float, seed: int, samples: int, batch_size: int, ray_address: str | None,
             **opts: Any) -> None:
    """Generate traces with a takeover policy into the store (options: see `core.list_policies()`)."""
    from core.decoding import generate_many
    from core.decoding.calibration import first_token_advice, first_token_takeover_share
    from core.decoding.policies import policy_spec
    from core.evaluation.grading import grade_trace

    params = policy_kwargs(policy_name, {**opts, "seed": seed})
    if "lam" in params and "tau" not in params:
        raise click.UsageError("--lam needs --tau (give both, or neither to calibrate the gate on the problems)")
    executor = _executor(ray_address)
    pair = _pair_or_spec(opts, executor)
    store = _store(store_path)
    problems = [prompt] if prompt else _problems(problems_path, limit)
    sampling = {"max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed, "batch_size": batch_size}
    calibration: list[Any] = []
    if policy_spec(policy_name).needs_gate and "tau" not in params:
        calibration, problems = _calibration_split(calibrate_on, problems, problems_path, prompt,
                                                   calibration_problems)
    try:
        policy = _build_policy(pair, store, calibration, policy_name, params, ratio=ratio,
                               sampling={**sampling, "executor": executor})
        bar = _Bar(f"generate {policy.name}")
        traces = generate_many(pair, problems, policy, samples=samples, top_p=top_p, store=store,
                               on_trace=grade_trace, progress=bar, executor=executor, **sampling)
        bar.close()
    finally:
        _close_executor(executor)
    notice = policy.diagnose(traces)
    if notice:
        click.echo(f"note: {notice}", err=True)
    if policy_spec(policy_name).needs_gate and first_token_takeover_share(traces) > 0.5:
        click.echo(f"note: most takeovers are at t = 0, a prompt-format artefact: {first_token_advice(pair)}", err=True)
    click.echo(f"{len(traces)} traces ({sum(t.n_takeovers for t in traces)} takeovers) in {store.path}")


def _calibration_split(calibrate_on: str | None, problems: list[Any], problems_path: str | None, prompt: str | None,
                       n: int) -> tuple[list[Any], list[Any]]:
    """(calibration problems, problems to generate) for a gate policy: held out unless --calibrate-on in-sample."""
    from core.evaluation.reproduce import split_calibration

    if calibrate_on == "in-sample":
        click.echo(f"calibrating IN-SAMPLE on {min(n, len(problems))} of the problems it then generates: the "
                   "gate sees its own evaluation problems (use --calibrate-on SOURCE, or leave it out to hold "
                   "problems out)", err=True)
        return problems[:n], problems
    if calibrate_on:
        from core.evaluation.sources import load_source

        return load_source(calibrate_on, limit=n), problems
    if prompt or problems_path is None:
        from core.demo.pair import demo_problems

        if prompt:
            click.echo("a single --prompt holds nothing out: calibrating on the demo calibration set (pass "
                       "--calibrate-on SOURCE for another pair's problems)", err=True)
        return demo_problems("calib", limit=n), problems
    calibration, rest = split_calibration({"problems": problems}, n)
    click.echo(f"holding out {len(calibration)} problems for calibration; generating on the other "
               f"{len(rest['problems'])}", err=True)
    return calibration, rest["problems"]


def _build_policy(pair: Any, store: Any, calibration: list[Any], name: str, params: dict[str, Any], *,
                  ratio: float, sampling: dict[str, Any]) -> Any:
    """make_policy from the CLI's values; a gate policy without --tau calibrates on `calibration`."""
    from core.decoding import calibrate as run_calibrate
    from core.decoding.policies import make_policy, policy_spec

    spec = policy_spec(name)
    if not spec.needs_gate:
        return make_policy(name, **params)
    gate_names = [p.name for p in spec.params if p.from_gate]
    if "tau" in params:
        return make_policy(name, **params)
    score = params.get("score", settings.SCORE)
    click.echo(f"calibrating the gate on base rollouts of {len(calibration)} problems ...", err=True)
    gate = run_calibrate(pair, calibration, ratio=ratio, window=params.get("window", settings.WINDOW), score=score,
                         store=store, **sampling)
    return make_policy(name, gate=gate, **{k: v for k, v in params.items() if k not in gate_names})


@main.command()
@pair_options
@store_option
@click.option("--problems", "problems_path", type=click.Path(exists=True, dir_okay=False),
              help="JSONL/CSV problem set (default: the demo test set).")
@setting_option("calibration_problems", dest="limit", help="Use the first N problems.")
@settings_options("ratio", "window")
@setting_option("score", dest="score_name", type=click.Choice(GATE_SCORES))
@settings_options("max_new_tokens", "temperature", "seed", "batch_size")
@ray_option
@_fail_cleanly
def calibrate(store_path: str | None, problems_path: str | None, limit: int, ratio: float, window: int,
              score_name: str, max_new_tokens: int, temperature: float, seed: int, batch_size: int,
              ray_address: str | None, **opts: Any) -> None:
    """Fit the Guided gate (tau, lam) on base rollouts; prints it as JSON."""
    from core.decoding import calibrate as run_calibrate

    executor = _executor(ray_address)
    pair = _pair_or_spec(opts, executor)
    problems = _problems(problems_path, limit)
    bar = _Bar("calibrate")
    try:
        gate = run_calibrate(pair, problems, ratio=ratio, window=window, score=score_name,
                             max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, batch_size=batch_size,
                             store=_store(store_path), progress=bar, executor=executor)
    finally:
        bar.close()
        _close_executor(executor)
    click.echo(json.dumps({"tau": gate.tau, "lam": gate.lam, "window": gate.window, "ratio": ratio,
                           "score": score_name}))
