"""Branch trees over a store's summary rows: a problem's root, a trace's children, the nested tree.

Pure functions over `TraceStore`'s summary rows (key, parent, branch_pos, created, ...); the store's
`root_of`, `children` and `tree` call them.
"""

from __future__ import annotations

from typing import Any

SummaryRow = dict[str, Any]


def branch_order(row: SummaryRow) -> tuple[Any, ...]:
    """Children by branch position (unknown last), then creation time, then key."""
    pos = row.get("branch_pos")
    return (pos is None, pos or 0, str(row.get("created") or ""), row["key"])


def root_of(rows: list[SummaryRow], problem_id: str) -> str | None:
    """Key of the oldest trace of a problem that is not a branch (None when there is none)."""
    roots = [r for r in rows if not r.get("parent") and str(r.get("problem")) == str(problem_id)]
    return min(roots, key=lambda r: (str(r.get("created") or ""), r["key"]))["key"] if roots else None


def children_index(rows: list[SummaryRow]) -> dict[str, list[str]]:
    """Each parent's children keys, by branch position then creation time: one pass over `rows` for all of them."""
    kids: dict[str, list[SummaryRow]] = {}
    for r in rows:
        if r.get("parent"):
            kids.setdefault(r["parent"], []).append(r)
    return {parent: [r["key"] for r in sorted(group, key=branch_order)] for parent, group in kids.items()}


def tree(rows: list[SummaryRow], key: str, kids: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The branch tree holding `key` (one of `rows`): the oldest ancestor in `rows`, with nested
    "children" lists (a cycle of parents, impossible in a healthy store, is cut). `kids`: `children_index(rows)`
    when the caller holds it already."""
    by_key = {r["key"]: r for r in rows}
    kids = children_index(rows) if kids is None else kids
    root, seen = key, {key}
    while (parent := by_key[root].get("parent")) in by_key and parent not in seen:
        root = parent
        seen.add(root)

    def node(k: str, path: frozenset[str]) -> dict[str, Any]:
        r = by_key[k]
        return {
            "key": k,
            "kind": r.get("kind"),
            "branch_pos": r.get("branch_pos"),
            "n_tokens": r.get("n_tokens"),
            "created": r.get("created"),
            "correct": r.get("correct"),
            "n_takeovers": r.get("n_takeovers"),
            "children": [node(c, path | {k}) for c in kids.get(k, []) if c not in path | {k}],
        }

    return node(root, frozenset())
