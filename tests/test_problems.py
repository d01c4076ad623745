"""Tests for core.problems: JSONL / JSON / CSV problem sets, field detection, bad rows, bundled set."""

from __future__ import annotations

import ast
import dataclasses
import json
import logging
import operator
import re
from pathlib import Path

import pytest

from core.errors import InvalidInputError
from core.evaluation.grading import grade
from core.evaluation.problems import Problem, load_problems

BUNDLED = Path(__file__).resolve().parent.parent / "assets" / "problems" / "wordproblems.jsonl"


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def test_gsm8k_style(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "gsm.jsonl", [
        {"question": "Ann has 2 apples and buys 3. How many?", "answer": "She has 2 + 3 = 5.\n#### 5"},
        {"question": "Q2", "answer": "Big: 1,000 #### 1,000"},
    ])
    p1, p2 = load_problems(path)
    assert p1 == Problem("gsm-0", "Ann has 2 apples and buys 3. How many?", "5", "She has 2 + 3 = 5.", {"line": 1})
    assert (p2.id, p2.gold, p2.solution) == ("gsm-1", "1,000", "Big: 1,000")


def test_math_style_and_extra_fields(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "math.jsonl", [
        {"problem": "Compute $1/2+1/4$.", "answer": "\\frac{3}{4}", "solution": "Sum is \\boxed{\\frac34}.",
         "level": "Level 1", "unique_id": "test/algebra/1.json"},
        {"problem": "No answer field.", "solution": "So \\boxed{\\{1, 2\\}} is it.", "unique_id": "x2"},
        {"problem": "No gold at all.", "unique_id": "x3"},
        {"problem": "Numeric gold.", "answer": 7, "unique_id": 4},
    ])
    a, b, c, d = load_problems(path)
    assert (a.id, a.prompt, a.gold) == ("test/algebra/1.json", "Compute $1/2+1/4$.", "\\frac{3}{4}")
    assert a.solution == "Sum is \\boxed{\\frac34}."
    assert a.meta == {"level": "Level 1", "line": 1}
    assert (b.gold, c.gold, c.solution) == ("\\{1, 2\\}", None, None)
    assert (d.id, d.gold) == ("4", "7")


def test_explicit_fields(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "x.jsonl", [{"q": "What?", "a": "42", "key": "k1", "question": "decoy"}])
    (p,) = load_problems(path, question_field="q", answer_field="a", id_field="key")
    assert (p.id, p.prompt, p.gold) == ("k1", "What?", "42")
    assert p.meta == {"question": "decoy", "line": 1}
    with pytest.raises(InvalidInputError, match=r"x\.jsonl:1: no question field 'nope'; fields are: q, a, key"):
        load_problems(path, question_field="nope")


def test_csv(tmp_path: Path) -> None:
    path = tmp_path / "set.csv"
    path.write_text(
        'question,answer,source\n"Two, three?","3 #### 3",hand\n"multi\nline","x = 2",hand\n', encoding="utf-8"
    )
    p1, p2 = load_problems(path)
    assert (p1.id, p1.prompt, p1.gold, p1.solution) == ("set-0", "Two, three?", "3", "3")
    assert p1.meta == {"source": "hand", "line": 2}
    assert (p2.prompt, p2.gold, p2.meta["line"]) == ("multi\nline", "x = 2", 4)


def test_csv_bad_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("question,answer\nok,1\ntoo,many,cells\n", encoding="utf-8")
    with pytest.raises(InvalidInputError, match=r"bad\.csv:3: row has more cells"):
        load_problems(path)
    assert [p.prompt for p in load_problems(path, skip_bad=True)] == ["ok"]



def test_csv_unclosed_quote_is_refused_not_merged(tmp_path: Path) -> None:
    """A quote left open swallowed the next row (c2's prompt was "unterminated,5\nc3,..."): the problem loader
    now reads CSV as `forkpoint import` does (core.io.foreign.csv_rows) and refuses, or skips, the merged row."""
    path = tmp_path / "p.csv"
    path.write_text('id,question,answer\nc1,"What is 2+2?",4\nc2,"unterminated,5\nc3,What is 3+3?,6\n')
    with pytest.raises(InvalidInputError) as err:
        load_problems(path)
    assert str(err.value) == (f"{path}:3: a quote opened on line 3 is never closed: lines 3-4 were read as one row "
                              "(close the quote)")
    assert [p.id for p in load_problems(path, skip_bad=True)] == ["c1"]
    path.write_text('question,answer\n"Two, three?",3\nshort\n\n"multi\nline",4\n')  # a short row lacks its answer
    assert [(p.prompt, p.gold, p.meta["line"]) for p in load_problems(path)] == [
        ("Two, three?", "3", 2), ("short", None, 3), ("multi\nline", "4", 6)]
    path.write_text('"question,answer\nx,1\n')
    with pytest.raises(InvalidInputError, match="header row opens a quote that is never closed"):
        load_problems(path, skip_bad=True)

def test_json_list(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text(json.dumps([{"question": "A", "answer": "1"}, {"question": "B"}]), encoding="utf-8")
    assert [(p.id, p.gold) for p in load_problems(path)] == [("list-0", "1"), ("list-1", None)]
    path.write_text('{"question": "A"}', encoding="utf-8")
    with pytest.raises(InvalidInputError, match="list of objects"):
        load_problems(path)


@pytest.mark.parametrize(
    "row, problem",
    [
        ("{broken", "not valid JSON"),
        ("[1, 2]", "expected an object"),
        ('{"text": "hi"}', "no question field"),
        ('{"question": "   "}', "empty question"),
    ],
)
def test_bad_lines_name_their_line(tmp_path: Path, row: str, problem: str, caplog) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"question": "fine"}, "", row, {"question": "also fine"}])
    with pytest.raises(InvalidInputError) as err:
        load_problems(path)
    assert "p.jsonl:3: " in str(err.value) and problem in str(err.value)
    with caplog.at_level(logging.WARNING, logger="core.evaluation.problems"):
        got = load_problems(path, skip_bad=True)
    assert [p.prompt for p in got] == ["fine", "also fine"]
    assert [p.id for p in got] == ["p-0", "p-2"]  # ids stay tied to the row index past a bad row
    assert "p.jsonl:3" in caplog.text


def test_no_question_field_says_what_to_do_in_the_cli_and_in_python(tmp_path: Path) -> None:
    """The CLI has no --question-field: the message names the accepted names to rename to, and the API keyword."""
    path = write_jsonl(tmp_path / "q.jsonl", [{"text": "hi", "answer": "1"}])
    with pytest.raises(InvalidInputError) as err:
        load_problems(path)
    assert str(err.value) == (f"{path}:1: no question field (tried question, problem, prompt, input, query); fields "
                              "are: text, answer; rename the question's field to one of the names tried (in Python, "
                              "load_problems(..., question_field=NAME) reads another)")


def test_duplicate_ids(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "question": "1"}, {"id": "a", "question": "2"}])
    with pytest.raises(InvalidInputError, match=r"d\.jsonl:2: duplicate id 'a' \(first on line 1\)"):
        load_problems(path)


def test_limit_and_bad_arguments(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "n.jsonl", [{"question": str(i)} for i in range(5)] + ["{bad"])
    assert [p.prompt for p in load_problems(path, limit=2)] == ["0", "1"]  # stops before the bad line
    assert load_problems(path, limit=0) == []
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidInputError, match="limit"):
            load_problems(path, limit=bad)
    with pytest.raises(InvalidInputError, match="unknown problem file type"):
        load_problems(tmp_path / "x.txt")
    with pytest.raises(InvalidInputError, match="does not exist"):
        load_problems(tmp_path / "missing.jsonl")


def test_unicode_and_bom(tmp_path: Path) -> None:
    path = tmp_path / "u.jsonl"
    row = json.dumps({"question": "Combien font 2 + 2 ? ✓", "answer": "… #### 4"}, ensure_ascii=False)
    path.write_text("\ufeff" + row + "\n", encoding="utf-8")
    (p,) = load_problems(path)
    assert (p.prompt, p.gold, p.solution) == ("Combien font 2 + 2 ? ✓", "4", "…")


def test_problem_is_frozen() -> None:
    p = Problem("a", "b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.gold = "x"  # type: ignore[misc]
    assert (p.gold, p.solution, p.meta) == (None, None, {})


# -- the bundled set -------------------------------------------------------------------------------

STEP = r"((?:\d[\d.]*|[()])(?:[\d.\s()+\-*/])*[+\-*/](?:[\d.\s()+\-*/])*) = (\d+(?:\.\d+)?)"
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def arithmetic(expr: str) -> float:
    """Evaluate + - * / and parentheses over numbers only."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"not arithmetic: {expr!r}")

    return ev(ast.parse(expr, mode="eval").body)


def test_bundled_word_problems() -> None:
    problems = load_problems(BUNDLED)
    assert len(problems) >= 30
    assert len({p.id for p in problems}) == len(problems)
    for p in problems:
        assert re.fullmatch(r"-?\d+(\.\d+)?", p.gold), (p.id, p.gold)
        assert p.prompt.endswith("?") and p.solution
        # every "expression = value" step in the worked solution is right, and the last one is the gold
        steps = re.findall(STEP, p.solution)
        assert steps, p.id
        for expr, value in steps:
            assert arithmetic(expr) == pytest.approx(float(value)), (p.id, expr, value)
        assert float(steps[-1][1]) == float(p.gold), p.id
        # and the grader accepts the gold in the forms a model would write it
        assert grade(f"{p.solution} The answer is \\boxed{{{p.gold}}}.", p.gold)


# -- sources: hub datasets through `datasets`, benchmark short names ------------------------------------

from core.evaluation import sources  # noqa: E402

GSM_ROWS = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
            {"question": "Ann has 10 pens and loses 1. How many?", "answer": "10 - 1 = 9\n#### 9"}]
MATH_ROWS = [{"problem": "Compute $1/2 + 1/4$.", "solution": "It is $\\boxed{\\frac{3}{4}}$.", "answer": "\\frac{3}{4}",
              "unique_id": "test/algebra/1.json", "level": 2}]
AIME_ROWS = [{"ID": "2024-I-1", "Problem": "Find the remainder ...", "Answer": 204, "Solution": "... so 204."}]


def _json_dir(root, name, rows, split="test"):
    folder = root / name
    folder.mkdir()
    (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_hub_sources_go_through_datasets_with_field_mapping(tmp_path, monkeypatch):
    import datasets

    calls = []
    real = datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append((a, k)) or real(*a, **k))
    gsm = sources.load_source(f"hf:{_json_dir(tmp_path, 'gsm', GSM_ROWS)}")
    assert [(p.gold, p.solution) for p in gsm] == [("7", "3 + 4 = 7"), ("9", "10 - 1 = 9")]
    assert gsm[0].id == "gsm-0" and gsm[0].prompt == GSM_ROWS[0]["question"]
    math = sources.load_source(f"hf:{_json_dir(tmp_path, 'math', MATH_ROWS)}::test")
    assert math[0].gold == "\\frac{3}{4}" and math[0].id == "test/algebra/1.json" and math[0].meta["level"] == 2
    aime = sources.load_source(f"hf:{_json_dir(tmp_path, 'aime', AIME_ROWS, split='train')}")
    assert (aime[0].id, aime[0].gold, aime[0].prompt) == ("2024-I-1", "204", "Find the remainder ...")
    assert len(calls) == 3 and calls[1][1]["split"] == "test"  # the same code path a hub id takes


def test_saved_datasets_splits_and_limits(tmp_path):
    import datasets

    ds = datasets.DatasetDict({"train": datasets.Dataset.from_list(GSM_ROWS[:1]),
                               "test": datasets.Dataset.from_list(GSM_ROWS)})
    ds.save_to_disk(str(tmp_path / "saved"))
    assert [p.gold for p in sources.load_source(f"hf:{tmp_path / 'saved'}")] == ["7", "9"]  # test preferred
    assert [p.gold for p in sources.load_source(f"hf:{tmp_path / 'saved'}::train")] == ["7"]
    assert len(sources.load_source(f"hf:{tmp_path / 'saved'}", limit=1)) == 1
    with pytest.raises(InvalidInputError, match="no split 'dev'; choose one of: train, test"):
        sources.load_source(f"hf:{tmp_path / 'saved'}::dev")


def test_hub_source_offline_is_a_clear_message(tmp_path, monkeypatch):
    import datasets
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    with pytest.raises(InvalidInputError) as err:
        sources.load_source("hf:forkpoint-tests/no-such-dataset:main:test")
    message = str(err.value)
    assert "forkpoint-tests/no-such-dataset" in message and "offline" in message.lower()
    assert "local .jsonl" in message


def test_source_names_and_errors(tmp_path):
    assert sources.parse_hf("hf:openai/gsm8k:main:test") == ("openai/gsm8k", "main", "test")
    assert sources.parse_hf("hf:HuggingFaceH4/MATH-500::test") == ("HuggingFaceH4/MATH-500", None, "test")
    assert sources.BENCHMARKS["gsm8k"] == "hf:openai/gsm8k:main:test"
    with pytest.raises(InvalidInputError, match="hf:<dataset id>"):
        sources.parse_hf("hf:a:b:c:d")
    with pytest.raises(InvalidInputError, match="gsm8k, math500"):
        sources.load_source("gsm9k")
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"question": "q?", "answer": "1"}) + "\n")
    named = sources.load_benchmarks([f"easy={path}"])
    assert list(named) == ["easy"] and named["easy"][0].gold == "1"
    assert list(sources.load_benchmarks([str(path)])) == ["mine"]
    with pytest.raises(InvalidInputError, match="given twice"):
        sources.load_benchmarks([str(path), str(path)])
