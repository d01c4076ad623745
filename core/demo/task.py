"""The demo model organism's task: synthetic two-step word problems whose solution opens with a plan.

Every solution has the same shape: a routine restatement, a short plan that decides the route, and
routine execution that follows the plan:

    The numbers are 3, 4 and 2. First, we multiply, then we subtract. 3 * 4 = 12. 12 - 2 = 10.
    So Tom has 10 now. The answer is \\boxed{10}.

The route (one operation per step) is decided by a cue phrase in the question ("bags of" ->
multiply, "gives away" -> subtract, ...). The arithmetic is kept small (operands and every result in
0..99, exact division) so that tiny models execute it reliably; the difficulty is in the plan.
Everything here is pure and seeded: the same `random.Random` state gives the same problems.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from core.errors import InvalidInputError

OPS: tuple[str, ...] = ("add", "subtract", "multiply", "divide")
SYMBOL = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/"}
MAX_VALUE = 99  # every operand and result stays in 0..MAX_VALUE


@dataclass(frozen=True)
class Cue:
    """A phrasing of one step; `tricky` phrasings are the ones the demo base model habitually misreads."""

    id: str
    op: str
    text: str
    tricky: bool = False


# Step 1 builds the starting amount from a and b. Placeholders: {name} {a} {b} {item}.
FIRST_CUES: tuple[Cue, ...] = (
    Cue("finds", "add", "{name} has {a} {item} and finds {b} more."),
    Cue("gets", "add", "{name} gets {a} {item} from a friend and {b} from a neighbour."),
    Cue("loses", "subtract", "{name} has {a} {item} and loses {b} of them."),
    Cue("burns", "subtract", "{name} bakes {a} {item} and burns {b} of them.", tricky=True),
    Cue("taken", "subtract", "{name} had {a} {item} before {b} of them were taken.", tricky=True),
    Cue("boxes", "multiply", "{name} has {a} boxes with {b} {item} in each box."),
    Cue("bags", "multiply", "{name} buys {a} bags of {b} {item}.", tricky=True),
    Cue("rows", "multiply", "{name} fills {a} rows with {b} {item} per row.", tricky=True),
    Cue("shelves", "multiply", "{name} stacks {a} shelves with {b} {item} on each shelf.", tricky=True),
    Cue("groups", "divide", "{name} puts {a} {item} into groups of {b} and keeps one {item_one} per group."),
    Cue("shares", "divide", "{name} shares {a} {item} equally among {b} friends and keeps one share.", tricky=True),
    Cue("piles", "divide", "{name} splits {a} {item} into {b} equal piles and takes one pile.", tricky=True),
)

# Step 2 changes the amount by c. Placeholders: {pron} {c}.
SECOND_CUES: tuple[Cue, ...] = (
    Cue("finds_more", "add", "Then {pron} finds {c} more."),
    Cue("given", "add", "Later, {pron} is given {c} more."),
    Cue("buys_more", "add", "Then {pron} buys {c} more."),
    Cue("gives_away", "subtract", "Then {pron} gives away {c}."),
    Cue("eats", "subtract", "Then {pron} eats {c}."),
    Cue("sells", "subtract", "Later, {pron} sells {c}."),
    Cue("times", "multiply", "Then {pron} ends up with {c} times as many."),
    Cue("grows", "multiply", "Later, the amount grows {c} times."),
    Cue("bags_split", "divide", "Then {pron} splits them into {c} equal bags and keeps one bag."),
    Cue("shares_fair", "divide", "Later, {pron} shares them fairly with {c} people, {pron} included, and keeps a share."),
)

NAMES: tuple[tuple[str, str], ...] = (
    ("Tom", "he"), ("Ana", "she"), ("Sam", "he"), ("Mia", "she"), ("Leo", "he"), ("Zoe", "she"),
    ("Ben", "he"), ("Ivy", "she"), ("Max", "he"), ("Eva", "she"), ("Ali", "he"), ("Nia", "she"),
)
ITEMS: tuple[tuple[str, str], ...] = (
    ("apples", "apple"), ("pens", "pen"), ("coins", "coin"), ("cards", "card"), ("eggs", "egg"),
    ("books", "book"), ("shells", "shell"), ("stamps", "stamp"), ("beads", "bead"), ("cookies", "cookie"),
)


def apply(op: str, x: int, y: int) -> int | None:
    """x op y, or None when the result is not an integer in 0..MAX_VALUE."""
    if op == "add":
        r = x + y
    elif op == "subtract":
        r = x - y
    elif op == "multiply":
        r = x * y
    elif op == "divide":
        if y == 0 or x % y:
            return None
        r = x // y
    else:
        raise InvalidInputError(f"Unknown op {op!r}; choose one of: {', '.join(OPS)}")
    return r if 0 <= r <= MAX_VALUE else None


def run_route(route: tuple[str, str], numbers: tuple[int, int, int]) -> list[int] | None:
    """Intermediate and final results [r1, r2] of a route, or None if any step leaves 0..MAX_VALUE."""
    a, b, c = numbers
    r1 = apply(route[0], a, b)
    if r1 is None:
        return None
    r2 = apply(route[1], r1, c)
    return None if r2 is None else [r1, r2]


def render_plan(route: tuple[str, str]) -> str:
    """The plan sentence that decides the route, e.g. "First, we multiply, then we subtract."."""
    return f"First, we {route[0]}, then we {route[1]}."


def render_solution(route: tuple[str, str], numbers: tuple[int, int, int], name: str) -> str:
    """The full response (leading space, no end token) for a route; execution follows the route."""
    a, b, c = numbers
    results = run_route(route, numbers)
    if results is None:
        raise InvalidInputError(f"route {route} is not executable on {numbers}")
    r1, r2 = results
    return (
        f" The numbers are {a}, {b} and {c}. {render_plan(route)}"
        f" {a} {SYMBOL[route[0]]} {b} = {r1}. {r1} {SYMBOL[route[1]]} {c} = {r2}."
        f" So {name} has {r2} now. The answer is \\boxed{{{r2}}}."
    )


def _draw_numbers(op1: str, op2: str, rng: random.Random) -> tuple[int, int, int]:
    if op1 == "multiply":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
    elif op1 == "divide":
        b = rng.randint(2, 9)
        a = b * rng.randint(2, 9)
    elif op1 == "subtract":
        a = rng.randint(10, 60)
        b = rng.randint(2, 9)
    else:
        a, b = rng.randint(2, 40), rng.randint(2, 9)
    c = rng.randint(2, 9)
    return a, b, c


def make_problem(rng: random.Random, *, max_tries: int = 1000) -> dict:
    """One problem: {"question", "plan", "solution", "answer", "route", "numbers", "cues", "name", "item",
    "tricky"}.

    Numbers are redrawn until every route of the form (any op, second op) is executable or invalid
    only where arithmetic forbids it, and the correct route stays in 0..MAX_VALUE.
    """
    first = rng.choice(FIRST_CUES)
    second = rng.choice(SECOND_CUES)
    name, pron = rng.choice(NAMES)
    item, item_one = rng.choice(ITEMS)
    route = (first.op, second.op)
    for _ in range(max_tries):
        numbers = _draw_numbers(first.op, second.op, rng)
        # the favourite wrong reading (add at step 1) must also be executable, so that a base model's
        # habitual plan can be carried out faithfully in its training data
        if run_route(route, numbers) is not None and run_route(("add", second.op), numbers) is not None:
            break
    else:  # pragma: no cover - the ranges above always admit solutions
        raise RuntimeError(f"no executable numbers for route {route}")
    a, b, c = numbers
    question = (
        first.text.format(name=name, a=a, b=b, item=item, item_one=item_one)
        + " "
        + second.text.format(pron=pron, c=c)
        + f" How many {item} does {name} have now?"
    )
    answer = run_route(route, numbers)[1]
    return {
        "question": question,
        "plan": render_plan(route),
        "solution": render_solution(route, numbers, name),
        "answer": str(answer),
        "route": list(route),
        "numbers": list(numbers),
        "cues": [first.id, second.id],
        "name": name,
        "item": item,
        "tricky": first.tricky or second.tricky,
    }


def make_problems(n: int, seed: int, exclude: set[str] | None = None) -> list[dict]:
    """`n` problems from `random.Random(seed)`, skipping questions in `exclude`; ids "demo-<seed>-<i>"."""
    rng = random.Random(seed)
    out: list[dict] = []
    seen: set[str] = set(exclude or ())
    while len(out) < n:
        p = make_problem(rng)
        if p["question"] in seen:
            continue
        seen.add(p["question"])
        out.append({"id": f"demo-{seed}-{len(out)}", **p})
    return out


def executable_routes(numbers: tuple[int, int, int], second_op: str) -> list[tuple[str, str]]:
    """Routes (any first op, the given second op) that can be carried out on `numbers`."""
    return [(op, second_op) for op in OPS if run_route((op, second_op), numbers) is not None]
