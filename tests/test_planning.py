"""Tests for core.annotate.planning: lexicon loading, word tags, word -> token mapping, think/answer segments."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import spacy
from hypothesis import given, settings
from hypothesis import strategies as st
from spacy.lookups import Lookups

from core.annotate import planning, tag_layer
from core.annotate.planning import (
    CATEGORIES,
    PlanningTagger,
    annotate_tags,
    load_lexicon,
    segment_tokens,
    tag_planning,
    tag_tokens,
    words_to_tokens,
)
from core.errors import InvalidInputError
from core.scoring.registry import METRICS
from core.trace import Trace


@pytest.fixture(scope="module")
def tagger() -> PlanningTagger:
    return PlanningTagger("blank:en")


def word_tags(tagger: PlanningTagger, text: str) -> list[tuple[str, str]]:
    return [(text[s:e], c) for s, e, c in tagger.tag_text(text)]


def make_trace(tokens: list[str]) -> Trace:
    n = len(tokens)
    zeros = np.zeros((n, 2))
    return Trace(
        token_ids=np.arange(n),
        tokens=tokens,
        prompt_ids={"base": [1], "reason": [1]},
        metrics={m: np.zeros(n) for m in METRICS},
        topk={"base": (zeros.astype(np.int64), zeros), "reason": (zeros.astype(np.int64), zeros)},
        source=["base"] * n,
    )


# -- words ---------------------------------------------------------------------------------------


def test_categories_constant() -> None:
    assert CATEGORIES == ("plan", "reflect", "verify", "conclude", "execute")
    assert planning.PLANNING_CATEGORIES == CATEGORIES[:-1]


def test_blank_pipeline_is_reported(tagger: PlanningTagger) -> None:
    assert tagger.pipeline_name == "blank:en"
    info = tagger.describe()
    assert info["pipeline"] == "blank:en" and len(info["lexicon_sha256"]) == 64
    assert info["skipped_patterns"] > 0  # the default lexicon's LEMMA patterns need a trained pipeline


def test_default_pipeline_falls_back_to_blank_without_trained_model() -> None:
    if spacy.util.is_package("en_core_web_sm"):
        pytest.skip("en_core_web_sm is installed here")
    assert PlanningTagger().pipeline_name == "blank:en"


def test_each_category_on_hand_labelled_text(tagger: PlanningTagger) -> None:
    text = (
        "Hmm. But wait, we need to double-check. So 5. however, but no. Therefore x. "
        "Let me substitute back.\n\nBut first, to find x, consider step 1."
    )
    tagged = word_tags(tagger, text)
    assert [c for _, c in tagged] == [
        "reflect", "execute",  # Hmm .
        "reflect", "reflect", "execute", "plan", "plan", "plan", "verify", "verify", "verify", "execute",
        "conclude", "execute", "execute",  # So 5 .  (sentence-initial "So")
        "reflect", "execute", "execute", "execute", "execute",  # however , but no .  (mid-sentence but)
        "conclude", "execute",  # Therefore x.
        "plan", "plan", "verify", "verify", "execute",  # Let me substitute back .
        "reflect", "execute", "execute", "plan", "plan", "execute", "execute", "plan", "plan", "execute",
        "execute",  # But first , to find x , consider step 1 .
    ]
    assert [w for w, _ in tagged][:3] == ["Hmm", ".", "But"]


def test_demo_response(tagger: PlanningTagger) -> None:
    text = (
        " The numbers are 3, 4 and 2. First, we multiply, then we subtract. 3 * 4 = 12. 12 - 2 = 10."
        " The answer is 10."
    )
    tags = {w: c for w, c in word_tags(tagger, text) if c != "execute"}
    assert tags == {"First": "plan", "multiply": "plan", "subtract": "plan", "The": "conclude",
                    "answer": "conclude", "is": "conclude"}
    # the first "The" (restating the numbers) is not a conclusion
    assert word_tags(tagger, text)[0] == ("The", "execute")


def test_empty_and_whitespace_text(tagger: PlanningTagger) -> None:
    assert tagger.tag_text("") == []
    assert tagger.tag_text(" \n\t ") == []
    assert tag_tokens([], tagger) == []
    assert tag_tokens(["  ", "\n", ""], tagger) == ["execute"] * 3


def test_offsets_index_the_original_text(tagger: PlanningTagger) -> None:
    text = "\n\n  Wait,  é✓ check…  Thus"
    for s, e, _ in tagger.tag_text(text):
        assert text[s:e].strip() == text[s:e] != ""
    assert word_tags(tagger, text)[0] == ("Wait", "reflect")
    assert word_tags(tagger, text)[-1] == ("Thus", "conclude")


def test_overlaps_merge_within_a_category_and_longest_wins_across(tagger: PlanningTagger, tmp_path) -> None:
    # "so the answer" and "the answer is" overlap and are both conclude: they merge
    assert [c for _, c in word_tags(tagger, "So the answer is 4")] == ["conclude"] * 4 + ["execute"]
    path = write(tmp_path, {"categories": {"plan": ["let me", "a b"], "verify": ["me check"], "reflect": ["b c d"]}})
    t = PlanningTagger("blank:en", lexicon=path)
    # equal length (2): the earlier match wins; "b c d" (3) beats "a b" (2)
    assert [c for _, c in word_tags(t, "let me check")] == ["plan", "plan", "execute"]
    assert [c for _, c in word_tags(t, "a b c d")] == ["execute", "reflect", "reflect", "reflect"]


# -- words -> tokens -------------------------------------------------------------------------------


def test_bpe_like_split(tagger: PlanningTagger) -> None:
    tokens = [" Wa", "it", ",", " l", "et", "'s", " ch", "eck", " ✓", "é"]
    assert tag_tokens(tokens, tagger) == [
        "reflect", "reflect", "execute", "plan", "plan", "plan", "verify", "verify", "execute", "execute",
    ]


def test_token_spanning_words_takes_first_non_execute(tagger: PlanningTagger) -> None:
    tokens = ["x = 3. Wait", ", then", " check. Thus"]
    assert tag_tokens(tokens, tagger) == ["reflect", "execute", "verify"]


def test_words_to_tokens_hand_values() -> None:
    # text "abc first. ok"
    words = [(0, 3, "execute"), (4, 9, "plan"), (9, 10, "execute"), (11, 13, "verify")]
    text_tokens = ["ab", "c f", "irst", ".", " ", "ok", ""]
    assert words_to_tokens(words, text_tokens) == ["execute", "plan", "plan", "execute", "execute", "verify", "execute"]


def brute_force(words: list[tuple[int, int, str]], tokens: list[str]) -> list[str]:
    """Reference: per character, which word covers it; a token's words in order; first non-execute."""
    owner = {}
    for k, (s, e, c) in enumerate(words):
        for i in range(s, e):
            owner[i] = (k, c)
    out, pos = [], 0
    for tok in tokens:
        chars = range(pos, pos + max(len(tok), 1))  # an empty token goes with the next character
        cats = [owner[i] for i in chars if i in owner]
        ordered = [c for _, c in sorted(set(cats))]
        out.append(next((c for c in ordered if c != "execute"), "execute"))
        pos += len(tok)
    return out


PIECES = ["Wait", "wait", ",", " ", "  ", "\n", "let's", "check", "First", "3", "=", "12", ".", "é", "✓",
          "Therefore", "we need to", "x", "But", "hmm", "double-check", "<think>", "</think>", "the answer is"]


@settings(max_examples=120, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=25), st.data())
def test_mapping_matches_brute_force(pieces: list[str], data: st.DataObject) -> None:
    text = "".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=30)))
    bounds = [0, *cuts, len(text)]
    tokens = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    tagger = PlanningTagger("blank:en")
    words = tagger.tag_text(text)
    got = tagger.tag_tokens(tokens)
    assert got == brute_force(words, tokens)
    assert len(got) == len(tokens) and set(got) <= set(CATEGORIES)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=20))
def test_word_level_tokens_reproduce_word_tags(pieces: list[str]) -> None:
    tagger = PlanningTagger("blank:en")
    text = "".join(pieces)
    words = tagger.tag_text(text)
    # tokens cut exactly at word boundaries (gaps become their own tokens)
    tokens, pos, expected = [], 0, []
    for s, e, c in words:
        if s > pos:
            tokens.append(text[pos:s])
            expected.append("execute")
        tokens.append(text[s:e])
        expected.append(c)
        pos = e
    if pos < len(text):
        tokens.append(text[pos:])
        expected.append("execute")
    assert tagger.tag_tokens(tokens) == expected


def test_tag_planning_and_annotate(tagger: PlanningTagger) -> None:
    tokens = ["<think>", "\n", "Wait", ",", " check", "</think>", " The", " answer", " is", " 4"]
    trace = make_trace(tokens)
    assert tag_planning(trace, tagger) == tag_tokens(tokens, tagger)
    out = annotate_tags(trace, tagger)
    assert out is not trace and "tags" not in trace.annotations
    assert out.annotations["tags"][2:5] == ["reflect", "execute", "verify"]
    assert out.annotations["tags"][6:9] == ["conclude"] * 3
    assert out.annotations["segments"] == ["think"] * 6 + ["answer"] * 4
    frame = out.frame()
    assert list(frame["tag"]) == out.annotations["tags"] and list(frame["segment"]) == out.annotations["segments"]


def test_threads_share_a_tagger(tagger: PlanningTagger) -> None:
    tokens = [" Wa", "it", ",", " l", "et", "'s", " ch", "eck"] * 50
    expected = tag_tokens(tokens, tagger)
    results: list[list[str]] = []
    threads = [threading.Thread(target=lambda: results.append(tag_tokens(tokens, tagger))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 4


# -- lexicon ---------------------------------------------------------------------------------------


def test_default_lexicon_covers_the_spec() -> None:
    lex = load_lexicon()
    for cat, words in {
        "plan": ["let's", "we need to", "to find", "approach", "consider", "step", "multiply", "add",
                 "subtract", "divide", "plan", "route"],
        "reflect": ["wait", "alternatively", "hmm", "actually", "however"],
        "verify": ["check", "verify", "double-check", "confirm", "substitute back"],
        "conclude": ["therefore", "so the answer", "thus", "hence", "the answer is"],
    }.items():
        assert set(words) <= set(lex.phrases[cat]), cat


def write(tmp_path, data) -> str:
    path = tmp_path / "lex.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    "data, problem",
    [
        ("{not json", "not valid UTF-8 JSON"),
        ([], '"categories"'),
        ({"categories": {"planning": ["x"]}}, "unknown category 'planning'"),
        ({"categories": {"execute": ["x"]}}, "unknown category 'execute'"),
        ({"categories": {"plan": "first"}}, "list of phrases"),
        ({"categories": {"plan": [""]}}, "non-empty strings"),
        ({"categories": {"plan": {"phrase": ["x"]}}}, "unknown keys"),
        ({"categories": {"plan": {"patterns": [{"LOWER": "x"}]}}}, "pattern 0"),
        ({"categories": {"plan": {"patterns": [[{"LOWERR": "x"}]]}}}, "bad plan pattern"),
    ],
)
def test_bad_lexicon_names_file_and_problem(tmp_path, data, problem: str) -> None:
    path = write(tmp_path, data)
    with pytest.raises(InvalidInputError) as err:
        PlanningTagger("blank:en", lexicon=path)
    assert path in str(err.value) and problem in str(err.value)


def test_missing_lexicon(tmp_path) -> None:
    with pytest.raises(InvalidInputError, match="nope.json"):
        PlanningTagger("blank:en", lexicon=tmp_path / "nope.json")


def test_custom_lexicon_and_reload_on_edit(tmp_path) -> None:
    zz = [[{"LOWER": "zz", "OP": "+"}]]
    path = write(tmp_path, {"categories": {"verify": ["banana split"], "plan": {"patterns": zz}}})
    t = PlanningTagger("blank:en", lexicon=path)
    tags = [c for _, c in word_tags(t, "a Banana split zz zz Wait")]
    assert tags == ["execute", "verify", "verify", "plan", "plan", "execute"]
    write(tmp_path, {"categories": {"reflect": ["wait", "wait a minute"]}})
    assert [c for _, c in word_tags(t, "a Banana split zz zz Wait a minute")][-3:] == ["reflect"] * 3
    assert word_tags(t, "banana")[0][1] == "execute"


def test_unknown_pipeline_is_a_clear_error() -> None:
    with pytest.raises(InvalidInputError, match="not installed"):
        PlanningTagger("xx_no_such_pipeline_sm")
    with pytest.raises(InvalidInputError, match="unknown spaCy language"):
        PlanningTagger("blank:zz")


# -- a "trained" pipeline (on disk, with a lemmatizer) --------------------------------------------


@pytest.fixture(scope="module")
def lemma_pipeline(tmp_path_factory) -> str:
    nlp = spacy.blank("en")
    nlp.meta["name"] = "lemma_test"
    lem = nlp.add_pipe("lemmatizer", config={"mode": "lookup"})
    lookups = Lookups()
    lookups.add_table("lemma_lookup", {"multiplied": "multiply", "checked": "check", "reconsidering": "reconsider"})
    lem.lookups = lookups
    path = tmp_path_factory.mktemp("pipe")
    nlp.to_disk(path)
    return str(path)


def test_lemma_patterns_active_with_a_lemmatizer(lemma_pipeline: str, tagger: PlanningTagger) -> None:
    text = "First we multiplied. Then I checked it, reconsidering."
    trained = PlanningTagger(lemma_pipeline)
    assert trained.pipeline_name == "en_lemma_test" and trained.describe()["skipped_patterns"] == 0
    got = {w: c for w, c in word_tags(trained, text) if c != "execute"}
    assert got == {"First": "plan", "multiplied": "plan", "checked": "verify", "reconsidering": "reflect"}
    assert {w for w, c in word_tags(tagger, text) if c != "execute"} == {"First"}


def test_auto_prefers_installed_trained_pipeline(monkeypatch, lemma_pipeline: str) -> None:
    real_load = spacy.load
    monkeypatch.setattr(planning.spacy.util, "is_package", lambda name: name == "en_core_web_sm")
    installed = tag_layer._version  # "is the trained pipeline installed" is read from package metadata
    monkeypatch.setattr(tag_layer, "_version", lambda name: "3.8.0" if name == "en_core_web_sm" else installed(name))
    monkeypatch.setattr(planning.spacy, "load", lambda name, **kw: real_load(lemma_pipeline, **kw))
    try:
        t = PlanningTagger()
        assert t.pipeline == "en_core_web_sm"
        assert tag_tokens([" multiplied"], t) == ["plan"]
    finally:
        planning._load.cache_clear()
        planning.default_tagger.cache_clear()


# -- think / answer --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tokens, expected",
    [
        ([], []),
        (["a", "b"], ["answer", "answer"]),
        (["<think>", "x", "</think>", "y"], ["think", "think", "think", "answer"]),
        (["<th", "ink>x</th", "ink>", " y"], ["think", "think", "think", "answer"]),
        (["a ", "<think>", "x"], ["answer", "think", "think"]),  # unclosed runs to the end
        (["x", "</think>", "y"], ["think", "think", "answer"]),  # opened in the prompt
        (["a", "<think>x</think>", "b", "<think>", "c", "</think>", "d"],
         ["answer", "think", "answer", "think", "think", "think", "answer"]),
        (["y", "", "</think>", "", "z"], ["think", "think", "think", "answer", "answer"]),
        (["a</think>b", "c"], ["think", "answer"]),
    ],
)
def test_segments(tokens: list[str], expected: list[str]) -> None:
    assert segment_tokens(tokens) == expected


def test_custom_delimiters_and_bad_ones() -> None:
    assert segment_tokens(["[[", "a", "]]", "b"], open="[[", close="]]") == ["think", "think", "think", "answer"]
    with pytest.raises(InvalidInputError, match="non-empty"):
        segment_tokens(["a"], open="", close="x")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["<think>", "</think>", "a", " ", "é", "<", "think>"]), max_size=15), st.data())
def test_segments_match_character_reference(pieces: list[str], data: st.DataObject) -> None:
    text = "".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    tokens = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    # reference: walk characters with a state machine
    inside = [False] * len(text)
    if "</think>" in text and ("<think>" not in text or text.index("</think>") < text.index("<think>")):
        end = text.index("</think>") + len("</think>")
        inside[:end] = [True] * end
        i = end
    else:
        i = 0
    while i < len(text):
        if text.startswith("<think>", i):
            j = text.find("</think>", i + 7)
            end = len(text) if j == -1 else j + 8
            inside[i:end] = [True] * (end - i)
            i = end
        else:
            i += 1
    expected, pos = [], 0
    for tok in tokens:
        chars = range(pos, pos + len(tok)) if tok else range(pos, min(pos + 1, len(text)))
        expected.append("think" if any(inside[c] for c in chars) else "answer")
        pos += len(tok)
    assert segment_tokens(tokens) == expected
