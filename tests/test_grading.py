"""Tests for core.grading: answer extraction, math-verify checking, garbage, threads, the worker."""

from __future__ import annotations

import signal
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ForkpointError, InvalidInputError
from core.evaluation import grading
from core.evaluation.grading import (
    check_answer,
    extract_answer,
    grade,
    last_boxed,
    normalize_answer,
)

# -- extraction -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{1} then \boxed{2}", "2"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\frac{\sqrt{a^{2}+b^{2}}}{2}} done", r"\frac{\sqrt{a^{2}+b^{2}}}{2}"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces do not count
        (r"\boxed{ 7 }", "7"),
        (r"\boxed {7}", "7"),
        (r"\fbox{9}", "9"),
        (r"the value \boxed 5 here", "5"),
        (r"\boxed{3} and later \boxed{4", "3"),  # a truncated last box falls back to the complete one
        (r"\boxed{", None),
        (r"\boxedx{3}", None),
        ("", None),
        ("no box", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"The answer is 5. But \boxed{6}.", "6"),  # boxed wins over text
        ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
        ("#### 12\nThe answer is 13", "12"),  # GSM8K marker beats phrases
        ("The answer is 12. Next we rest.", "12"),
        ("The answer is 3.5 hours.", "3.5"),  # the unit is dropped
        ("The final answer is $\\frac{1}{2}$. I hope it is correct.", "\\frac{1}{2}"),
        ("Answer: 42\n", "42"),
        ("answer is 1\nthe answer is 2\nanswer: 3", "3"),  # the last one
        ("The answer is 4\nAnswer: \n", "4"),  # an empty capture does not count
        ("The answer is a whole number. It is 9 then.", "9"),  # no expression after the phrase: fallback
        ("x = 3 + 4 = 7", "7"),  # the labelled fallback
        ("", None),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_last_number_fallback_is_labelled_and_can_be_switched_off() -> None:
    from core.evaluation.answers import extract

    assert extract("x = 3 + 4 = 7") == grading.Extraction("7", "last_number")
    assert extract("x = 3 + 4 = 7", last_number=False) == grading.Extraction(None, None)
    assert extract("total 1,250.5 then -3").answer == "-3"
    assert extract("no digits").rule is None
    assert extract("\\boxed{2}").rule == "boxed" and extract("The answer is 2").rule == "phrase"
    assert extract("7. Then we stop.").answer is None  # the final sentence has no number
    assert grade("so 2 + 2 = 4", "4") is True
    assert grade("so 2 + 2 = 4", "4", last_number=False) is False


# A careful grader's verdicts: (response, gold, verdict, rule that extracts the answer).
GRADING_SET = [
    # the cases
    ("The answer is 2, because 2 + 2 = 4.", "2", True, "phrase"),
    ("The answer is 12 km/h.", "12", True, "phrase"),
    ("The answer is 5 m", "5", True, "phrase"),
    (" 138<|im_end|>", "138", True, "last_number"),
    ("So she pays 45 dollars in total.", "45", True, "last_number"),
    # units and trailing words
    ("The answer is 3.5 hours.", "3.5", True, "phrase"),
    ("Final Answer: 7 apples", "7", True, "phrase"),
    ("The answer is 5\\text{ cm}.", "5", True, "phrase"),
    ("The answer is 30°.", "30", True, "phrase"),
    ("The answer is 60 miles per hour, since speed is distance over time.", "60", True, "phrase"),
    ("The answer is 12 km/h.", "13", False, "phrase"),
    ("#### 18 dollars", "18", True, "phrase"),
    # thousands separators
    ("The answer is 1,234.", "1234", True, "phrase"),
    ("#### 1,000", "1000", True, "phrase"),
    ("So the total is 12,500 people.", "12500", True, "last_number"),
    ("\\boxed{1,000}", "1000", True, "boxed"),
    ("The answer is 1,234.", "234", False, "phrase"),
    # fractions
    ("The answer is 3/4 cup.", "\\frac{3}{4}", True, "phrase"),
    ("The answer is \\frac{3}{4} of the pie.", "0.75", True, "phrase"),
    ("\\boxed{\\dfrac{1}{2}}", "1/2", True, "boxed"),
    ("So each friend gets 2/3.", "\\frac23", True, "last_number"),
    ("\\boxed{0.333}", "\\frac13", False, "boxed"),
    # negatives
    ("The answer is -7.", "-7", True, "phrase"),
    ("The answer is \u22125.", "-5", True, "phrase"),
    ("Hence x = -3.5.", "-3.5", True, "last_number"),
    ("\\boxed{5}", "-5", False, "boxed"),
    ("The answer is 7.", "-7", False, "phrase"),
    # LaTeX
    ("The final answer is $\\frac{1}{2}$. I hope it is correct.", "0.5", True, "phrase"),
    ("The answer is \\(\\sqrt{2}\\).", "\\sqrt2", True, "phrase"),
    ("The answer is $3x+1$.", "3x+1", True, "phrase"),
    ("The answer is 2\\pi.", "2\\pi", True, "phrase"),
    ("The answer is x = 5.", "5", True, "phrase"),
    ("The answer is $$\\frac{\\sqrt{3}}{2}$$", "\\frac{\\sqrt{3}}{2}", True, "phrase"),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", True, "boxed"),
    ("The answer is (1, 2).", "(1,2)", True, "phrase"),
    ("\\boxed{\\{1, 2\\}}", "\\{2, 1\\}", True, "boxed"),
    ("The answer is $\\frac{2}{3}$.", "\\frac{3}{4}", False, "phrase"),
    # currency
    ("The answer is $45.00.", "45", True, "phrase"),
    ("The answer is \\$18.", "18", True, "phrase"),
    ("So she pays $45.00 in total.", "45", True, "last_number"),
    ("Answer: $12 per ticket", "12", True, "phrase"),
    ("The answer is $45.50.", "45", False, "phrase"),
    # percentages
    ("The answer is 25%.", "25", True, "phrase"),
    ("The answer is 25\\%.", "25", True, "phrase"),
    ("So the discount is 40%.", "40", True, "last_number"),
    ("The answer is 25%.", "30", False, "phrase"),
    # several boxed answers: the last complete one
    ("\\boxed{1} then \\boxed{2}", "2", True, "boxed"),
    ("\\boxed{1} then \\boxed{2}", "1", False, "boxed"),
    ("First \\boxed{3}, then corrected: \\boxed{4}.", "4", True, "boxed"),
    ("\\boxed{3} and later \\boxed{4", "3", True, "boxed"),  # a truncated box does not count
    ("The answer is 5. But \\boxed{6}.", "6", True, "boxed"),
    # thinking parts: only the text after the closing tag is read
    ("<think>\nmaybe \\boxed{3}? The answer is 3\n</think>\n\nSo \\boxed{4}.<|im_end|>", "4", True, "boxed"),
    ("<think>\nmaybe \\boxed{3}?\n</think>\n\nSo \\boxed{4}.", "3", False, "boxed"),
    ("<think>\nThe answer is 3\n</think>\n\nI am not sure.", "3", False, None),
    ("<think>\nlong thought, the answer is 9", "9", True, "phrase"),  # never closed: all of it is read
    ("<think>I guess 5</think>\nThe total is 6.", "6", True, "last_number"),
    # special tokens
    ("The answer is: 10<|im_end|>", "10", True, "phrase"),
    ("so\n#### 138<|endoftext|>", "138", True, "phrase"),
    ("The answer is 7.<｜end▁of▁sentence｜>", "7", True, "phrase"),
    ("Answer: 12</s>", "12", True, "phrase"),
    ("The answer is 5<|eot_id|><|end_of_text|>", "5", True, "phrase"),
    ("42<eos>", "42", True, "last_number"),
    # phrases
    ("The answer is: **12**.", "12", True, "phrase"),
    ("answer is 1\nthe answer is 2\nanswer: 3", "3", True, "phrase"),
    ("#### 12\nThe answer is 13", "12", True, "phrase"),
    ("The final answer is 8 because 4 + 4 = 8.", "8", True, "phrase"),
    ("Therefore, the final answer is -2.", "-2", True, "phrase"),
    # nothing extracted: ungraded (and counted wrong by accuracy)
    ("I do not know.", "3", False, None),
    ("The answer is a whole number.", "3", False, None),
    ("7. Then we stop.", "7", False, None),
    ("", "1", False, None),
]


@pytest.mark.parametrize("response, gold, verdict, rule", GRADING_SET)
def test_grading_set(response: str, gold: str, verdict: bool, rule: str | None) -> None:
    from core.evaluation.answers import extract

    assert extract(response).rule == rule
    assert grade(response, gold) is verdict


def test_grading_set_is_large_and_covers_every_rule() -> None:
    assert len(GRADING_SET) >= 60
    assert {r for *_, r in GRADING_SET} == {"boxed", "phrase", "last_number", None}
    assert {v for _, _, v, _ in GRADING_SET} == {True, False}


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("$5$", "5"),
        ("\\(x+1\\)", "x+1"),
        ("**12**.", "12"),
        ("18 dollars", "18"),
        ("$18", "18"),
        ("1,000 apples", "1,000"),
        ("5, which is odd", "5"),
        ("\u22125", "-5"),
        ("2 pi", "2 pi"),  # not a unit: left for math-verify
        ("\\frac{1}{2}", "\\frac{1}{2}"),
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


# -- checking -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, gold",
    [
        (r"\boxed{\frac{1}{2}}", "0.5"),
        (r"\boxed{0.5}", r"\frac{1}{2}"),
        (r"\boxed{1/2}", r"\frac12"),
        (r"\boxed{\dfrac{1}{2}}", "1/2"),
        (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}"),
        (r"\boxed{1,000}", "1000"),
        (r"\boxed{x = 3}", "3"),
        (r"\boxed{42.0}", "42"),
        (r"\boxed{\{1, 2\}}", r"\{2, 1\}"),
        ("The answer is 18 dollars.", "18"),
        ("The answer is $18.", "18"),
        ("#### 72", "72"),
        ("The answer is \u22125.", "-5"),
    ],
)
def test_equivalent_answers_are_right(response: str, gold: str) -> None:
    assert grade(response, gold) is True


@pytest.mark.parametrize(
    "response, gold",
    [
        (r"\boxed{0.333}", r"\frac13"),
        (r"\boxed{5}", "-5"),
        (r"\boxed{42.5}", "42"),
        (r"\boxed{\frac{1}{0}}", "1"),
        (r"\boxed{hello}", "42"),
        (r"\boxed{}", "1"),
        ("no answer here 42", "41"),
        ("The answer is 1} \\boxed{42", "42"),  # cannot escape the \boxed{} wrapper
    ],
)
def test_wrong_or_unparseable_answers_are_wrong(response: str, gold: str) -> None:
    assert grade(response, gold) is False


@pytest.mark.parametrize("answer", ["1} \\boxed{42", "42} \\boxed{1", "42}{", "{42"])
def test_unbalanced_braces_cannot_escape_the_wrapper(answer: str) -> None:
    assert check_answer(answer, "42") is False


def test_gold_and_timeout_are_validated() -> None:
    with pytest.raises(InvalidInputError, match="gold"):
        grade(r"\boxed{1}", None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="gold"):
        grade(r"\boxed{1}", "  ")
    with pytest.raises(InvalidInputError, match="timeout_s"):
        grade(r"\boxed{1}", "1", timeout_s=0)
    assert check_answer(None, "1") is False


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80))
def test_garbage_never_raises(text: str) -> None:
    assert grade(text, "7", timeout_s=1) in (True, False)
    assert grade("\\boxed{" + text + "}", "7", timeout_s=1) in (True, False)


@settings(max_examples=40, deadline=None)
@given(st.integers(-10**6, 10**6), st.integers(1, 50))
def test_fractions_against_exact_arithmetic(num: int, den: int) -> None:
    from fractions import Fraction

    value = Fraction(num, den)
    gold = str(value.numerator) if value.denominator == 1 else f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
    assert grade(f"\\boxed{{\\frac{{{num}}}{{{den}}}}}", gold) is True
    assert grade(f"\\boxed{{\\frac{{{num + 1}}}{{{den}}}}}", gold) is False


def test_unicode_answers() -> None:
    assert grade("Réponse finale : \\boxed{12} ✓", "12") is True
    assert grade("The answer is ٤٢", "42") is False  # not crashing is the point
    assert grade("\\boxed{½}", "0.5") in (True, False)
    assert grade("\\boxed{\U0001F600}", "1") is False


def test_pathological_answer_times_out_on_main_thread() -> None:
    start = time.monotonic()
    assert grade(r"\boxed{9^{9^{9}}}", "5", timeout_s=1) is False
    assert time.monotonic() - start < 10


def test_outer_interval_timer_survives_grading() -> None:
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    try:
        assert grade(r"\boxed{2}", "2") is True
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 0 < left <= 30.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not fired


# -- off the main thread ----------------------------------------------------------------------------


def run_in_thread(fn, *args, **kwargs):
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            box["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join(timeout=120)
    assert not t.is_alive()
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_grading_from_threads_matches_main_thread() -> None:
    cases = [(r"\boxed{\frac{1}{2}}", "0.5"), (r"\boxed{3}", "4"), ("#### 1,000", "1000"), ("junk", "1")]
    expected = [grade(r, g) for r, g in cases]
    assert expected == [True, False, True, False]
    assert run_in_thread(lambda: [grade(r, g) for r, g in cases]) == expected
    assert grading._WORKER.proc is not None and grading._WORKER.proc.poll() is None  # it went through the worker
    # several threads at once share the worker
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(grade(r"\boxed{0.25}", r"\frac14"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == [True] * 4


def test_pathological_answer_in_a_thread_is_bounded() -> None:
    start = time.monotonic()
    assert run_in_thread(grade, r"\boxed{9^{9^{9}}}", "5", timeout_s=1) is False
    assert time.monotonic() - start < 30
    assert run_in_thread(grade, r"\boxed{5}", "5") is True  # the worker still answers


def test_worker_is_killed_when_it_overruns() -> None:
    hang = "import sys, time; print('{\"ready\": true}', flush=True); sys.stdin.readline(); time.sleep(60)"
    worker = grading._Worker([sys.executable, "-c", hang], deadline_factor=0, deadline_slack_s=0.5)
    try:
        start = time.monotonic()
        assert worker.check("1", "1", 1) is False
        assert time.monotonic() - start < 5
        assert worker.proc is None
    finally:
        worker.stop()


def test_worker_that_cannot_start_says_why() -> None:
    worker = grading._Worker([sys.executable, "-c", "import sys; sys.stderr.write('no math here'); sys.exit(3)"])
    with pytest.raises(ForkpointError, match="no math here"):
        worker.check("1", "1", 1)


# -- special tokens, chains of thought, and the one grade-then-store path ------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is: 10<|im_end|>", "10"),
        ("so\n#### 138<|endoftext|>", "138"),
        ("The answer is 7.<｜end▁of▁sentence｜>", "7"),
        ("Answer: 12</s>", "12"),
        ("The answer is 5<|eot_id|><|end_of_text|>", "5"),
        ("<think>\nmaybe \\boxed{3}? The answer is 3\n</think>\n\nSo \\boxed{4}.<|im_end|>", "4"),
        ("<think>\nThe answer is 3\n</think>\n\nI am not sure.", None),  # the answer part has none
        ("<think>\nlong thought, the answer is 9", "9"),  # never closed: the whole text is read
    ],
)
def test_special_tokens_and_think_blocks(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_answer_part_and_strip_special() -> None:
    assert grading.answer_part("a</think>b</think>c") == "c"
    assert grading.answer_part("no tags") == "no tags"
    assert grading.strip_special("x<|im_end|>y</s><eos>") == "xy"
    assert grading.strip_special("a < b and c > d, |x| = 1") == "a < b and c > d, |x| = 1"  # maths untouched


class _T:
    """The parts of a Trace that grading reads."""

    def __init__(self, text, gold, key="k1", correct=None, grader=None, **meta):
        self.text, self.key = text, key
        self.meta = {"problem": {"gold": gold}, "correct": correct, "answer": None, "grader": grader, **meta}

    def __len__(self):
        return len(self.text.split())


class _Store:
    def __init__(self, stored=()):
        self.keys, self.calls = set(stored), []

    def __contains__(self, key):
        return key in self.keys

    def put(self, trace, overwrite=False):
        self.calls.append((trace.key, overwrite))
        self.keys.add(trace.key)


def test_grade_trace_rules() -> None:
    t = _T("The answer is 138<|endoftext|>", 138)  # gold stringified
    assert grading.grade_trace(t) is True and t.meta["answer"] == "138"
    t.text = "The answer is 1"
    assert grading.grade_trace(t) is True  # graded once: not re-graded
    for gold in (None, "", "  "):
        u = _T("The answer is 1", gold)
        assert grading.grade_trace(u) is None and u.meta["answer"] is None
    assert grading.gold_of(_T("", 0)) == "0"


def test_graded_put_writes_new_and_rewrites_only_when_newly_graded() -> None:
    store = _Store()
    grading.graded_put(store, _T("\\boxed{2}", "2", key="new"))
    assert store.calls == [("new", False)]
    store = _Store(stored={"old"})
    grading.graded_put(store, _T("\\boxed{2}", "2", key="old"))  # stored before, ungraded: regraded, rewritten
    assert store.calls == [("old", True)]
    # already graded by this grader: untouched
    grading.graded_put(store, _T("\\boxed{2}", "2", key="old", correct=True, grader=grading.GRADER))
    grading.graded_put(store, _T("\\boxed{2}", None, key="old"))  # no gold: nothing to add
    assert store.calls == [("old", True)]
    # graded by an older rule set: graded again and rewritten
    old = _T("So she pays 45 dollars.", "45", key="old", correct=False, answer=None)
    grading.graded_put(store, old)
    assert store.calls == [("old", True), ("old", True)]
    assert old.meta["correct"] is True and old.meta["answer_rule"] == "last_number"
    assert grading.graded_put(None, _T("\\boxed{2}", "3")).meta["correct"] is False


def test_grade_trace_records_the_rule_and_skips_the_fallback_on_a_cut_response() -> None:
    done = _T("So she pays 45 dollars.", "45", sampling={"max_new_tokens": 64}, kind="generate")
    assert grading.grade_trace(done) is True
    assert (done.meta["answer"], done.meta["answer_rule"], done.meta["grader"]) == ("45", "last_number", grading.GRADER)
    cut = _T("So she pays 45 dollars", "45", sampling={"max_new_tokens": 5}, kind="generate")  # 5 words: the limit
    assert grading.was_cut(cut)
    assert grading.grade_trace(cut) is False and cut.meta["answer_rule"] is None and grading.is_ungraded(cut.meta)
    boxed_cut = _T("so \\boxed{45} and", "45", sampling={"max_new_tokens": 4}, kind="generate")
    assert grading.grade_trace(boxed_cut) is True and boxed_cut.meta["answer_rule"] == "boxed"
    room = _T("it is 45", "45", sampling={"max_new_tokens": 64}, context_limit={"max_response_tokens": 3})
    assert grading.was_cut(room)
    scored = _T("it is 45", "45", sampling=None, kind="score")
    assert not grading.was_cut(scored) and grading.grade_trace(scored) is True
