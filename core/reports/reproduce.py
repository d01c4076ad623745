"""Reproduce the seed paper on a real pair in one call: calibrate the gate on held-out base rollouts, sweep
the calibration ratio r (and optionally a budget cap), run Guided and the entropy-gated variant, random /
early baselines at the ρ Guided realised and at the paper's fixed ρ = 0.25, the base, the guide and the
same-size thinking reference, then every analysis per benchmark, and write one report laid out like the
paper plus CSVs.

Every trace goes through a store (default `<out>/store`), so an interrupted run resumes where it stopped
when the same call is repeated.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from core import settings
from core.analysis.registry import list_analyses
from core.analysis.tables import enrichment, first_token_artifact_share
from core.decoding.calibration import first_token_advice
from core.errors import InvalidInputError
from core.reports.gates import compare_gates, gate_summary, write_gates
from core.evaluation.harness import GUIDE, THINKING, Reference
from core.evaluation.sources import BENCHMARKS, load_benchmarks
from core.evaluation.sweep import DEFAULT_BASELINE_RHOS, DEFAULT_RATIOS, budget_sweep
from core.evaluation.thinking import DEFAULT_THINKING_FORMAT, load_thinking
from core.io.atomic import write_atomic
from core.io.csvsafe import write_csv
from core.io.store import TraceStore
from core.io.stored_traces import StoredTraces
from core.pair.loading import ModelPair, PromptFormat, format_spec, load_pair
from core.record.problems import problem_record
from core.settings import StageProgress

log = logging.getLogger(__name__)

SAMPLING = ("samples", "temperature", "top_p", "max_new_tokens")
PAPER_FORMATS = {"base_format": "paper-base", "reason_format": "paper-think", "thinking_format": "paper-think"}


@dataclass
class Reproduction:
    """What `reproduce` made: the report's path, the paper-style table, the sweep, the analyses."""

    out: Path
    report: Path
    table: pd.DataFrame
    sweep: pd.DataFrame
    analyses: dict[str, pd.DataFrame] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def resolve_sampling(preset: str | None = None, **given: Any) -> dict[str, Any]:
    """samples / temperature / top_p / max_new_tokens: given values, else the preset's, else the defaults."""
    chosen = {name: settings.SETTINGS[name].value for name in SAMPLING}
    if preset is not None:
        chosen.update({k: v for k, v in settings.preset(preset).items() if k in SAMPLING})
    chosen.update({k: v for k, v in given.items() if v is not None})
    return chosen


def split_calibration(benches: Mapping[str, list[Any]], n: int) -> tuple[list[Any], dict[str, list[Any]]]:
    """Hold out about `n` problems for calibration, spread over the benchmarks (at most a quarter of each,
    at least one from each with ≥ 2 problems); returns (calibration, remaining benchmarks)."""
    per = max(1, math.ceil(n / max(1, len(benches))))
    calibration, rest = [], {}
    for name, ps in benches.items():
        take = min(per, len(ps) // 4 or (1 if len(ps) >= 2 else 0))
        calibration += ps[:take]
        rest[name] = ps[take:]
    if not calibration:
        raise InvalidInputError("too few problems to hold any out for calibration; pass calibration= "
                                "(--calibration) with problems of their own")
    return calibration, rest


def first_calibration(sources: Any, n: int) -> list[Any]:
    """About `n` calibration problems from given sources (`load_benchmarks`' input): the first ⌈n / sources⌉ of
    each, spread over them as `split_calibration` spreads the problems it holds out."""
    per = max(1, math.ceil(n / max(1, len(sources))))
    return [p for ps in load_benchmarks(sources, limit=per).values() for p in ps]


def reproduce(base: Any, reason: str | None = None, problems: Any = None, out: str | Path = "forkpoint-reproduce", *,
              thinking: Any = None, preset: str | None = None, store: Any = None,
              ratios: Sequence[float] = DEFAULT_RATIOS, budgets: Sequence[float | None] = (None,),
              window: int = settings.WINDOW, score: str = settings.SCORE, calibration: Any = None,
              calibration_problems: int = settings.CALIBRATION_PROBLEMS, reference: Reference | None = None,
              baselines: bool = True, baseline_rhos: Sequence[str | float] = DEFAULT_BASELINE_RHOS,
              entropy_gated: bool = True, skip_first: int = 0, limit: int | None = None, samples: int | None = None,
              temperature: float | None = None, top_p: float | None = None, max_new_tokens: int | None = None,
              seed: int = settings.SEED, batch_size: int = settings.BATCH_SIZE, base_format: str | None = None,
              reason_format: str | None = None, thinking_format: str | None = None, device: str = settings.DEVICE,
              dtype: str = settings.DTYPE, revisions: Mapping[str, str | None] | None = None,
              trust_remote_code: bool = False, progress: StageProgress | None = None, executor: Any = None,
              gate_rhos: Sequence[float] = (), router: str | None = None) -> Reproduction:
    """Run the paper's protocol and write `<out>/report.html` plus CSVs (see module doc).

    `base`/`reason`: model sources, or a loaded `ModelPair` as `base` (then `reason` is ignored).
    `thinking`: the same-size thinking model (a source, or a pair from `load_thinking`); it is the
    recovery reference unless `reference` (a policy label or numbers per benchmark) says otherwise.
    `problems`: a source (file, hf:..., benchmark short name), a list of sources ("name=source"), a mapping
    {name: source or problems}, or a list of problem records. `preset="paper"` sets the paper's sampling
    and prompt formats; explicit arguments override it. `revisions` pins {"base"|"reason"|"thinking": rev}.
    `samples`, `temperature`, `top_p`, `max_new_tokens`: None takes the preset's, else the setting's (a length at
    most half the pair's context, as `ModelPair.default_max_new_tokens` says).
    `calibration`: sources (as `problems`) whose first `calibration_problems` problems, spread over them, calibrate
    the gates; None: `calibration_problems` held out from `problems` (at most a quarter of each).
    `baseline_rhos`: the random / early baselines' rates ("realised" = Guided's, per configuration; numbers =
    fixed rates); `entropy_gated`: run the entropy-gated variant beside Guided; `skip_first`: the gates'
    first-k-positions skip (see `Guided`).
    `executor` (e.g. `core.RayExecutor()`) makes the traces on other workers (docs/SCALE.md).
    `gate_rhos`: also run the gate shoot-out (`core.compare_gates`) at these target ρ, with the same problems,
    calibration and sampling (the learned gate with `router`, a trained router's folder); it is a section of
    the report and `<out>/gates/`."""

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sampling = resolve_sampling(preset, samples=samples, temperature=temperature, top_p=top_p,
                                max_new_tokens=max_new_tokens)
    formats = _formats(preset, base_format=base_format, reason_format=reason_format, thinking_format=thinking_format)
    revisions = dict(revisions or {})
    pair = _pair(base, reason, formats, device, dtype, revisions, trust_remote_code)
    if max_new_tokens is None:  # the preset's or the setting's length, at most half a small context (the demo's)
        sampling["max_new_tokens"] = pair.default_max_new_tokens(sampling["max_new_tokens"])
    thinking_pair = _thinking(pair, thinking, formats, revisions.get("thinking"), trust_remote_code)
    benches = load_benchmarks(_as_sources(problems), limit=limit)
    if calibration is None:
        calibration, benches = split_calibration(benches, calibration_problems)
    else:
        calibration = first_calibration(_as_sources(calibration), calibration_problems)
    if store is None:

        store = TraceStore(out / "store")
    reference = reference if reference is not None else (THINKING if thinking_pair is not None else GUIDE)
    keep: dict[str, list[Any]] = {}
    sweep = budget_sweep(pair, benches, calibration, ratios, budgets=budgets, window=window, score=score,
                         baselines=baselines, baseline_rhos=baseline_rhos, entropy_gated=entropy_gated,
                         skip_first=skip_first, thinking=thinking_pair, reference=reference, store=store, seed=seed,
                         batch_size=batch_size, progress=progress, keep=keep, executor=executor, **sampling)
    gate_table = None
    if gate_rhos:
        gate_table = compare_gates(pair, benches, calibration, list(gate_rhos), router=router, thinking=thinking_pair,
                                   reference=reference, store=store, seed=seed, batch_size=batch_size,
                                   progress=progress, executor=executor, **sampling)
    info = _info(pair, thinking_pair, benches, calibration, sampling, reference, ratios, budgets, window, score,
                 seed, store, preset)
    info.update(baseline_rhos=list(baseline_rhos) if baselines else [], entropy_gated=entropy_gated,
                skip_first=skip_first)
    if gate_table is not None:
        info["gate_rhos"] = list(gate_rhos)
    return write_reproduction(out, sweep, keep, info, score=score, reference=reference, benches=benches, pair=pair,
                              gates=gate_table)


def write_reproduction(out: Path, sweep: pd.DataFrame, keep: Mapping[str, list[Any]], info: dict[str, Any], *,
                       score: str, reference: Reference, benches: Mapping[str, list[Any]] | None = None,
                       pair: Any = None, gates: pd.DataFrame | None = None) -> Reproduction:
    """The analyses over the base rollouts per benchmark and pooled (enrichment also over the tokens Guided
    took over), the paper-style table, the CSVs and the HTML report in `out`. `benches` (the evaluation
    problems by benchmark) says which benchmark each trace is from; `pair` lets the t = 0 warning suggest
    the fix that fits it."""
    from core.reports.paper import paper_table, reproduce_html
    from core.reports.report import benchmark_tables, pooled

    if not isinstance(reference, str):
        sweep.attrs["reference_numbers"] = reference
    base_traces = keep.get("base", [])  # StoredTraces with a store: read one at a time, never all at once
    guided = pooled([ts for label, ts in keep.items() if label.startswith("r=")])
    by_bench = split_by_benchmark(base_traces, benches)
    # the base rollouts hold no ReasonOnly traces: the run's recovery is its policy table, not that analysis
    only = [spec.name for spec in list_analyses() if spec.name != "recovery"]
    analyses = benchmark_tables(by_bench, str(out / "analysis"), score=score, only=only)
    try:
        analyses["enrichment"] = enrichment_by_benchmark(by_bench, guided, benches, score)
        write_csv(analyses["enrichment"], out / "analysis" / "enrichment.csv")
    except (ImportError, OSError, ValueError) as exc:  # spaCy model missing etc.
        log.warning("enrichment skipped: %s", exc)
    info["first_token_artifact_share"] = {label: first_token_artifact_share(keep.get(label, []), score)
                                          for label in ("base", "reason", THINKING) if keep.get(label)}
    if info["first_token_artifact_share"].get("base", 0) > 0.5:
        advice = first_token_advice(pair) if pair is not None else "use a +think reasoner format or --skip-first 1"
        info["first_token_advice"] = advice
        log.warning("t = 0 is the largest spike in most base rollouts: %s", advice)
    table = paper_table(sweep)
    same = identical_configs({label: ts for label, ts in keep.items() if label.startswith("r=")})
    if same:
        info["identical_guided"] = same
        log.warning("Guided configurations with the same traces: %s", same)
    table["same_traces_as"] = [f"guided {same[c]}" if p == "guided" and c in same else ""
                               for p, c in zip(table["policy"], table["config"])]
    write_csv(sweep, out / "sweep.csv")
    write_csv(table, out / "table.csv")
    text = json.dumps(info, indent=1, default=str) + "\n"
    write_atomic(out / "run.json", lambda fh: fh.write(text), what="run record")
    if gates is not None:
        write_gates(out / "gates", gates, info)
        analyses["gates"] = gate_summary(gates)
    report = Path(reproduce_html(str(out / "report.html"), table, analyses, info))
    log.info("reproduction report: %s", report)
    return Reproduction(out=out, report=report, table=table, sweep=sweep, analyses=analyses, info=info)


def identical_configs(groups: Mapping[str, Sequence[Any]]) -> dict[str, str]:
    """{config: an earlier config whose traces are token for token the same} (e.g. two calibration ratios whose
    gates fire at the same positions): per (problem id, sample) the emitted tokens and who wrote each."""
    def signature(traces: Sequence[Any]) -> tuple:
        rows = []
        for t in traces:
            problem = t.meta.get("problem") or {}
            sample = (t.meta.get("sampling") or {}).get("sample", 0)
            content = hashlib.blake2b(np.asarray(t.token_ids, dtype=np.int64).tobytes()
                                      + "\0".join(map(str, t.source)).encode(), digest_size=16).hexdigest()
            rows.append((str(problem.get("id")), str(problem.get("prompt")), int(sample), content))
        return tuple(sorted(rows))

    seen: dict[tuple, str] = {}
    out: dict[str, str] = {}
    for label, traces in groups.items():
        sig = signature(traces)
        if sig and sig in seen:
            out[label] = seen[sig]
        else:
            seen.setdefault(sig, label)
    return out


def enrichment_by_benchmark(by_bench: Mapping[str, Sequence[Any]], guided: Sequence[Any],
                            benches: Mapping[str, list[Any]] | None, score: str) -> pd.DataFrame:
    """Planning enrichment per benchmark and, with several, pooled ("all"): every set over the base's own
    rollouts (`by_bench`) but "taken_over", which is over the Guided traces (`guided`, every ratio) of the
    same benchmark(s): one rule for each group, the pooled one included."""
    from core.reports.report import ALL_BENCHMARKS

    groups = _with_all(by_bench)
    guided_by = split_by_benchmark(guided, benches)
    taken = {**guided_by, **({ALL_BENCHMARKS: guided} if ALL_BENCHMARKS in groups else {})}
    frames = [enrichment(ts, score, taken=taken.get(name, [])).assign(benchmark=name) for name, ts in groups.items()]
    table = pd.concat(frames, ignore_index=True)
    return table[["benchmark", *[c for c in table.columns if c != "benchmark"]]]


def split_by_benchmark(traces: Sequence[Any], benches: Mapping[str, list[Any]] | None) -> dict[str, list[Any]]:
    """{benchmark: traces}, a trace placed by its problem (id and prompt) in `benches`; traces of no known
    benchmark (or all, without `benches`) under "problems"."""
    where: dict[tuple[Any, Any], str] = {}
    for name, ps in (benches or {}).items():
        for p in ps:
            rec = problem_record(p)
            where.setdefault((str(rec["id"]), rec["prompt"]), name)
    out: dict[str, list[Any]] = {name: [] for name in (benches or {})}
    store = traces.store if isinstance(traces, StoredTraces) else None  # then keys are kept, not traces
    for t in traces:
        problem = t.meta.get("problem") or {}
        name = where.get((str(problem.get("id")), problem.get("prompt")), "problems")
        out.setdefault(name, []).append(t.key if store is not None else t)
    return {name: StoredTraces(store, ts) if store is not None else ts for name, ts in out.items() if ts}


def _with_all(groups: Mapping[str, list[Any]]) -> dict[str, list[Any]]:
    """The groups plus, with several, all of them pooled (as `benchmark_tables` does)."""
    from core.reports.report import ALL_BENCHMARKS, pooled

    out = dict(groups)
    if len(groups) > 1:
        out[ALL_BENCHMARKS] = pooled(list(groups.values()))
    return out


def _as_sources(problems: Any) -> Any:
    """Normalise `problems` to what `load_benchmarks` takes."""
    if problems is None:

        raise InvalidInputError("reproduce needs problems: a file, hf:<dataset id>, or one of "
                                f"{', '.join(BENCHMARKS)}")
    if isinstance(problems, (str, Path)):
        return [str(problems)]
    if isinstance(problems, Mapping):
        return problems
    items = list(problems)
    if items and all(isinstance(p, (str, Path)) for p in items):
        return [str(p) for p in items]
    return {"problems": items}  # records


def _formats(preset: str | None, **given: str | None) -> dict[str, str | None]:
    chosen = dict(PAPER_FORMATS) if preset == "paper" else {k: None for k in PAPER_FORMATS}
    chosen.update({k: v for k, v in given.items() if v is not None})
    return chosen


def _pair(base: Any, reason: str | None, formats: Mapping[str, str | None], device: str, dtype: str,
          revisions: Mapping[str, str | None], trust_remote_code: bool) -> Any:

    if isinstance(base, ModelPair):
        given = {side: formats[f"{side}_format"] for side in ("base", "reason") if formats[f"{side}_format"]}
        if not given:
            return base
        from dataclasses import replace

        return replace(base, formats={**base.formats, **{s: PromptFormat(format_spec(f)) for s, f in given.items()}})
    if not reason:
        raise InvalidInputError("reproduce needs both a base and a reasoning model (--base and --reason)")
    return load_pair(str(base), str(reason), device=device, dtype=dtype, base_format=formats["base_format"],
                     reason_format=formats["reason_format"], base_revision=revisions.get("base"),
                     reason_revision=revisions.get("reason"), trust_remote_code=trust_remote_code)


def _thinking(pair: Any, thinking: Any, formats: Mapping[str, str | None], revision: str | None,
              trust_remote_code: bool) -> Any:

    if thinking is None or isinstance(thinking, ModelPair):
        return thinking
    return load_thinking(pair, str(thinking), formats["thinking_format"] or DEFAULT_THINKING_FORMAT, revision,
                         trust_remote_code)


def _info(pair: Any, thinking: Any, benches: Mapping[str, list[Any]], calibration: list[Any],
          sampling: Mapping[str, Any], reference: Reference, ratios: Sequence[float],
          budgets: Sequence[float | None], window: int, score: str, seed: int, store: Any,
          preset: str | None) -> dict[str, Any]:
    ref = f"policy {reference}" if isinstance(reference, str) else f"given numbers {reference}"
    if reference == THINKING:
        ref = f"same-size thinking model {thinking.specs['base'].id} ({thinking.formats['base'].spec})"
    elif reference == GUIDE:
        ref = "the guide (reasoner alone) — NOT the paper's same-size thinking reference"
    return {
        "reference": ref, "pair": pair.spec(), "thinking": None if thinking is None else thinking.spec()["base"],
        "benchmarks": {name: len(ps) for name, ps in benches.items()},
        "calibration_problems": [getattr(p, "id", None) or (p.get("id") if isinstance(p, dict) else None)
                                 for p in calibration],
        "sampling": dict(sampling), "seed": seed, "preset": preset, "ratios": list(ratios),
        "budgets": list(budgets), "window": window, "score": score, "store": str(getattr(store, "path", store)),
    }
