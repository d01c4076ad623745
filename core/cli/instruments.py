"""forkpoint effects | lens | tokens: the research instruments (core/instruments/) on stored or new traces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from core.cli.common import (
    echo,
    Bar,
    close_executor,
    fail_cleanly,
    free_output,
    given_traces,
    main,
    make_executor,
    open_store,
    overwrite_option,
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
from core.errors import InvalidInputError
from core.scoring.registry import DEFAULT_SCORE
from core.views.presentation import quoted_tokens

SHOW_ROWS = 15  # rows printed by default


def _positions(value: str) -> str | list[int]:
    if value == "spikes":
        return value
    try:
        return [int(p) for p in value.split(",") if p.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither 'spikes' nor a comma-separated list of token positions",
                                 param_hint="--positions") from None


@main.command()
@pair_options
@store_option
@click.option("--problems", "problems_path", type=click.Path(exists=True, dir_okay=False),
              help="JSONL/CSV problem set (default: the demo test set); each problem's trace is generated (or "
                   "read back from the store) with --policy.")
@click.option("--limit", type=click.IntRange(1), help="Use the first N problems.")
@click.option("--key", "keys", multiple=True, help="Measure this stored trace instead (repeatable).")
@click.option("--positions", default="spikes", show_default=True,
              help="'spikes' (each trace's top tokens by --score) or comma-separated token positions.")
@setting_option("effect_samples", dest="samples", flag="--samples")
@sample_temperature_option()
@click.option("--out", default="effects.csv", show_default=True, type=click.Path(dir_okay=False), help="CSV to write.")
@overwrite_option(note=" (stored continuations are reused, not decoded again)")
@policy_options
@settings_options("calibration_problems", "max_new_tokens", "temperature", "batch_size")  # --ratio: policy_options
@ray_option
@fail_cleanly
def effects(store_path: str | None, problems_path: str | None, limit: int | None, keys: tuple[str, ...], positions: str,
            samples: int, sample_temperature: float | None, out: str, overwrite: bool, policy_name: str, ratio: float,
            calibration_problems: int, max_new_tokens: int, temperature: float, seed: int, batch_size: int,
            ray_address: str | None, **opts: Any) -> None:
    """Causal effect of each takeover: accuracy with the reasoner vs the base writing a token, Wilson /
    Newcombe 95% intervals, one CSV row per (trace, position); continuations go to the store.

    Resumable (a re-run with --overwrite reads every stored continuation back) and cancellable (Ctrl-C
    writes the rows measured so far). With --ray, the positions of every trace are spread over Ray workers
    (one batch per position, the same rows as in-process)."""
    where = _positions(positions)
    path = free_output(out, overwrite)
    executor = make_executor(ray_address, opts)
    try:
        pair, store = pair_or_spec(opts, executor), open_store(store_path)
        max_new_tokens = pair_max_new_tokens(pair, max_new_tokens)
        score = opts.get("score") or DEFAULT_SCORE
        if keys:
            traces = given_traces(store, keys, "--key")
        else:
            traces = _effect_traces(pair, store, problems_path, limit, policy_name, opts, executor, ratio=ratio,
                                    calibration_problems=calibration_problems, max_new_tokens=max_new_tokens,
                                    temperature=temperature, seed=seed, batch_size=batch_size)
        frames, total = _measure(pair, store, traces, where, samples, path, executor, score=score, seed=seed,
                                 sample_temperature=sample_temperature, max_new_tokens=max_new_tokens)
    finally:
        close_executor(executor)
    import pandas as pd

    from core.instruments.effects import effect_correlation

    if not frames or not total:
        echo(f"no positions to measure in {len(traces)} trace(s)")
        return
    table = pd.concat(frames, ignore_index=True)
    cols = ["pos", "token", "base_token", "reason_token", "score", "acc_with", "acc_without", "effect", "ci_low", "ci_high"]
    shown = table.sort_values("effect", ascending=False, kind="stable")[cols].head(SHOW_ROWS)
    echo(quoted_tokens(shown, "token", "base_token", "reason_token")
         .to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    echo(f"{len(table)} positions of {len(traces)} traces -> {path} (Spearman ρ of effect and score: "
               f"{effect_correlation(table):.3f}; intervals: Wilson / Newcombe 95%)")


def _effect_traces(pair: Any, store: Any, problems_path: str | None, limit: int | None, policy_name: str,
                   opts: dict[str, Any], executor: Any, *, ratio: float, calibration_problems: int,
                   **sampling: Any) -> list[Any]:
    """The graded traces of the problems under the policy (generated, or read back from the store)."""
    from core.decoding import generate_many
    from core.decoding.calibration import build_policy
    from core.evaluation.grading import grade_trace
    from core.evaluation.harness import require_gold

    problems = read_problems(problems_path, limit)
    require_gold(problems)
    policy = build_policy(pair, policy_name, policy_kwargs(policy_name, {**opts, "seed": sampling["seed"]}),
                          calibrate_on=problems[:calibration_problems], ratio=ratio, store=store, executor=executor,
                          **sampling)
    bar = Bar(f"generate {policy.name}", unit="trace")
    traces = generate_many(pair, problems, policy, store=store, on_trace=grade_trace, progress=bar, executor=executor,
                           **sampling)
    bar.close()
    return traces


def _measure(pair: Any, store: Any, traces: list[Any], where: str | list[int], samples: int, path: Path, executor: Any,
             *, score: str, seed: int, sample_temperature: float | None, max_new_tokens: int) -> tuple[list[Any], int]:
    """(effects frames, positions asked): per trace in-process, or every position at once on the executor;
    the rows measured so far are written to `path` even when Ctrl-C stops it."""
    import pandas as pd

    from core.instruments.effects import (
        effect_positions,
        measure_effects,
        takeover_effects,
    )
    from core.io.csvsafe import write_csv

    todo = [effect_positions(t, where, score) for t in traces]
    total, done, frames = sum(map(len, todo)), 0, []
    bar = Bar("effects", unit="pos")
    options = {"temperature": sample_temperature, "seed": seed, "score": score, "store": store,
               "max_new_tokens": max_new_tokens}
    try:
        if executor is not None:  # every batch in flight at once; a stop keeps the finished ones stored
            frames.append(measure_effects(pair, traces, where, samples, progress=bar, executor=executor, **options))
            done = total
        else:
            for trace, these in zip(traces, todo):
                frames.append(takeover_effects(pair, trace, these, samples,
                                               progress=lambda d, _t, _done=done: bar(_done + d, total), **options))
                done += len(these)
    except KeyboardInterrupt:
        echo(f"\nstopped after {done} of {total} positions; the rows so far are in {path}, and a re-run "
                   "with --overwrite reuses every stored continuation", err=True)
        raise SystemExit(130) from None
    finally:
        bar.close()
        if frames:
            write_csv(pd.concat(frames, ignore_index=True), path, what="effects table")
    return frames, total


@main.command()
@pair_options
@store_option
@click.argument("key")
@click.option("--pos", required=True, type=click.IntRange(0), help="Response token position.")
@click.option("--around", "window", default=0, show_default=True, type=click.IntRange(0),
              help="Also the tokens pos ± this many (core.lens's window).")
@click.option("--top", "k", default=3, show_default=True, type=click.IntRange(1), help="Top tokens per layer.")
@click.option("--csv", "as_csv", is_flag=True, help="Print the full table as CSV.")
@fail_cleanly
def lens(store_path: str | None, key: str, pos: int, window: int, k: int, as_csv: bool, **opts: Any) -> None:
    """The logit lens of a stored trace at token POS: each layer of each model read through its final norm and head."""
    from core.instruments.lens import lens as run_lens

    store = open_store(store_path)
    trace = given_traces(store, (key,), "KEY")[0]
    frame = run_lens(pair_from_options(opts), trace, pos, window=window, k=k)
    if as_csv:
        echo(frame.to_csv(index=False))
        return
    frame = frame.assign(top=[" | ".join(f"{t!r} {p:.2f}" for t, p in zip(ts, ps))
                              for ts, ps in zip(frame["top_tokens"], frame["top_probs"])])
    cols = ["side", "pos", "layer", "p_emitted", "rank_emitted", "p_other", "rank_other", "kl_to_final", "top"]
    echo(f"token {trace.tokens[pos]!r} at {pos}; other = the other model's top choice")
    echo(frame[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))


@main.command()
@pair_options
@store_option
@click.argument("key")
@setting_option("effect_samples", dest="samples", flag="--samples")
@sample_temperature_option()
@click.option("--csv", "as_csv", is_flag=True, help="Print the whole curve as CSV.")
@fail_cleanly
def curve(store_path: str | None, key: str, samples: int, sample_temperature: float | None, as_csv: bool,
          **opts: Any) -> None:
    """The success curve of a stored trace: P(correct | its first t tokens) from base continuations at the
    positions Pivotal Token Search visits; its jumps are the pivotal tokens (continuations are stored)."""
    from core.instruments.success_curve import success_curve

    store = open_store(store_path)
    trace = given_traces(store, (key,), "KEY")[0]
    bar = Bar("curve", unit="t")
    try:
        frame = success_curve(pair_from_options(opts), trace, samples, temperature=sample_temperature, store=store,
                              progress=bar)
    finally:
        bar.close()
    if as_csv:
        echo(frame.to_csv(index=False))
        return
    echo(frame.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    pivots = frame[frame["pivotal"]] if "pivotal" in frame else frame.iloc[0:0]
    echo(f"{len(pivots)} pivotal token(s): " + ", ".join(f"#{r.pos} {r.token!r} ({r.jump:+.2f})"
                                                           for r in pivots.itertuples()) if len(pivots) else
               "no pivotal token (no jump of the curve reaches the threshold)")


@main.command()
@store_option
@click.option("--by", type=click.Choice(["token", "tag"]), default="token", show_default=True,
              help="Group by token string or by planning category.")
@setting_option("score", dest="score_name", help="Score of mean_score and max_score, and whose top tokens are the "
                "spikes of spike_rate (a trace's own spikes when it has them).")
@click.option("--sort", "sort_by", type=click.Choice(["count", "mean_score", "max_score", "spike_rate", "takeover_rate",
                                                       "mean_effect"]), default="count", show_default=True,
              help="Column the rows are ordered by, highest first (mean_effect: with --effects).")
@click.option("--top", default=SHOW_ROWS, show_default=True, type=click.IntRange(1), help="Rows to print.")
@click.option("--effects", "effects_path", type=click.Path(exists=True, dir_okay=False),
              help="A `forkpoint effects` CSV: adds the mean measured effect per row.")
@click.option("--with-branches", is_flag=True, help="Count branches and effect continuations too.")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the whole table as CSV.")
@overwrite_option()
@fail_cleanly
def tokens(store_path: str | None, by: str, score_name: str, sort_by: str, top: int, effects_path: str | None,
           with_branches: bool, out: str | None, overwrite: bool) -> None:
    """Dataset token statistics over the store: count, scores, spike and takeover rates, measured effects."""
    from core.cli.store import existing_store, warn_unreadable
    from core.instruments.token_stats import read_effects, token_stats
    from core.io.csvsafe import write_csv

    path = free_output(out, overwrite) if out else None
    store = existing_store(store_path)
    traces, bad = store.load_all()
    warn_unreadable(bad)
    if not with_branches:
        traces = [t for t in traces if t.meta.get("kind") != "branch"]
    try:
        effects = read_effects(effects_path) if effects_path else None
    except InvalidInputError as err:
        raise click.BadParameter(str(err), param_hint="--effects") from None
    table = token_stats(traces, score=score_name, by=by, effects=effects)
    table = table.sort_values(sort_by, ascending=False, kind="stable", na_position="last")
    if path is not None:
        write_csv(table, path, what="token table")
    shown = quoted_tokens(table.head(top), "token") if by == "token" else table.head(top)
    echo(shown.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    echo(f"{len(table)} {by}s over {len(traces)} traces" + (f" -> {path}" if path else ""))


@main.group()
def router() -> None:
    """A learned gate over the base's own state: train one on stored traces, show its card."""


@router.command("train")
@pair_options
@store_option
@click.option("--target", type=click.Choice(["gate", "effect"]), default="gate", show_default=True,
              help="gate: where the paper's calibrated gate fires on the traces; effect: where a measured takeover "
                   "helped (`forkpoint effects` results in the store).")
@click.option("--key", "keys", multiple=True, help="Train on these stored traces (default: the store's base "
              "rollouts of this pair).")
@click.option("--limit", type=click.IntRange(2), default=256, show_default=True, help="Most stored rollouts read.")
@click.option("--hidden", type=click.IntRange(0), default=0, show_default=True,
              help="Width of the one hidden layer (0 = logistic regression).")
@click.option("--epochs", type=click.IntRange(1), default=300, show_default=True, help="Full-batch Adam steps.")
@click.option("--out", required=True, help="Folder to write router.safetensors and card.json into.")
@overwrite_option("the router folder --out")
@settings_options("ratio", "window", "score")
@setting_option("seed", help="Seed of the held-out split of the traces and of the router's initial weights.")
@fail_cleanly
def router_train(store_path: str | None, target: str, keys: tuple[str, ...], limit: int, hidden: int, epochs: int,
                 out: str, overwrite: bool, ratio: float, window: int, score: str, seed: int, **opts: Any) -> None:
    """Train a router (core.train_router) for this pair and save it with its card."""
    from core.decoding.calibration import base_rollouts
    from core.instruments.router_training import train_router

    path = free_output(out, overwrite)
    pair = pair_from_options(opts)
    store = open_store(store_path)
    traces = given_traces(store, keys, "--key") if keys else base_rollouts(pair, store, limit=limit)
    if len(traces) < 2:
        raise click.ClickException(f"{store.path} holds {len(traces)} base rollout(s) of this pair; generate some "
                                   "first (forkpoint generate --policy base_only) or pass --key")
    made = train_router(pair, traces, target, out=path, store=store, ratio=ratio, window=window, score=score,
                        hidden=hidden, epochs=epochs, seed=seed)
    echo(_card_text(made.card))
    echo(f"router written to {path}")


@router.command("show")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@fail_cleanly
def router_show(path: str) -> None:
    """Print a router's card: pair, features, target, training traces, held-out AUROC, cut per ρ."""
    from core.decoding.router import read_card

    echo(_card_text(read_card(path)))


def _card_text(card: dict[str, Any]) -> str:
    auroc = card.get("held_out_auroc")
    lines = [f"target        {card.get('target')} {card.get('target_params') or ''}",
             f"pair          {card.get('pair')} (base {(card.get('pair_models') or {}).get('base')}, "
             f"reasoner {(card.get('pair_models') or {}).get('reason')})",
             f"features      {', '.join(card.get('features', []))} ({card.get('n_features')} values; "
             f"{'logistic regression' if not card.get('hidden') else str(card.get('hidden')) + ' hidden units'})",
             f"traces        {len(card.get('training_keys', []))} training, {len(card.get('held_out_keys', []))} held "
             f"out (fingerprint {card.get('training_fingerprint')})",
             f"held-out AUROC {'–' if auroc is None else f'{auroc:.3f}'}",
             "cut per ρ     " + ", ".join(f"ρ={r}: {c:.4g}" for r, c in (card.get("thresholds") or {}).items())]
    return "\n".join(lines)
