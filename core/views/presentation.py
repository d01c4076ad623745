"""What the edges show of a trace, shared by the app and the notebook widget: the token view's hover
data, the takeover choices at a token, branch-tree labels and number formats. Plain data, no UI code."""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from core.errors import InvalidInputError
from core.record.typed import typed_runs
from core.scoring.registry import DEFAULT_SCORE, METRICS, score_values
from core.settings import PAGE_TOKENS  # noqa: F401  (re-exported: the token view's page size)
from core.trace import SIDES, Trace, note_texts

# Metrics shown on hover, in order; their labels come from core.scoring.metrics' registry.
HOVER_METRICS: tuple[str, ...] = (
    "cross_entropy", "kl_base_reason", "kl_reason_base", "jsd", "entropy_base", "entropy_reason", "delta_logp",
    "logp_base", "logp_reason", "rank_base", "rank_reason", "reason_top_rank_in_base",
)  # fmt: skip

def policy_text(policy: Any, kind: Any = None, parent: Any = None) -> str:
    """A trace's policy as every edge names it: the policy's name; a branch "branch · then <policy>" (its
    takeover was the user's, not the policy's); a trace with no policy (an import) its kind."""
    name = None if policy is None or (isinstance(policy, float) and math.isnan(policy)) else str(policy)
    name = None if name in ("", "None", "nan") else name
    kind_text = None if kind is None or (isinstance(kind, float) and math.isnan(kind)) else str(kind)
    has_parent = parent is not None and not (isinstance(parent, float) and math.isnan(parent)) and str(parent) != ""
    if has_parent:
        return f"{kind_text or 'branch'} · then {name}" if name else (kind_text or "branch")
    return name or kind_text or "?"


def fmt_num(value: float | None) -> str:
    """A metric for a narrow display box: 3 significant digits, scientific below 1e-3 (never "0.00…")."""
    if value is None or not math.isfinite(float(value)):
        return "–"
    v = float(value)
    return "0" if v == 0 else f"{v:.2e}" if abs(v) < 1e-3 else f"{v:.3g}"


def fmt_prob(p: float | None, mode: str = "prob") -> str:
    """A probability for display: 3 significant digits (1.31e-02 never reads 0.000), or its log in nats."""
    if p is None or not math.isfinite(float(p)):
        return "–"
    p = float(p)
    if mode == "logprob":
        return "−inf" if p <= 0 else f"{math.log(p):.3f}"
    if p == 0:
        return "0"
    if 0.9995 <= p < 1.0:  # 3 significant digits would round to "1": show the gap instead
        return f"1−{1.0 - p:.1e}"
    return f"{p:.3g}" if p >= 1e-3 else f"{p:.2e}"


# -- measured takeover effects (the "effects" annotation layer) ------------------------------------

EFFECT_FIELDS = ("effect", "ci_low", "ci_high", "acc_with", "acc_without", "n")  # what a marker carries


def effects_by_pos(layer: Any) -> dict[int, dict[str, float]]:
    """An "effects" layer (records with pos and EFFECT_FIELDS, from core.instruments.effects.effects_layer)
    as {pos: record}; where a position was measured more than once, the record with the most samples."""
    out: dict[int, dict[str, float]] = {}
    for rec in layer or ():
        pos = int(rec["pos"])
        row = {name: float(rec[name]) for name in EFFECT_FIELDS}
        if pos not in out or row["n"] > out[pos]["n"]:
            out[pos] = row
    return out


def effect_line(rec: dict[str, float]) -> str:
    """One measured position in words: "effect +0.50 [+0.10, +0.80] · acc with 0.75 / without 0.25 · n = 8 per arm"."""
    return (f"effect {rec['effect']:+.2f} [{rec['ci_low']:+.2f}, {rec['ci_high']:+.2f}] · acc with "
            f"{rec['acc_with']:.2f} / without {rec['acc_without']:.2f} · n = {int(rec['n'])} per arm")


# -- hover data -----------------------------------------------------------------------------------


def _sig(values: Any, digits: int) -> np.ndarray:
    """Round to `digits` significant digits, vectorised (1.8e-05 stays 1.8e-05, never 0)."""
    x = np.asarray(values, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = 10.0 ** (digits - 1 - np.floor(np.log10(np.abs(x))))
        out = np.round(x * scale) / scale
    return np.where(np.isfinite(out), out, x)  # 0, inf and NaN pass through


def _clean(values: Any, digits: int = 4) -> list[float | None]:
    """Floats to `digits` significant digits for JSON, non-finite values as None (JSON has no NaN)."""
    return [None if not math.isfinite(v) else v for v in _sig(values, digits).tolist()]


def hover_data(trace: Trace, score: str = DEFAULT_SCORE, decode: Callable[[int], str] | None = None,
               k: int | None = None, prob_mode: str = "prob") -> dict[str, Any]:
    """Compact, JSON-ready per-token data for the hover card: tokens, sources, metrics, both top-k.

    Top-k ids refer into `vocab` (id -> text, raw model text: the browser sets it as text, never HTML).
    """
    k = trace.k if k is None else min(k, trace.k)
    ids = {side: np.asarray(trace.topk[side][0])[:, :k] for side in SIDES}
    probs = {side: np.asarray(trace.topk[side][1], dtype=np.float64)[:, :k] for side in SIDES}
    used = np.unique(np.concatenate([ids["base"].reshape(-1), ids["reason"].reshape(-1), trace.token_ids]))
    vocab = {str(int(i)): (decode(int(i)) if decode is not None else f"#{int(i)}") for i in used.tolist()}
    metrics = {name: _clean(trace.metrics[name]) for name in HOVER_METRICS if name in trace.metrics}
    return {
        "tokens": list(trace.tokens),
        "ids": trace.token_ids.tolist(),
        "source": [str(s) for s in trace.source],
        "score_name": METRICS[score].signed_label,
        "score": _clean(score_values(trace.metrics, score)),
        "metrics": metrics,
        "labels": {name: METRICS[name].label for name in HOVER_METRICS if name in METRICS},
        "top": {side: ids[side].tolist() for side in SIDES},
        "prob": {side: _sig(probs[side], 6).tolist() for side in SIDES},
        "prob_mode": prob_mode,
        "vocab": vocab,
        "tags": [str(t) if t is not None else "" for t in trace.annotations.get("tags", [""] * len(trace))],
        "notes": note_texts(trace.annotations.get("notes") or [], len(trace)),
        "effects": {str(pos): {k: _sig(v, 4).item() for k, v in rec.items()}
                    for pos, rec in effects_by_pos(trace.annotations.get("effects")).items() if pos < len(trace)},
    }

# -- where a switch would matter ------------------------------------------------------------------


# -- takeover choices -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """One way to take over at a position: the reasoner's own pick (token None) or a fixed token id."""

    label: str
    token: int | None


def prob_at(trace: Trace, side: str, pos: int, token: int) -> float | None:
    """`side`'s probability of `token` at `pos` if it is in the stored top-k, else None (below the k-th)."""
    ids, probs = trace.topk[side]
    hits = np.flatnonzero(np.asarray(ids[pos]) == int(token))
    return float(np.asarray(probs[pos])[hits[0]]) if hits.size else None


def both_probs(trace: Trace, pos: int, token: int, mode: str = "prob") -> str:
    """"base p=…, reason p=…" for a token at `pos` ("< p_k" when outside that model's stored top-k)."""
    parts = []
    for side in SIDES:
        p = prob_at(trace, side, pos, token)
        if p is None:
            floor = float(np.asarray(trace.topk[side][1][pos]).min()) if trace.k else None
            parts.append(f"{side} p<{fmt_prob(floor, mode)}" if floor is not None else f"{side} p=?")
        else:
            parts.append(f"{side} {'log p' if mode == 'logprob' else 'p'}={fmt_prob(p, mode)}")
    return ", ".join(parts)


def takeover_choices(trace: Trace, pos: int, decode: Callable[[int], str] | None = None,
                     mode: str = "prob") -> list[Choice]:
    """"Reasoning model takes over here" first, then each distinct token of either model's top-k at `pos`,
    each labelled with both models' probabilities."""
    if not 0 <= pos < len(trace):
        raise InvalidInputError(f"Position {pos} is outside the trace (0..{len(trace) - 1})")
    show = (lambda i: repr(decode(i))) if decode is not None else (lambda i: f"#{i}")
    out = [Choice("reasoning model takes over here (its own choice)", None)]
    seen: set[int] = set()
    for side in ("reason", "base"):
        ids, _ = trace.topk[side]
        for rank, tok in enumerate(np.asarray(ids[pos]).tolist()):
            if tok in seen:
                continue
            seen.add(tok)
            emitted = " (emitted)" if tok == int(trace.token_ids[pos]) else ""
            out.append(Choice(f"{side} #{rank + 1}: {show(tok)}  {both_probs(trace, pos, tok, mode)}{emitted}", int(tok)))
    return out

def flip_changes(trace: Trace) -> list[int]:
    """The positions where a flip (core.decoding.takeover.flipped) changes the token, so the views can mark
    them: a base token whose reasoner top token is another, a takeover whose base top token is another, and
    every forced token (undoing it hands the position back to the policy). Elsewhere the other model writes
    the same token, so a flip there changes nothing. Exact for greedy traces; a sampled one draws its tokens."""
    if not len(trace) or not trace.k:
        return []
    emitted = np.asarray(trace.token_ids)
    source = np.asarray([str(s) for s in trace.source])
    top = {side: np.asarray(trace.topk[side][0])[:, 0] for side in SIDES}
    other = np.where(source == "reason", top["base"], top["reason"])
    return [int(p) for p in np.flatnonzero((source == "forced") | (other != emitted))]


def no_change_line(trace: Trace, pos: int, decode: Callable[[int], str] | None = None) -> str:
    """What a view says after a flip at `pos` that changed no token ("the reasoner writes ' X' here too")."""
    who = "base" if str(trace.source[pos]) != "base" else "reasoner"
    token = int(trace.token_ids[pos])
    text = decode(token) if decode is not None else trace.tokens[pos]
    return f"the {who} writes {text!r} here too: nothing changes"


def tree_rows(tree: dict[str, Any], depth: int = 0) -> list[tuple[int, dict[str, Any]]]:
    """A branch tree (TraceStore.tree) flattened depth-first as (depth, node) rows."""
    rows = [(depth, tree)]
    for child in tree.get("children", []):
        rows.extend(tree_rows(child, depth + 1))
    return rows


def tree_label(depth: int, node: dict[str, Any], what: str = "") -> str:
    """One line of the branch tree: indentation, where it branched and with what token, length, short key."""
    where = "root" if node.get("branch_pos") is None else f"branch @ {node['branch_pos']}"
    if what:
        where = what if what.startswith("⇄") else f"{where} {what}"
    return f"{'　' * depth}{'└ ' if depth else ''}{where} · {node.get('n_tokens')} tokens · {str(node['key'])[:8]}"


def outcome_line(trace: Trace) -> str:
    """The trace's outcome in one plain line: verdict, answer, takeovers and their rate ρ (the token view
    shows it above the text; the switchboard redraws it when a switch completes)."""
    correct, answer = trace.meta.get("correct"), trace.meta.get("answer")
    verdict = "✓ correct" if correct is True else "✗ wrong" if correct is False else "– ungraded"
    shown = "(none)" if answer is None else str(answer) if len(str(answer)) <= 60 else str(answer)[:59] + "…"
    n, takeovers = len(trace), trace.n_takeovers
    return (f"{verdict} · answer: {shown} · {takeovers} takeover{'' if takeovers == 1 else 's'} · "
            f"ρ = {takeovers / n if n else 0.0:.3f}")


def who_wrote(trace: Trace, pos: int) -> str:
    """Who wrote token `pos`, as the selection panel says it: "emitted by base" / "emitted by reason (a
    takeover)", and for the user's tokens "typed by you" (typed text, core.record.typed) or "forced by you"
    (a token chosen from the top-k or the vocabulary)."""
    source = str(trace.source[pos])
    if source == "forced":
        typed = any(start <= pos < start + n for start, n in typed_runs(trace).items())
        return "typed by you" if typed else "forced by you"
    return f"emitted by {source}" + (" (a takeover)" if source == "reason" else "")


def switch_text(trace: Trace, decode: Callable[[int], str] | None = None) -> str:
    """What a child's switches did, e.g. "⇄ #40 off · ⇄ #12 reasoner ' Wait'" ("" for a root). Typed text (a
    typed run, core.record.typed: one token or many) shows as one edit with all its text: "✎ #12 ' Let me'";
    a token forced from the top-k as "⇄ #12 forced ' Let'"."""
    runs = typed_runs(trace)
    parts: list[str] = []
    inside = -1  # the typed run's end: its later tokens are in its edit already
    for entry in trace.meta.get("switched") or []:
        pos, to = int(entry["pos"]), entry["to"]
        if pos < inside:
            continue
        if pos in runs:
            inside = pos + runs[pos]
            parts.append(f"✎ #{pos} {_text_of(trace, list(range(pos, inside)), decode)!r}")
        elif to == "base":
            parts.append(f"⇄ #{pos} off" if entry.get("from") == "reason" else f"⇄ #{pos} base")
        else:
            text = repr(_text_of(trace, [pos], decode)) if pos < len(trace) else ""
            parts.append(f"⇄ #{pos} {'forced' if to in ('forced', 'typed') else 'reasoner'} {text}".rstrip())
    return " · ".join(parts)


def _text_of(trace: Trace, positions: list[int], decode: Callable[[int], str] | None) -> str:
    """The text of the tokens at `positions`: one token through `decode`, a run as its display strings joined
    (a character split over byte-level tokens decodes, token by token, to replacement characters)."""
    kept = [p for p in positions if p < len(trace)]
    if decode is not None and len(kept) == 1:
        return decode(int(trace.token_ids[kept[0]]))
    return "".join(trace.tokens[p] for p in kept)


def branch_token_text(trace: Trace, decode: Callable[[int], str] | None = None) -> str:
    """What a branch put at its branch position: its switches (`switch_text`), or for a branch made before
    switches were recorded "forced 'x'" / "reasoner 'x'" ("" for a root)."""
    if trace.meta.get("switched"):
        return switch_text(trace, decode)
    pos = trace.meta.get("branch_pos")
    if pos is None or not 0 <= int(pos) < len(trace):
        return ""
    pos = int(pos)
    who = "forced" if str(trace.source[pos]) == "forced" else "reasoner"
    end = pos + 1
    while who == "forced" and end < len(trace) and str(trace.source[end]) == "forced":  # a typed string: all of it
        end += 1
    text = "".join(decode(int(trace.token_ids[p])) if decode is not None else trace.tokens[p] for p in range(pos, end))
    return f"{who} {text!r}" + (f" ({end - pos} tokens)" if end - pos > 1 else "")


def sibling_labels(labels: dict[str, str], children: Sequence[Trace]) -> dict[str, str]:
    """`labels` (trace key -> what it changed against its parent, `branch_token_text`) with siblings told apart:
    where two or more children of one parent read alike (a fan's samples beside the greedy flip: each
    "⇄ #15 reasoner ' divide'"), each gets the token where it parts from its nearest such sibling (or which
    one it repeats) and which draw it is (`draw_name`): "⇄ #15 reasoner ' divide' · #23 ' by' · sample 2",
    "… · same text as greedy · sample 3"."""
    groups: dict[tuple[Any, str], list[Trace]] = {}
    for child in children:
        label = labels.get(child.key) or ""
        if label and child.meta.get("parent"):
            groups.setdefault((child.meta["parent"], label), []).append(child)
    out = dict(labels)
    for (_, label), alike in groups.items():
        if len(alike) < 2:
            continue
        for child in alike:
            others = [o for o in alike if o is not child]
            parts = [first_difference(child, other) for other in others]
            if None in parts:  # another has its very tokens
                part = f"same text as {draw_name(others[parts.index(None)])}"
            else:
                where = max(parts)  # d: int
                part = f"#{where} {child.tokens[where]!r}" if where < len(child) else f"ends at #{where}"
            out[child.key] = f"{label} · {part} · {draw_name(child)}"
    return out


def draw_name(trace: Trace) -> str:
    """Which draw a child is: "greedy", "sample 2" (a fan's, `meta["fan"]`), else its sampling seed."""
    sampling = trace.meta.get("sampling") or {}
    if not float(sampling.get("temperature") or 0.0) > 0:
        return "greedy"
    fan = trace.meta.get("fan") or {}
    if fan.get("sample") is not None:
        return f"sample {int(fan['sample']) + 1}"
    return f"seed {sampling.get('seed')}"


def short_label(label: str, width: int = 28) -> str:
    """`label` in about `width` characters for a graph: its last " · " parts kept whole while they fit (what
    tells siblings apart, `sibling_labels`) and the head cut before them, else cut at the end."""
    if len(label) <= width:
        return label
    head = label.split(" · ")
    tail: list[str] = []
    while len(head) > 1 and len(" · ".join([head[-1], *tail])) <= width - 8:
        tail.insert(0, head.pop())
    if not tail:
        return label[: width - 1] + "…"
    kept = " · ".join(tail)
    return " · ".join(head)[: width - len(kept) - 4].rstrip() + "… · " + kept


# -- branches: where two traces part, slices and token diffs -------------------------------------------------------------------------------------


def first_difference(a: Trace, b: Trace, start: int = 0) -> int | None:
    """First position ≥ start where the two token sequences differ (a length difference counts), or None."""
    n = min(len(a), len(b))
    if start < n:
        diff = np.flatnonzero(a.token_ids[start:n] != b.token_ids[start:n])
        if diff.size:
            return int(start + diff[0])
    longest = max(len(a), len(b))
    return max(n, start) if len(a) != len(b) and max(n, start) < longest else None


def tail(trace: Trace, start: int, end: int | None = None) -> Trace:
    """Tokens start..end-1 (default: to the end) as a new trace (metrics, top-k, sources and token layers cut
    alike; spike positions shifted to the slice)."""
    n = len(trace)
    start = max(0, min(int(start), n))
    end = n if end is None else max(start, min(int(end), n))
    cut = {}
    for name, layer in trace.annotations.items():
        if name == "notes":  # note records, not one entry per token: keep those on the slice, shifted
            cut[name] = [{**nt, "start": max(int(nt["start"]), start) - start, "end": min(int(nt["end"]), end - 1) - start}
                         for nt in layer or [] if int(nt["end"]) >= start and int(nt["start"]) < end]
        elif name == "effects":  # records by position, like the notes
            cut[name] = [{**rec, "pos": int(rec["pos"]) - start} for rec in layer or [] if start <= int(rec["pos"]) < end]
        elif isinstance(layer, (list, tuple)) and len(layer) == n:
            cut[name] = list(layer[start:end])
    spikes_layer = trace.annotations.get("spikes")
    if isinstance(spikes_layer, dict):
        cut["spikes"] = {**spikes_layer,
                         "positions": [p - start for p in spikes_layer.get("positions", []) if start <= p < end]}
    meta = trace.meta
    if meta.get("switches"):  # switch positions shift with the slice, like spikes
        meta = {**meta, "switches": {str(int(p) - start): w for p, w in meta["switches"].items()
                                     if start <= int(p) < end}}
    return Trace(
        token_ids=trace.token_ids[start:end], tokens=trace.tokens[start:end], prompt_ids=trace.prompt_ids,
        metrics={name: np.asarray(v)[start:end] for name, v in trace.metrics.items()},
        topk={side: (ids[start:end], probs[start:end]) for side, (ids, probs) in trace.topk.items()},
        source=trace.source[start:end], meta=meta, annotations=cut,
    )


def page_bounds(n_tokens: int, page: int, size: int = PAGE_TOKENS) -> tuple[int, int]:
    """[start, end) of page `page` (clamped) of a trace of `n_tokens`."""
    pages = max(1, -(-int(n_tokens) // size))
    page = max(0, min(int(page), pages - 1))
    return page * size, min(int(n_tokens), (page + 1) * size)


DIFF_COLUMNS = ["op", "pos_original", "pos_branch", "original", "branch", "score_original", "score_branch", "delta"]


def token_diff(original: Trace, branch: Trace, start: int, score: str = DEFAULT_SCORE) -> pd.DataFrame:
    """Original vs branch from `start` on, aligned token by token (difflib over token ids): one row per
    aligned pair (op equal / replace) or unpaired token (insert / delete), with both scores and
    delta = branch - original (NaN where a side is missing)."""
    a = original.token_ids[start:].tolist()
    b = branch.token_ids[start:].tolist()
    sa = np.asarray(score_values(original.metrics, score), dtype=np.float64)
    sb = np.asarray(score_values(branch.metrics, score), dtype=np.float64)
    rows: list[dict[str, Any]] = []

    def row(op: str, i: int | None, j: int | None) -> None:
        va = float(sa[start + i]) if i is not None else math.nan
        vb = float(sb[start + j]) if j is not None else math.nan
        rows.append({"op": op, "pos_original": None if i is None else start + i,
                     "pos_branch": None if j is None else start + j,
                     "original": "" if i is None else original.tokens[start + i],
                     "branch": "" if j is None else branch.tokens[start + j],
                     "score_original": va, "score_branch": vb, "delta": vb - va})

    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal" or op == "replace":
            pairs = list(zip(range(i1, i2), range(j1, j2)))
            for i, j in pairs:
                row(op, i, j)
            for i in range(i1 + len(pairs), i2):
                row("delete", i, None)
            for j in range(j1 + len(pairs), j2):
                row("insert", None, j)
        elif op == "delete":
            for i in range(i1, i2):
                row(op, i, None)
        else:
            for j in range(j1, j2):
                row(op, None, j)
    df = pd.DataFrame(rows, columns=DIFF_COLUMNS)
    for col in ("pos_original", "pos_branch"):
        df[col] = df[col].astype("Int64")
    return df


def quoted_tokens(frame: Any, *columns: str) -> Any:
    """`frame` with the token texts in `columns` quoted as `lens` and `takeover` print tokens (repr): a space
    token shows as ' ', and ' add' differs from 'add'. For tables shown to a reader (terminal, app), not CSV."""
    return frame.assign(**{c: frame[c].map(repr) for c in columns})
