"""The demo model organism: task generator, corpora, tiny training round trip, the committed pair."""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.demo import pair as demo
from core.demo import task as demo_task
from core.demo import train as demo_train

# An independent reading of the cue phrases (distinctive words -> op), written apart from demo_task.
FIRST_WORDS = {"finds": "add", "from a friend": "add", "loses": "subtract", "burns": "subtract",
               "were taken": "subtract", "boxes": "multiply", "bags of": "multiply", "rows": "multiply",
               "shelves": "multiply", "groups of": "divide", "equally among": "divide", "equal piles": "divide"}
SECOND_WORDS = {"finds": "add", "is given": "add", "buys": "add", "gives away": "subtract", "eats": "subtract",
                "sells": "subtract", "times as many": "multiply", "grows": "multiply", "equal bags": "divide",
                "shares them fairly": "divide"}
PY_OPS = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y, "/": lambda x, y: x / y}
SOLUTION = re.compile(
    r"^ The numbers are (\d+), (\d+) and (\d+)\. First, we (\w+), then we (\w+)\. (\d+) ([-+*/]) (\d+) = (\d+)\. "
    r"(\d+) ([-+*/]) (\d+) = (\d+)\. So (\w+) has (\d+) now\. The answer is \\boxed\{(\d+)\}\.$"
)
VERB = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/"}


def _read(question: str, table: dict[str, str]) -> str:
    hits = {op for words, op in table.items() if words in question}
    assert len(hits) == 1, f"cue ambiguous or missing in {question!r}: {hits}"
    return hits.pop()


def check_solution(solution: str, numbers: list[int], route: list[str]) -> int:
    """Parse a solution and check every claim in it with Python arithmetic; return the final answer."""
    m = SOLUTION.match(solution)
    assert m, f"solution does not have the expected shape: {solution!r}"
    g = m.groups()
    a, b, c = map(int, g[0:3])
    assert [a, b, c] == numbers
    assert [g[3], g[4]] == route
    x1, s1, y1, r1 = int(g[5]), g[6], int(g[7]), int(g[8])
    x2, s2, y2, r2 = int(g[9]), g[10], int(g[11]), int(g[12])
    assert (x1, y1, x2, y2) == (a, b, r1, c)
    assert (s1, s2) == (VERB[route[0]], VERB[route[1]])
    assert PY_OPS[s1](x1, y1) == r1 and PY_OPS[s2](x2, y2) == r2
    assert 0 <= r1 <= 99 and 0 <= r2 <= 99
    assert int(g[14]) == r2 == int(g[15])
    return r2


# -- the task ----------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_problem_is_consistent(seed):
    p = demo_task.make_problem(random.Random(seed))
    route = [_read(p["question"].split(". ")[0], FIRST_WORDS), _read(p["question"].split(". ", 1)[1], SECOND_WORDS)]
    assert p["route"] == route
    assert p["plan"] == f"First, we {route[0]}, then we {route[1]}."
    assert p["plan"] in p["solution"]
    assert str(check_solution(p["solution"], p["numbers"], route)) == p["answer"]
    assert p["name"] in p["question"] and p["item"] in p["question"]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(demo_task.OPS))
def test_wrong_routes_are_carried_out_faithfully(seed, op):
    p = demo_task.make_problem(random.Random(seed))
    route = (op, p["route"][1])
    if demo_task.run_route(route, tuple(p["numbers"])) is None:
        with pytest.raises(ValueError):
            demo_task.render_solution(route, tuple(p["numbers"]), p["name"])
        return
    text = demo_task.render_solution(route, tuple(p["numbers"]), p["name"])
    check_solution(text, p["numbers"], list(route))
    # the base's favourite reading is always executable, so its corpus never needs to skip a problem
    assert demo_task.run_route(("add", p["route"][1]), tuple(p["numbers"])) is not None


def test_generator_is_seeded_and_covers_every_cue():
    a = demo_task.make_problems(400, seed=7)
    assert a == demo_task.make_problems(400, seed=7)
    assert a != demo_task.make_problems(400, seed=8)
    assert len({p["question"] for p in a}) == 400
    cues = {p["cues"][0] for p in a} | {p["cues"][1] for p in a}
    assert cues == {c.id for c in demo_task.FIRST_CUES + demo_task.SECOND_CUES}
    tricky = sum(p["tricky"] for p in a) / len(a)
    assert 0.45 < tricky < 0.72  # 7 of 12 first-step phrasings are tricky


def test_apply_matches_python_and_rejects_out_of_range():
    for x in range(0, 100, 7):
        for y in range(0, 12):
            assert demo_task.apply("add", x, y) == (x + y if x + y <= 99 else None)
            assert demo_task.apply("subtract", x, y) == (x - y if x >= y else None)
            assert demo_task.apply("multiply", x, y) == (x * y if x * y <= 99 else None)
            assert demo_task.apply("divide", x, y) == (x // y if y and x % y == 0 else None)


# -- corpora -----------------------------------------------------------------------------------
def test_base_habit_and_reason_corpus():
    cfg = demo_train.SIZES["full"]
    rng = random.Random(0)
    problems = [demo_task.make_problem(rng) for _ in range(3000)]
    strict = demo_train.DemoConfig(habit_rate=1.0, noise_rate=0.0)
    none = demo_train.DemoConfig(habit_rate=0.0, noise_rate=0.0)
    r = random.Random(1)
    for p in problems[:300]:
        want = ("add", p["route"][1]) if p["tricky"] else tuple(p["route"])
        assert demo_train.base_route(p, r, strict) == want
        assert demo_train.base_route(p, r, none) == tuple(p["route"])
    tricky = [p for p in problems if p["tricky"] and p["route"][0] != "add"]
    habit = sum(demo_train.base_route(p, r, cfg)[0] == "add" for p in tricky) / len(tricky)
    assert abs(habit - cfg.habit_rate) < 0.05
    plain = [p for p in problems if not p["tricky"]]
    wrong = sum(demo_train.base_route(p, r, cfg) != tuple(p["route"]) for p in plain) / len(plain)
    assert 0.5 * cfg.noise_rate < wrong < 3 * cfg.noise_rate
    for prompt, response in _take(demo_train.corpus("reason", 3, cfg, set()), 200):
        q = prompt[len("Question: "): -len("\nAnswer:")]
        route = [_read(q.split(". ")[0], FIRST_WORDS), _read(q.split(". ", 1)[1], SECOND_WORDS)]
        check_solution(response, [int(x) for x in re.findall(r"\d+", response)[:3]], route)


def test_training_corpora_exclude_the_held_out_set():
    held = demo_train.held_out_problems()
    assert len(held) >= 300
    questions = {p["question"] for p in held}
    first = [demo_train.PROMPT_FORMAT.format(problem=q) for q in list(questions)[:50]]
    # a generator that would otherwise emit held-out questions must skip them
    stream = demo_train.corpus("base", demo_train.TEST_SEED, demo_train.SIZES["full"], questions)
    seen = {prompt for prompt, _ in _take(stream, 2000)}
    assert not seen & set(first)
    unfiltered = {demo_train.PROMPT_FORMAT.format(problem=p["question"])
                  for p in demo_task.make_problems(50, demo_train.TEST_SEED)}
    assert unfiltered <= set(demo_train.PROMPT_FORMAT.format(problem=q) for q in questions)


def test_committed_problem_file_matches_generator():
    rows = [json.loads(line) for line in (demo.PROBLEMS_DIR / "demo_test.jsonl").read_text().splitlines()]
    want = [{"id": p["id"], "question": p["question"], "answer": p["answer"]} for p in demo_train.held_out_problems()]
    assert rows == want
    problems = demo.demo_problems(limit=5)
    assert [p.prompt for p in problems] == [r["question"] for r in rows[:5]]
    assert [p.gold for p in problems] == [r["answer"] for r in rows[:5]]


def _take(it, n):
    return [next(it) for _ in range(n)]


# -- training round trip -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    import torch

    out = tmp_path_factory.mktemp("demo_tiny")
    before = torch.get_num_threads()
    report = demo_train.train_demo_pair(out, size="tiny", threads=before + 1)
    # training's thread count is not left behind (it had been: every later test of the worker ran on 2 threads)
    assert report["threads"] == before + 1 and torch.get_num_threads() == before
    return out, report


def test_tiny_training_writes_a_loadable_pair(tiny_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, report = tiny_run
    assert report["loss"]["base_last10"] < report["loss"]["base_first"]
    for side in ("base", "reason"):
        assert (out / side / "model.safetensors").exists() and (out / side / "tokenizer.json").exists()
        tok = AutoTokenizer.from_pretrained(out / side)
        model = AutoModelForCausalLM.from_pretrained(out / side)
        ids = tok("Question: Tom has 12 apples.\nAnswer:", add_special_tokens=False)["input_ids"]
        assert tok.convert_ids_to_tokens(ids).count("1") == 1  # digits are split one by one
        assert tok.decode(ids) == "Question: Tom has 12 apples.\nAnswer:"
        assert tok.eos_token == demo_train.EOS and tok.pad_token == demo_train.EOS
        chat = tok.apply_chat_template([{"role": "user", "content": "Hi?"}], tokenize=False)
        assert chat == "Question: Hi?\nAnswer:"
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits
        assert logits.shape == (1, len(ids), len(tok))
    formats = json.loads((out / "pair.json").read_text())
    assert formats == {"base_format": demo_train.PROMPT_FORMAT, "reason_format": demo_train.PROMPT_FORMAT}


def test_tiny_pair_loads_through_load_pair(tiny_run):
    import core

    out, _ = tiny_run
    pair = demo.demo_pair(device="cpu", demo_dir=out)
    assert isinstance(pair, core.ModelPair)
    ids = pair.prompt_ids("Tom has 3 apples.")
    assert ids["base"] == ids["reason"] == pair.encode("Question: Tom has 3 apples.\nAnswer:")


def test_training_is_reproducible(tiny_run, tmp_path):
    from safetensors.torch import load_file

    out, report = tiny_run
    demo_train.train_demo_pair(tmp_path, size="tiny", threads=report["threads"])
    for side in ("base", "reason"):
        a, b = load_file(out / side / "model.safetensors"), load_file(tmp_path / side / "model.safetensors")
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_unknown_size_is_rejected(tmp_path):
    from core.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="tiny"):
        demo_train.train_demo_pair(tmp_path, size="huge")


# -- the committed pair ------------------------------------------------------------------------
def test_committed_pair_is_small_and_shows_the_effect():
    import core

    files = [p for p in demo.DEMO_DIR.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 12 * 2**20
    pair = demo.demo_pair()
    held = demo_train.held_out_problems(120)
    tricky = [p for p in held if p["tricky"] and p["route"][0] != "add"][:12]
    prompts = [{"id": p["id"], "prompt": p["question"], "gold": p["answer"]} for p in tricky]
    base = core.generate(pair, prompts, core.BaseOnly(), max_new_tokens=80)
    reason = core.generate(pair, prompts, core.ReasonOnly(), max_new_tokens=80)
    base_right = sum(f"\\boxed{{{p['answer']}}}" in t.text for p, t in zip(tricky, base))
    reason_right = sum(f"\\boxed{{{p['answer']}}}" in t.text for p, t in zip(tricky, reason))
    assert base_right <= 3, [t.text for t in base]
    assert reason_right >= 11, [t.text for t in reason]
