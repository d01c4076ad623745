"""forkpoint score | generate | calibrate: traces from a model pair."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from core.cli.common import (
    calibration_option,
    calibration_split,
    checked_text,
    echo,
    Bar,
    check_output,
    close_executor,
    fail_cleanly,
    given_traces,
    main,
    make_executor,
    open_store,
    pair_from_options,
    pair_max_new_tokens,
    pair_options,
    pair_or_spec,
    policy_kwargs,
    policy_options,
    ray_option,
    read_problems,
    sample_temperature_option,
    setting_option,
    settings_options,
    store_option,
)
from core.errors import ForkpointError, InvalidInputError
from core.scoring.registry import GATE_SCORES, score_values
from core.settings import check_text
from core.views.presentation import quoted_tokens

TOP_ROWS = 10  # rows `forkpoint score` prints by default


@main.command()
@pair_options
@store_option
@click.option("--prompt", required=True, callback=checked_text, help="The problem text.")
@click.option("--response", required=True, callback=checked_text, help="The response text to score (or @file to read it).")
@click.option("--top", default=TOP_ROWS, show_default=True, type=click.IntRange(1), help="Rows to print, highest score first.")
@setting_option("score", dest="score_name")
@fail_cleanly
def score(prompt: str, response: str, top: int, score_name: str, store_path: str | None, **opts: Any) -> None:
    """Score a response under both models and print the most disagreeing tokens."""
    from core.scoring.teacher_forced import score as run_score

    if not prompt.strip():  # as generate --prompt: an empty problem scores nothing anyone asked
        raise click.BadParameter("is empty: give the problem text", param_hint="--prompt")
    if response.startswith("@"):
        source = response[1:]
        try:
            response = Path(source).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise click.BadParameter(f"cannot read {response[1:]!r}: {err.strerror if isinstance(err, OSError) else err}",
                                     param_hint="--response") from err
        try:
            check_text(response, f"the file {source!r}")
        except ForkpointError as err:
            raise click.BadParameter(str(err), param_hint="--response") from None
    if not response:
        raise click.BadParameter("is empty: give the response text to score (or @file)", param_hint="--response")
    if store_path:
        check_output(store_path, "--store", folder=True)
    pair = pair_from_options(opts)
    trace = run_score(pair, prompt, response, store=open_store(store_path) if store_path else None)
    frame = trace.frame().assign(_score=score_values(trace.metrics, score_name))  # sign applied (delta_logp)
    cols = list(dict.fromkeys(["pos", "token", score_name, "entropy_base", "rank_base", "reason_top_rank_in_base"]))
    top_rows = frame.sort_values("_score", ascending=False, kind="stable")[cols].head(top)
    echo(quoted_tokens(top_rows, "token").to_string(index=False))
    echo(f"key {trace.key}  tokens {len(trace)}")


@main.command()
@pair_options
@store_option
@click.option("--problems", "problems_path", type=click.Path(exists=True, dir_okay=False),
              help="JSONL/CSV problem set (default: the demo test set).")
@click.option("--prompt", callback=checked_text, help="Generate for this single problem text instead of a set.")
@click.option("--limit", type=click.IntRange(1), help="Use the first N problems.")
@calibration_option("held out: the demo calibration set with the demo test set, else the first "
                    "--calibration-problems of --problems (at most a quarter), which are then not generated",
                    in_sample=True, aliases=["--calibrate-on"])  # --calibrate-on: its spelling before eval's
@policy_options
@settings_options("rho", "calibration_problems", "max_new_tokens", "temperature", "top_p", "samples",  # --ratio: policy_options
                  "batch_size")
@ray_option
@fail_cleanly
def generate(store_path: str | None, problems_path: str | None, prompt: str | None, limit: int | None,
             calibration: str | None, policy_name: str, ratio: float, rho: float | None, calibration_problems: int,
             max_new_tokens: int,
             temperature: float, top_p: float, seed: int, samples: int, batch_size: int, ray_address: str | None,
             **opts: Any) -> None:
    """Generate traces with a takeover policy into the store (options: see `core.list_policies()`)."""
    from core.decoding import generate_many
    from core.decoding.calibration import (
        build_policy,
        first_token_advice,
        first_token_takeover_share,
    )
    from core.decoding.policies import explicit_gate, policy_spec
    from core.evaluation.grading import grade_trace


    params = policy_kwargs(policy_name, {**opts, "seed": seed})
    try:
        explicit = explicit_gate(params)
    except InvalidInputError as err:
        raise click.UsageError(str(err)) from None
    if prompt is not None:
        if not prompt.strip():
            raise click.BadParameter("is empty: give the problem text (or leave --prompt out to use a problem set)",
                                     param_hint="--prompt")
        if problems_path or limit:
            raise click.UsageError("--prompt is one problem: it does not combine with --problems or --limit")
    check_output(open_store(store_path).path, "--store", folder=True)
    problems = [prompt] if prompt is not None else read_problems(problems_path, limit)
    executor = make_executor(ray_address, opts)
    pair = pair_or_spec(opts, executor)
    max_new_tokens = pair_max_new_tokens(pair, max_new_tokens)
    store = open_store(store_path)
    sampling = {"max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed, "batch_size": batch_size}
    calibration_set: list[Any] = []
    if rho is not None and policy_spec(policy_name).cls.knob is None:
        raise click.BadParameter(f"policy {policy_name} has no knob to calibrate", param_hint="--rho")
    calibrating = rho is not None or (policy_spec(policy_name).needs_gate and not explicit)
    if calibrating:
        calibration_set, problems = calibration_split(calibration, problems, problems_path, calibration_problems,
                                                      prompt=prompt, verb="generating on")
    problems, unfit = _runnable(pair, problems, max_new_tokens)
    for pid, why in unfit:  # reported and skipped; the run goes on and exits 1 at the end
        echo(f"problem {pid}: {why}; skipped", err=True)
    if not problems:
        raise click.ClickException(f"none of the {len(unfit)} problem(s) can run (see above); nothing generated")
    try:
        if calibrating:
            echo(f"calibrating the gate on base rollouts of {len(calibration_set)} problems ...", err=True)
        policy = build_policy(pair, policy_name, params, calibrate_on=calibration_set, ratio=ratio, store=store,
                              executor=executor, rho=rho, **sampling)
        bar = Bar(f"generate {policy.name}", unit="trace")
        traces = generate_many(pair, problems, policy, samples=samples, top_p=top_p, store=store,
                               on_trace=grade_trace, progress=bar, executor=executor, **sampling)
        bar.close()
    finally:
        close_executor(executor)
    notice = policy.diagnose(traces)
    if notice:
        echo(f"note: {notice}", err=True)
    if policy_spec(policy_name).needs_gate and first_token_takeover_share(traces) > 0.5:
        echo(f"note: most takeovers are at t = 0, a prompt-format artefact: {first_token_advice(pair)}", err=True)
    echo(f"{len(traces)} traces ({sum(t.n_takeovers for t in traces)} takeovers) in {store.path}")
    if unfit:
        echo(f"{len(unfit)} problem(s) skipped: {', '.join(pid for pid, _ in unfit)} (see above)", err=True)
        sys.exit(1)


def _runnable(pair: Any, problems: list[Any], max_new_tokens: int) -> tuple[list[Any], list[tuple[str, str]]]:
    """(problems that fit the pair's contexts, [(problem id, why)] for the others), before any forward; with a
    PairSpec (--ray: the workers hold the models) every problem is kept and a worker reports its own."""
    if not hasattr(pair, "check_context"):
        return problems, []
    ok, unfit = [], []
    for problem in problems:
        text = problem if isinstance(problem, str) else problem.prompt
        try:
            pair.check_context(pair.prompt_ids(text), max_new_tokens)
        except ForkpointError as err:
            unfit.append((str(getattr(problem, "id", "--prompt")), str(err)))
        else:
            ok.append(problem)
    return ok, unfit


@main.command()
@pair_options
@store_option
@click.option("--problems", "problems_path", type=click.Path(exists=True, dir_okay=False),
              help="JSONL/CSV problem set (default: the demo calibration set, held out from the demo test set "
                   "that `generate` and `eval` use).")
@setting_option("calibration_problems", dest="limit", help="Use the first N problems.")
@settings_options("ratio", "window")
@setting_option("score", dest="score_name", type=click.Choice(GATE_SCORES))
@settings_options("max_new_tokens", "temperature", "seed", "batch_size")
@ray_option
@fail_cleanly
def calibrate(store_path: str | None, problems_path: str | None, limit: int, ratio: float, window: int,
              score_name: str, max_new_tokens: int, temperature: float, seed: int, batch_size: int,
              ray_address: str | None, **opts: Any) -> None:
    """Fit the Guided gate (tau, lam) on base rollouts; prints it as JSON."""
    from core.decoding import calibrate as run_calibrate
    from core.demo.pair import demo_problems


    check_output(open_store(store_path).path, "--store", folder=True)
    problems = read_problems(problems_path, limit) if problems_path else demo_problems("calib", limit=limit)
    executor = make_executor(ray_address, opts)
    pair = pair_or_spec(opts, executor)
    max_new_tokens = pair_max_new_tokens(pair, max_new_tokens)
    bar = Bar("calibrate", unit="trace")
    try:
        gate = run_calibrate(pair, problems, ratio=ratio, window=window, score=score_name,
                             max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, batch_size=batch_size,
                             store=open_store(store_path), progress=bar, executor=executor)
    finally:
        bar.close()
        close_executor(executor)
    echo(json.dumps({"tau": gate.tau, "lam": gate.lam, "window": gate.window, "ratio": ratio,
                           "score": score_name}))


def parse_switches(text: str) -> dict[int, Any]:
    """`12=reason,40=base,7=1234,9="text"` -> core.takeover's `at` (a quoted string is typed as its tokens
    later, by the pair). Raises click.BadParameter naming --at, also for a position given twice."""
    out: dict[int, Any] = {}
    given: dict[int, str] = {}
    for part in [p for p in text.split(",") if p.strip()]:
        pos, sep, what = part.partition("=")
        pos, what = pos.strip(), what.strip()
        if not sep or not pos.isdigit() or not what:
            raise click.BadParameter(f"takes POS=WHO pairs (WHO: reason, base, a token id or a quoted string), "
                                     f"got {part.strip()!r}", param_hint="--at")
        if int(pos) in given:
            raise click.BadParameter(f"position {int(pos)} is given twice ({given[int(pos)]!r} and {part.strip()!r}); "
                                     "give each position one switch", param_hint="--at")
        given[int(pos)] = part.strip()
        if what in ("reason", "base"):
            out[int(pos)] = what
        elif what.isdigit():
            out[int(pos)] = int(what)
        elif len(what) >= 2 and what[0] == what[-1] and what[0] in "\"'":
            out[int(pos)] = what[1:-1]
        else:
            raise click.BadParameter(f"{what!r} at {pos}: give reason, base, a token id or a quoted string",
                                     param_hint="--at")
    if not out:
        raise click.BadParameter("give at least one POS=WHO switch, e.g. 12=reason,40=base", param_hint="--at")
    return out


@main.command()
@pair_options
@store_option
@click.argument("key")
@click.option("--at", "at_text", required=True, metavar="POS=WHO,...", callback=checked_text,
              help="Switches: 12=reason (the reasoner writes token 12), 40=base (a takeover switched off), "
                   "7=1234 (token id 1234), 9='text' (a typed string from token 9 on).")
@click.option("--then", "then", type=click.Choice(["policy", "base", "reason"]), default="policy", show_default=True,
              help="Who writes every other position after the first switch: the trace's policy, the base or the reasoner.")
@setting_option("max_new_tokens", default=None, help="Most response tokens (default: the parent's limit).")
@click.option("--samples", type=click.IntRange(min=1), default=None,
              help="A fan: N sampled children from the switches, decoded in one batch (default: one child).")
@sample_temperature_option(aliases=["--temperature"])  # --temperature: its spelling before curve's and effects'
@fail_cleanly
def takeover(store_path: str | None, key: str, at_text: str, then: str, max_new_tokens: int | None,
             samples: int | None, sample_temperature: float | None, **opts: Any) -> None:
    """Switch takeovers of the stored trace KEY on and off, or type text at a token (core.takeover); each new
    child is graded, then stored. A switch that changes no token makes no child."""
    from core.decoding.takeover import takeover as run_takeover
    from core.evaluation.grading import grade_trace, graded_put
    from core.views.presentation import switch_text

    at = parse_switches(at_text)
    store = open_store(store_path)
    parent = given_traces(store, (key,), "KEY")[0]
    check_output(store.path, "--store", folder=True)
    pair = pair_from_options(opts)
    made = run_takeover(pair, parent, at, then=then, samples=samples, temperature=sample_temperature,
                        max_new_tokens=max_new_tokens, store=store, on_trace=grade_trace)
    for child in made if isinstance(made, list) else [made]:
        if child.key == parent.key:
            echo(f"no change: the switches give the parent's tokens (key {parent.key})")
            continue
        child = graded_put(store, child)  # a child stored by an older run gains the grade it lacked
        answer = child.meta.get("answer")
        verdict = {True: "correct", False: "wrong"}.get(child.meta.get("correct"), "ungraded")
        forced = int(sum(str(s) == "forced" for s in child.source))
        echo(f"{switch_text(child, pair.token_text)}: {len(child)} tokens, {child.n_takeovers} takeovers"
                   f"{f', {forced} forced' if forced else ''}, answer {answer!r} ({verdict})")
        echo(f"key {child.key}  parent {parent.key}")
