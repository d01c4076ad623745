"""core/views/branch_graph.py: every trace drawn once or folded, parents left of and centred on their children,
the open trace's path never folded, large trees folded to a drawable size."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from core.views.branch_graph import FOLD_ABOVE, graph_layout


def random_tree(n: int, seed: int) -> dict:
    rng = random.Random(seed)
    nodes = [{"key": "k0", "branch_pos": None, "n_tokens": 10, "children": []}]
    for i in range(1, n):
        parent = rng.choice(nodes)
        child = {"key": f"k{i}", "branch_pos": i, "n_tokens": 10, "correct": rng.choice([True, False, None]),
                 "n_takeovers": rng.randrange(4), "children": []}
        parent["children"].append(child)
        nodes.append(child)
    return nodes[0]


def _all(tree: dict) -> list[dict]:
    return [tree] + [n for c in tree["children"] for n in _all(c)]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 180), st.integers(0, 10_000), st.booleans())
def test_layout_invariants(n, seed, fold):
    tree = random_tree(n, seed)
    everything = _all(tree)
    open_key = random.Random(seed).choice(everything)["key"]
    nodes = graph_layout(tree, open_key, fold=fold)
    at = {x.key: x for x in nodes}
    assert len(at) == len(nodes)  # each drawn once
    assert len(nodes) + sum(x.folded for x in nodes) == n  # the rest folded, counted
    assert open_key in at
    by_key = {x["key"]: x for x in everything}
    for x in nodes:
        if x.parent is not None:
            assert at[x.parent].depth == x.depth - 1
        kids = [at[c["key"]] for c in by_key[x.key]["children"] if c["key"] in at]
        if kids:
            assert x.folded == 0 and abs(x.row - sum(k.row for k in kids) / len(kids)) < 1e-9
        elif by_key[x.key]["children"]:
            assert x.folded > 0
    leaves = [x.row for x in nodes if not any(y.parent == x.key for y in nodes)]
    assert sorted(leaves) == [float(i) for i in range(len(leaves))]  # one row per leaf, no overlap
    if not fold:
        assert len(nodes) == n


def test_a_large_tree_folds_by_default_and_keeps_the_open_path():
    tree = random_tree(150, 3)
    deep = max(_all(tree), key=lambda x: len(x["children"]) == 0 and int(x["key"][1:]))["key"]
    nodes = graph_layout(tree, deep)
    assert len(nodes) < 150 and sum(x.folded for x in nodes) == 150 - len(nodes)
    assert deep in {x.key for x in nodes}
    assert len(graph_layout(random_tree(FOLD_ABOVE, 1), "k0")) == FOLD_ABOVE  # small trees are drawn whole
    unfolded = graph_layout(tree, deep, expanded=[x.key for x in nodes if x.folded][:1])
    assert len(unfolded) > len(nodes)
