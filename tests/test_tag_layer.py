"""core.annotate.tag_layer: stored planning tags are reused only when the tagger in use would write them.

The identity is computed without spaCy; it must be the loaded tagger's own. Exports of a trace with
stored tags are the exports of the same trace tagged on the fly (the bytes, but for the time stamp).
"""

from __future__ import annotations

import json
import re
import shutil

import pandas as pd
from fakes import make_trace

from core.annotate import tag_layer
from core.annotate.planning import (
    PlanningTagger,
    default_tagger,
    store_tags,
    tag_planning,
    trace_tags,
)
from core.annotate.tag_layer import TAGS_BY, current_tags, tagger_identity
from core.evaluation.grading import grade_trace
from core.views.exports import export

TEXT = "First, let me plan the steps. Wait, check 2 + 2 = 4. So the answer is 4."


def _stamped_out(text: str) -> str:
    return re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", "T", text)


def test_the_identity_without_spacy_is_the_loaded_taggers() -> None:
    tagger = default_tagger()
    described = tagger.describe()
    assert tagger.identity() == tagger_identity()
    assert tagger_identity().startswith(described["pipeline"]) and described["lexicon_sha256"] in tagger_identity()
    assert f"spacy {described['spacy']}" in tagger_identity()


def test_another_lexicon_is_another_tagger(tmp_path) -> None:
    lexicon = tmp_path / "lexicon.json"
    shutil.copy(tag_layer.DEFAULT_LEXICON, lexicon)
    assert PlanningTagger(lexicon=lexicon).identity() == tagger_identity()  # another path, the same bytes
    data = json.loads(lexicon.read_text())
    data["categories"]["plan"] = {"phrases": ["steps"]}
    lexicon.write_text(json.dumps(data))
    edited = PlanningTagger(lexicon=lexicon)
    assert edited.identity() != tagger_identity()
    trace = store_tags(make_trace(text=TEXT, seed=4), edited)
    assert trace.annotations[TAGS_BY] == edited.identity() and current_tags(trace) is None


def test_stored_tags_are_reused_only_when_current() -> None:
    trace = make_trace(text=TEXT, seed=1)
    assert current_tags(trace) is None
    store_tags(trace)
    assert trace.annotations[TAGS_BY] == tagger_identity() and current_tags(trace) == tag_planning(trace)
    fake = ["plan"] * len(trace)
    mine = trace.annotate(tags=fake)  # the current tagger's record: taken as they are
    assert current_tags(mine) == fake == trace_tags(mine)
    stale = trace.annotate(tags=fake, **{TAGS_BY: "blank:en; spacy 0.0; lexicon 0; rules 0"})
    assert current_tags(stale) is None and trace_tags(stale) == tag_planning(trace)
    unknown = make_trace(text=TEXT, seed=1).annotate(tags=fake)  # tags of unknown origin: kept, as before
    assert current_tags(unknown) == fake


def test_grading_stores_the_tags() -> None:
    trace = make_trace(text=TEXT, seed=2)
    grade_trace(trace)
    assert trace.annotations["tags"] == tag_planning(trace) and trace.annotations[TAGS_BY] == tagger_identity()
    assert len(trace.annotations["segments"]) == len(trace)


def test_exports_of_stored_tags_are_exports_of_fresh_ones(tmp_path) -> None:
    fresh = make_trace(text=TEXT, seed=3)
    stored = store_tags(make_trace(text=TEXT, seed=3))
    stale = make_trace(text=TEXT, seed=3).annotate(tags=["plan"] * len(fresh), **{TAGS_BY: "someone else"})
    for fmt in ("html", "csv", "jsonl"):
        paths = [export(t, tmp_path / f"{name}.{fmt}") for name, t in
                 (("fresh", fresh), ("stored", stored), ("stale", stale))]
        texts = [_stamped_out(p.read_text(encoding="utf-8")) for p in paths]
        if fmt == "jsonl":  # lossless: the stored trace carries its tagger's record too
            records = [json.loads(t) for t in texts]
            assert records[1]["annotations"].pop(TAGS_BY) == tagger_identity()
            assert records[0] == records[1] == records[2]
        else:
            assert texts[0] == texts[1] == texts[2], fmt
    frame = pd.read_csv(tmp_path / "stored.csv", keep_default_na=False)
    assert list(frame["tag"]) == [t if t != "execute" else "" for t in tag_planning(fresh)]
