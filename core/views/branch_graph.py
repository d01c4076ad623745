"""The branch tree as a graph to draw (Loom's view): one node per trace at (depth, row), edges from parent
to child, subtrees away from the open trace folded into one node when the tree is large. Pure layout;
the app draws it (app/figures.py) and the labels come from core.views.presentation."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

FOLD_ABOVE = 60  # nodes: a larger tree folds the subtrees that do not hold the open trace


@dataclass(frozen=True)
class GraphNode:
    """One drawn node: a trace at column `depth`, row `row` (leaves 0, 1, ...; a parent at its children's
    mean), its parent's key, and `folded` descendants hidden under it (0: none)."""

    key: str
    depth: int
    row: float
    parent: str | None
    branch_pos: int | None
    n_tokens: int | None
    correct: bool | None
    n_takeovers: int
    folded: int


def _size(node: dict[str, Any]) -> int:
    return 1 + sum(_size(c) for c in node.get("children", []))


def _path_to(node: dict[str, Any], key: str | None) -> list[str]:
    """Keys from `node` down to `key` ([] when `key` is not under it)."""
    if key is None:
        return []
    if node["key"] == key:
        return [key]
    for child in node.get("children", []):
        found = _path_to(child, key)
        if found:
            return [node["key"], *found]
    return []


def graph_layout(tree: dict[str, Any], open_key: str | None = None, *, fold: bool | None = None,
                 expanded: Iterable[str] = (), collapsed: Iterable[str] = ()) -> list[GraphNode]:
    """The visible nodes of a branch tree (TraceStore.tree), depth-first. With `fold` (default: the tree has
    more than FOLD_ABOVE nodes) a subtree off the open trace's path is drawn as its root with the count of
    the traces folded under it; `expanded` keys are never folded; `collapsed` keys are always folded."""
    fold = _size(tree) > FOLD_ABOVE if fold is None else fold
    keep_open = set(_path_to(tree, open_key)) | set(expanded)
    force = set(collapsed) - set(_path_to(tree, open_key))
    out: list[GraphNode] = []
    next_row = [0.0]

    def visit(node: dict[str, Any], depth: int, parent: str | None) -> float:
        kids = node.get("children", [])
        folded = kids and (node["key"] in force or (fold and depth > 0 and node["key"] not in keep_open))
        index = len(out)
        out.append(None)  # type: ignore[arg-type]  # placeholder: depth-first order, parent before children
        if kids and not folded:
            rows = [visit(child, depth + 1, node["key"]) for child in kids]
            row = sum(rows) / len(rows)
        else:
            row = next_row[0]
            next_row[0] += 1.0
        out[index] = GraphNode(
            key=str(node["key"]), depth=depth, row=row, parent=parent,
            branch_pos=None if node.get("branch_pos") is None else int(node["branch_pos"]),
            n_tokens=node.get("n_tokens"), correct=node.get("correct"), n_takeovers=int(node.get("n_takeovers") or 0),
            folded=_size(node) - 1 if folded else 0,
        )  # fmt: skip
        return row

    visit(tree, 0, None)
    return out
