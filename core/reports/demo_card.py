"""Measure the demo model organism against its required properties and render assets/demo/CARD.md.

One function runs everything (greedy and sampled accuracy of both models, Guided at a calibrated
budget, RandomPositions and EarlyOnly at the realised rate Guided reached, and the sparsity, position
and planning-enrichment analyses of the base rollouts); another turns the result into the card.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from core import settings
from core.analysis.tables import enrichment, gini, gini_table, position_density
from core.decoding import calibrate
from core.decoding.policies import (
    BaseOnly,
    ReasonOnly,
    make_policy,
)
from core.demo import pair as demo
from core.errors import InvalidInputError
from core.evaluation import harness as ev
from core.evaluation.sweep import matched_baselines
from core.io.atomic import write_atomic
from core.packaged import is_installed
from core.settings import Progress

log = logging.getLogger(__name__)

EOS_TEXT = "<|endoftext|>"

# name -> (description, comparison, threshold)
BARS: dict[str, tuple[str, str, float]] = {
    "base_acc_greedy": ("base accuracy, greedy", "<=", 0.60),
    "base_acc_sampled": ("base accuracy, sampled", "<=", 0.60),
    "reason_acc_greedy": ("reasoning accuracy, greedy", ">=", 0.90),
    "reason_acc_sampled": ("reasoning accuracy, sampled", ">=", 0.90),
    "guided_rho_greedy": ("Guided realised ρ, greedy", "<=", 0.10),
    "guided_rho_sampled": ("Guided realised ρ, sampled", "<=", 0.10),
    "guided_recovery_greedy": ("Guided recovery, greedy", ">=", 0.80),
    "guided_recovery_sampled": ("Guided recovery, sampled", ">=", 0.80),
    "random_recovery_greedy": ("RandomPositions recovery at Guided's ρ, greedy", "<=", 0.40),
    "random_recovery_sampled": ("RandomPositions recovery at Guided's ρ, sampled", "<=", 0.40),
    "early_recovery_greedy": ("EarlyOnly recovery at Guided's ρ, greedy", "<=", 0.40),
    "early_recovery_sampled": ("EarlyOnly recovery at Guided's ρ, sampled", "<=", 0.40),
    "gini_ce": ("Gini of cross-entropy (pooled, base greedy rollouts)", ">=", 0.80),
    "median_u_top1": ("median u of each response's top-1% cross-entropy tokens", "<=", 0.30),
    "plan_enrichment_taken": ("plan-category enrichment among Guided's taken-over tokens", ">=", 5.0),
}


def passes(name: str, value: float) -> bool:
    """Whether a measured value meets its bar in `BARS`."""
    _, op, threshold = BARS[name]
    return bool(value <= threshold) if op == "<=" else bool(value >= threshold)


def _one_setting(pair: Any, problems: Sequence[Any], gate: Any, *, budget: float, temperature: float, top_p: float,
                 samples: int, seed: int, max_new_tokens: int, store: Any, batch_size: int,
                 progress: Progress | None) -> tuple[Any, dict[str, list[Any]]]:
    keep: dict[str, list[Any]] = {}
    common = dict(samples=samples, store=store, temperature=temperature, top_p=top_p, seed=seed,
                  max_new_tokens=max_new_tokens, batch_size=batch_size, keep=keep, progress=progress)
    with ev.stream_records(pair, problems, {"base": BaseOnly(), "reason": ReasonOnly(),
                                            "guided": make_policy("guided", gate=gate, budget=budget)},
                           **common) as records:
        summary = ev.policy_table(records).set_index("policy")
        rho, mean_tokens = float(summary.loc["guided", "rho"]), float(summary.loc["base", "mean_tokens"])
        # the baselines at the realised rate Guided reached (EarlyOnly's rate is a share of max_new_tokens)
        # and at the bar's ceiling ρ = budget, where a blind baseline has its best chance
        baselines = {**matched_baselines(rho, mean_tokens, max_new_tokens, seed),
                     **matched_baselines(budget, mean_tokens, max_new_tokens, seed, suffix=f"@{budget:g}")}
        ev.stream_records(pair, problems, baselines, into=records, **common)
        return ev.policy_table(records), keep


class _Counted:
    """A store wrapper (or stand-in for no store) that counts traces generated and traces reused."""

    def __init__(self, store: Any) -> None:
        self.store, self.generated, self.reused = store, 0, 0

    def __contains__(self, key: object) -> bool:
        return self.store is not None and key in self.store

    def get(self, key: str) -> Any:
        self.reused += 1
        return self.store.get(key)

    def put(self, trace: Any, overwrite: bool = False) -> Any:
        if not overwrite:  # a rewrite (a stored trace newly graded) is not a generation
            self.generated += 1
        return self.store.put(trace, overwrite=overwrite) if self.store is not None else None


# The card's protocol: the gate's defaults, the paper's sampling, and the demo_measure_* rows of core/settings.py.
_PAPER = settings.PRESETS["paper"]


def measure_demo(pair: Any, problems: Sequence[Any], calibration: Sequence[Any], *, ratio: float = settings.RATIO,
                 window: int = settings.WINDOW, budget: float = settings.SETTINGS["demo_measure_budget"].value,
                 temperature: float = _PAPER["temperature"], top_p: float = _PAPER["top_p"],
                 samples: int = settings.SETTINGS["demo_measure_samples"].value, seed: int = settings.SEED,
                 max_new_tokens: int = settings.SETTINGS["demo_measure_max_new_tokens"].value, store: Any = None,
                 batch_size: int = settings.SETTINGS["demo_measure_batch_size"].value,
                 progress: Progress | None = None) -> dict[str, Any]:
    """All measured properties of a pair on `problems`, with the gate calibrated on base rollouts of
    `calibration`: {"settings", "gate", "greedy", "sampled" (summary records), "values", "passed"}."""

    t0 = time.perf_counter()
    store = _Counted(store)
    gate = calibrate(pair, list(calibration), ratio=ratio, window=window, max_new_tokens=max_new_tokens,
                     batch_size=batch_size, store=store)
    opts = dict(budget=budget, seed=seed, max_new_tokens=max_new_tokens, store=store, batch_size=batch_size,
                progress=progress)
    greedy, kept = _one_setting(pair, problems, gate, temperature=0.0, top_p=1.0, samples=1, **opts)
    sampled, _ = _one_setting(pair, problems, gate, temperature=temperature, top_p=top_p, samples=samples, **opts)

    base_traces, guided_traces = kept["base"], kept["guided"]
    pooled_gini = float(gini_table(base_traces).iloc[-1]["gini"])
    per_trace_gini = float(np.nanmean([gini(t.metrics["cross_entropy"]) for t in base_traces]))
    density = position_density(base_traces, top=settings.SPIKE_TOP)
    ce = np.concatenate([t.metrics["cross_entropy"] for t in base_traces])
    u = np.concatenate([np.arange(len(t)) / len(t) for t in base_traces])
    pooled_top = ce >= np.quantile(ce, 0.99)
    enr = enrichment(guided_traces).set_index(["set", "category"])

    def plan(where: str, column: str) -> float:
        return float(enr.loc[(where, "plan"), column]) if (where, "plan") in enr.index else float("nan")

    values: dict[str, float] = {}
    extra: dict[str, Any] = {}
    for mode, frame in (("greedy", greedy), ("sampled", sampled)):
        f = frame.set_index("policy")
        values[f"base_acc_{mode}"] = float(f.loc["base", "accuracy"])
        values[f"reason_acc_{mode}"] = float(f.loc["reason", "accuracy"])
        values[f"guided_rho_{mode}"] = float(f.loc["guided", "rho"])
        values[f"guided_recovery_{mode}"] = float(f.loc["guided", "recovery"])
        values[f"random_recovery_{mode}"] = float(f.loc["random_positions", "recovery"])
        values[f"early_recovery_{mode}"] = float(f.loc["early_only", "recovery"])
        extra[f"random_recovery_at_{budget:g}_{mode}"] = float(f.loc[f"random_positions@{budget:g}", "recovery"])
        extra[f"early_recovery_at_{budget:g}_{mode}"] = float(f.loc[f"early_only@{budget:g}", "recovery"])
    values["gini_ce"] = pooled_gini
    values["median_u_top1"] = float(density.attrs["median_u"])
    values["plan_enrichment_taken"] = plan("taken_over", "enrichment")
    extra |= {
        "gini_ce_mean_per_response": per_trace_gini,
        "median_u_pooled_top1": float(np.median(u[pooled_top])),
        "plan_share_all_tokens": plan("all", "share"),
        "plan_share_taken_over": plan("taken_over", "share"),
        "plan_enrichment_top1_score": plan("top_score", "enrichment"),
        "taken_over_tokens": int(sum(t.n_takeovers for t in guided_traces)),
    }
    return {
        "example": _example(pair, base_traces, guided_traces),
        "settings": {"problems": len(problems), "calibration": len(calibration), "ratio": ratio, "window": window,
                     "budget": budget, "temperature": temperature, "top_p": top_p, "samples": samples,
                     "seed": seed, "max_new_tokens": max_new_tokens},
        "gate": gate.to_dict(),
        "greedy": greedy.to_dict("records"),
        "sampled": sampled.to_dict("records"),
        "values": values,
        "extra": extra,
        "passed": {name: passes(name, v) for name, v in values.items()},
        "seconds": round(time.perf_counter() - t0, 1),
        "traces": {"generated": store.generated, "reused": store.reused},
    }


def _example(pair: Any, base_traces: list[Any], guided_traces: list[Any]) -> dict[str, Any] | None:
    """The first problem the base gets wrong and Guided gets right (greedy), with its takeovers."""
    for b, g in zip(base_traces, guided_traces):
        if b.meta.get("correct") or not g.meta.get("correct"):
            continue
        taken = [int(i) for i in np.flatnonzero(g.takeovers)]

        def top(trace: Any, side: str, i: int) -> list[tuple[str, float]]:
            ids, probs = trace.topk[side]
            return [(pair.token_text(int(t)), round(float(p), 3)) for t, p in zip(ids[i][:3], probs[i][:3])]

        return {"prompt": g.meta["problem"]["prompt"], "gold": g.meta["problem"].get("gold"),
                "base": b.text, "guided": g.text, "length": len(g),
                "takeovers": [{"pos": i, "token": g.tokens[i], "cross_entropy": round(float(g.metrics["cross_entropy"][i]), 3),
                               "base_top3": top(g, "base", i), "reason_top3": top(g, "reason", i)} for i in taken]}
    return None


def render_card(result: dict[str, Any], command: str, train_log: dict[str, Any] | None = None) -> str:
    """The measured-properties part of CARD.md (markdown) from a `measure_demo` result."""
    import pandas as pd

    s = result["settings"]
    tr = result.get("traces", {})
    timing = f"{result['seconds']:.0f} s, {tr.get('generated', 0)} traces generated and {tr.get('reused', 0)} read back"
    if result.get("cold_seconds") and tr.get("reused"):
        timing += f" from a trace store; the run that generated them took {result['cold_seconds']:.0f} s"
    lines = [f"Measured with `{command}` ({timing}) on {s['problems']} held-out problems; gate "
             f"calibrated on base greedy rollouts of {s['calibration']} separate problems with ratio "
             f"r = {s['ratio']}, window W = {s['window']}, budget {s['budget']} "
             f"(τ = {result['gate']['tau']:.3f}, λ = {result['gate']['lam']:.2f}).", "",
             "| property | measured | bar | met |", "|---|---:|---:|:---:|"]
    for name, value in result["values"].items():
        desc, op, threshold = BARS[name]
        lines.append(f"| {desc} | {value:.3f} | {op} {threshold:g} | {'yes' if result['passed'][name] else 'NO'} |")
    ex = result.get("example")
    if ex:
        lines += ["", f"Example (greedy; gold answer {ex['gold']}). Question: {ex['prompt']}", "",
                  "    base alone: " + ex["base"].replace(EOS_TEXT, ""),
                  "    guided:     " + ex["guided"].replace(EOS_TEXT, ""), "",
                  "Guided took over " + "; ".join(
                      f"token {t['pos']} of {ex['length']} ({t['token']!r}, cross-entropy {t['cross_entropy']:.2f} nats; "
                      f"base top-3 {_pairs(t['base_top3'])}, reasoner top-3 {_pairs(t['reason_top3'])})"
                      for t in ex["takeovers"]) + "."]
    lines += ["", "Greedy (temperature 0), one sample per problem:", "",
              ev.to_markdown(pd.DataFrame(result["greedy"]), columns=["accuracy", "rho", "mean_tokens", "recovery"]),
              "", f"Sampled (temperature {s['temperature']}, top-p {s['top_p']}, {s['samples']} samples per problem; "
              f"accuracy is the mean over samples, pass@k uses the unbiased estimator with k = {s['samples']}):", "",
              ev.to_markdown(pd.DataFrame(result["sampled"]),
                             columns=["accuracy", "pass@k", "rho", "mean_tokens", "recovery", "recovery@k"]),
              "", "The recovery bars use accuracy (the mean over samples). The `@0.1` rows run the blind "
              "baselines at the bars' ceiling ρ = 0.1. Their pass@k recovery is larger than their accuracy "
              "recovery because k samples give a blind policy k chances to land on the one decision token.",
              "", "Other measurements: " + ", ".join(f"{k} = {v:.3f}" if isinstance(v, float) else f"{k} = {v}"
                                                     for k, v in result["extra"].items()) + "."]
    if train_log:
        lines += ["", "Training log (`train_log.json`): " + json.dumps(train_log.get("timings_s", {})) + " seconds, "
                  f"{train_log.get('threads')} threads, {train_log.get('parameters')} parameters per model, "
                  f"vocabulary {train_log.get('vocab')}."]
    return "\n".join(lines) + "\n"


CARD_HEAD = """# forkpoint demo pair: a model organism

A tiny base / reasoning pair trained by forkpoint's own script (`forkpoint demo train`, code in
`core/demo/train.py`) on a synthetic task (`core/demo/task.py`), so that the seed paper's effect can be
seen in seconds, on a CPU, with no model hub. Both models are `LlamaForCausalLM` checkpoints in standard
Hugging Face format (config.json + model.safetensors + tokenizer) and load through the same
`core.load_pair` path as Qwen3 (`core.demo_pair()`). Prompt formats are in `pair.json`.

## What it is

**Task.** Two-step word problems whose route is decided by a cue phrase ("buys 6 bags of 5" ->
multiply, "gives away 2" -> subtract). Every solution has one shape: a routine restatement, a short
plan that decides the route, and routine execution that follows the plan:

    Question: Mia buys 6 bags of 5 pens. Then she gives away 3. How many pens does Mia have now?
    Answer: The numbers are 6, 5 and 3. First, we multiply, then we subtract. 6 * 5 = 30. 30 - 3 = 27.
    So Mia has 27 now. The answer is \\boxed{{27}}.

All numbers and results stay in 0..99 (exact division), so execution is easy; the difficulty is in
the plan. The held-out set is `assets/problems/demo_test.jsonl` (500 problems) and the gate's
calibration set `assets/problems/demo_calib.jsonl` (100); both are excluded from training.

**Base model.** Trained on a corpus where, for 7 of the 12 first-step phrasings ("bakes .. and burns",
"were taken", "bags of", "rows", "shelves", "shares equally among", "equal piles"), the plan takes the
base's favourite route (*add*) {habit:.0%} of the time, and every other plan step is replaced by a random
executable operation {noise:.0%} of the time; execution always follows the written plan faithfully. So
the base knows every route (the right one is still in its top few tokens) but has a systematic wrong
habit, and it fails greedy *and* sampled on those phrasings.

**Reasoning model.** The base, further trained on correct plans only (like post-training that
sharpens decisions and leaves execution alone). Both are trained on the response tokens only (the
prompt is masked out of the loss).

**Sizes.** {params:,} parameters per model ({layers} layers, hidden {hidden}, {heads} heads), a byte-level
BPE tokenizer of {vocab} tokens trained on the task corpus (digits split one by one), float32 weights.

## What it is not

- Not a language model in any useful sense: it only knows this task's template, and anything else
  (other prompts, longer answers) is out of distribution.
- The effect is put there by construction: we chose where the base errs (one plan token), that
  execution follows the plan, and where the plan sits in the response (after a short restatement, so
  the decision lies at u of about 0.2-0.3). The organism shows that forkpoint's scores, gates, baselines
  and analyses find a sparse, early, planning-located gap when one exists; it is not evidence that
  real base / reasoning pairs have one. The seed paper's numbers are about Qwen3 models.
- The reasoner was not trained with RL and does not think longer; it differs from the base only in
  its plan choices (and a little in confidence elsewhere).
- Not every takeover is a plan token: about a third of Guided's takeovers land on digits where the
  two models disagree, mostly inside the arithmetic and sometimes in the restated numbers (see
  plan_share_taken_over below); they rarely change the answer here.
- The planning lexicon (`assets/planning_lexicon.json`) lists the operation verbs (add, multiply, ...)
  so that the plan tokens of this task are tagged "plan"; the enrichment below depends on that.

## Reproduce

    forkpoint demo train --out assets/demo     # 1,500 base + 300 reasoning steps; see train_log.json
    {command}

Training uses 2 CPU threads by default and is seeded: the same seed, thread count, machine and library
versions give the same weights (other CPUs may differ in the last bits). The committed pair took
{train_s:.0f} s to train on 2 threads of a machine shared with other jobs.
"""


GATES_FILE = "gates.csv"  # the shoot-out's table on the demo pair, as `forkpoint gates` wrote it
GATES_COMMAND = ("forkpoint gates --gate-rhos 0.02,0.05,0.1 --samples 4 --limit 100 --calibration-problems 100 "
                 "--max-new-tokens 96 --temperature 0.6 --top-p 0.95 --out OUT")
CARD_GATE_RHOS = (0.02, 0.05)


def gates_card(table: pd.DataFrame, command: str = GATES_COMMAND, rhos: Sequence[float] = CARD_GATE_RHOS) -> str:
    """The card's shoot-out section (markdown) from a `forkpoint gates` table at the ρ in `rhos`: the numbers,
    the command, and what they do and do not show."""
    rows = table[table["benchmark"] == "average"] if (table["benchmark"] == "average").any() else table
    ends = rows[rows["target_rho"].isna()]
    base = ends[ends["label"] == "base"]
    shown = rows[rows["target_rho"].round(6).isin([round(r, 6) for r in rhos])]
    n = int(base["problems"].iloc[0]) if len(base) else 0
    k = int(rows["k"].min()) if len(rows) else 0
    lines = ["## Which gate knows when: the shoot-out at equal ρ", "",
             f"Measured with `{command}` on the first {n} held-out problems ({k} samples each, the demo calibration "
             "set's base rollouts setting every gate's knob; a router trained on those rollouts, target: where the "
             "calibrated Guided gate fires). Two of its target ρ:", "",
             "| gate | target ρ | realised ρ | accuracy | pass@k | recovery@k | wrong → right | right → wrong | "
             "reasoner evaluations / token | reasoner forwards / token (counted) | wall ms / token |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for _, r in pd.concat([ends, shown]).iterrows():
        def num(col: str, fmt: str = ".3f", scale: float = 1.0) -> str:
            v = float(r[col]) if col in r and pd.notna(r[col]) else float("nan")
            return "–" if v != v else format(v * scale, fmt)
        lines.append(f"| {r['label']} | {num('target_rho', 'g')} | {num('rho')} | {num('accuracy')} | "
                     f"{num('pass@k')} | {num('recovery@k')} | {int(r['wrong_to_right'])} | {int(r['right_to_wrong'])} "
                     f"| {num('reason_evals_per_token')} | {num('reason_forwards_per_token')} "
                     f"| {num('wall_s_per_token', '.2f', 1000.0)} |")
    lines += ["", "What it shows: on this pair every gate that reads the base's uncertainty (entropy, top-1 "
              "probability, margin, the router) finds the one decision token as well as the paper's disagreement "
              "gate at the same ρ, while random positions and an early prefix at that ρ do not; the gates on the "
              "base alone ask the reasoner only where they fire (reasoner evaluations per token ≈ ρ, against 1 for "
              "Guided). Flips count problems (right = at least half the samples correct).",
              "", "What it does not show: that the gates are equally good on real pairs (the organism's gap is one "
              "plan token, built where the base is unsure, so any uncertainty gate finds it); that the lazy gates "
              "are faster here (the models are tiny, so per-step Python overhead dominates and the wall times, "
              "measured on a machine shared with other jobs, move with its load; the reasoner still reads every "
              "token afterwards to fill the metrics); anything about a router trained on another pair or target.",
              ""]
    return "\n".join(lines)


def _pairs(items: list[Any]) -> str:
    return ", ".join(f"{tok!r} {p:.3f}" for tok, p in items)


def write_card(demo_dir: Any, n: int = settings.SETTINGS["demo_measure_problems"].value,
               samples: int = settings.SETTINGS["demo_measure_samples"].value, command: str = "forkpoint demo measure",
               progress: Progress | None = None, out: Any = None, **kwargs: Any) -> dict[str, Any]:
    """Load the pair in `demo_dir`, measure it on the first `n` test problems (see `measure_demo`) and
    write CARD.md and measure.json into `out` (default: demo_dir); returns the measurement. A folder inside
    the installed package is refused (InvalidInputError): nothing writes into site-packages."""
    demo_dir = Path(demo_dir)
    out = demo_dir if out is None else Path(out)
    if is_installed(out):
        raise InvalidInputError(f"{out} is inside the installed forkpoint package; write the card elsewhere "
                                "(out=, CLI: --out), e.g. the working directory")
    pair = demo.demo_pair(demo_dir=demo_dir)
    result = measure_demo(pair, demo.demo_problems("test", limit=n), demo.demo_problems("calib"), samples=samples,
                          progress=progress, **kwargs)
    previous = out / "measure.json"
    if previous.exists() and result["traces"]["reused"]:
        old = json.loads(previous.read_text())
        same = old.get("settings") == result["settings"] and old.get("gate") == result["gate"]
        cold = old.get("cold_seconds") or (old.get("seconds") if not old.get("traces", {}).get("reused") else None)
        if same and cold:
            result["cold_seconds"] = cold  # carry the timing of the run that generated the stored traces
    train_log = json.loads((demo_dir / "train_log.json").read_text()) if (demo_dir / "train_log.json").exists() else {}
    cfg = train_log.get("config", {})
    head = CARD_HEAD.format(habit=cfg.get("habit_rate", float("nan")), noise=cfg.get("noise_rate", float("nan")),
                            params=train_log.get("parameters", 0), layers=cfg.get("layers"), hidden=cfg.get("hidden"),
                            heads=cfg.get("heads"), vocab=train_log.get("vocab"), command=command,
                            train_s=train_log.get("timings_s", {}).get("total", float("nan")))
    text = head + "\n## Measured properties\n\n" + render_card(result, command, train_log)
    if (demo_dir / GATES_FILE).exists():  # the shoot-out, measured by its own command (see gates_card)
        text += "\n" + gates_card(pd.read_csv(demo_dir / GATES_FILE))
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "CARD.md", lambda fh: fh.write(text), what="demo card")
    measured = json.dumps(result, indent=1, default=str) + "\n"
    write_atomic(out / "measure.json", lambda fh: fh.write(measured), what="demo measurement")
    log.info("wrote %s", out / "CARD.md")
    return result
