"""Planning-token tags: a spaCy pipeline labels the words of a response, and the labels are mapped
onto the LM's tokens through character offsets.

Categories (see docs/PLANNING.md): plan, reflect, verify, conclude, and execute for everything else.
The words for each category live in an editable JSON lexicon (default `assets/planning_lexicon.json`)
and are matched with spaCy's PhraseMatcher (LOWER) and Matcher (token patterns). Patterns that need
annotations the active pipeline does not produce (LEMMA without a lemmatizer, ...) are skipped.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy

# thinc (under spaCy) imports torch only to offer it as a backend, which this tagger never uses; hiding an
# unloaded torch for that import keeps `forkpoint export` (planning tags, no model) free of the model stack.
# (A process that already loaded torch keeps it; spaCy there sees torch as usual.)
_HIDE_TORCH = "torch" not in sys.modules
if _HIDE_TORCH:
    sys.modules["torch"] = None  # type: ignore[assignment]  # makes `import torch` raise ImportError
try:
    import spacy
    from spacy.attrs import SENT_START
    from spacy.language import Language
    from spacy.matcher import Matcher, PhraseMatcher
finally:
    if _HIDE_TORCH and sys.modules.get("torch", 0) is None:
        del sys.modules["torch"]

from core.annotate.tag_layer import (
    DEFAULT_LEXICON,
    TAGS_BY,
    current_tags,
    resolve_pipeline,
    tagger_identity,
)
from core.errors import InvalidInputError, ModelLoadError
from core.trace import Trace

logger = logging.getLogger(__name__)

CATEGORIES: tuple[str, ...] = ("plan", "reflect", "verify", "conclude", "execute")
DEFAULT = "execute"
MATCHED = CATEGORIES[:-1]  # categories a lexicon may list; earlier wins a tie between equal spans
PLANNING_CATEGORIES = MATCHED  # the paper's "planning" side of the planning/execution split

# Token-pattern attributes -> what a pipeline must assign for them to mean anything.
_NEEDS = {
    "LEMMA": "token.lemma",
    "POS": "token.pos",
    "TAG": "token.tag",
    "MORPH": "token.morph",
    "DEP": "token.dep",
    "ENT_TYPE": "token.ent_type",
    "ENT_IOB": "token.ent_iob",
}
_SENT_END = ".!?…"
_STARTS = "forkpoint_sentence_starts"


# -- lexicon ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lexicon:
    """Parsed lexicon: category -> phrases and category -> Matcher token patterns."""

    phrases: dict[str, tuple[str, ...]]
    patterns: dict[str, tuple[tuple[dict[str, Any], ...], ...]]
    path: str
    sha256: str


def load_lexicon(path: str | Path = DEFAULT_LEXICON) -> Lexicon:
    """Read and validate a lexicon JSON file (format in docs/PLANNING.md); InvalidInputError if bad."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InvalidInputError(f"cannot read planning lexicon {str(path)!r}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"planning lexicon {str(path)!r} is not valid UTF-8 JSON: {exc}") from exc
    bad = functools.partial(_lexicon_error, path)
    if not isinstance(data, dict) or not isinstance(data.get("categories"), dict):
        raise bad('needs a top-level object with a "categories" object')
    phrases: dict[str, tuple[str, ...]] = {}
    patterns: dict[str, tuple[tuple[dict[str, Any], ...], ...]] = {}
    for cat, entry in data["categories"].items():
        if cat not in MATCHED:
            raise bad(f"unknown category {cat!r}; choose from: {', '.join(MATCHED)} (execute is the default)")
        if isinstance(entry, list):
            entry = {"phrases": entry}
        if not isinstance(entry, dict):
            raise bad(f"category {cat!r} must be a list of phrases or an object with phrases/patterns")
        unknown = set(entry) - {"phrases", "patterns", "description"}
        if unknown:
            raise bad(f"category {cat!r} has unknown keys {sorted(unknown)}; use phrases, patterns, description")
        words = entry.get("phrases", [])
        if not isinstance(words, list) or not all(isinstance(w, str) and w.strip() for w in words):
            raise bad(f"category {cat!r}: phrases must be a list of non-empty strings")
        pats = entry.get("patterns", [])
        if not isinstance(pats, list):
            raise bad(f"category {cat!r}: patterns must be a list of token patterns")
        for i, pat in enumerate(pats):
            if not isinstance(pat, list) or not pat or not all(isinstance(t, dict) and t for t in pat):
                raise bad(f"category {cat!r}: pattern {i} must be a non-empty list of non-empty objects")
        phrases[cat] = tuple(dict.fromkeys(w.strip().lower() for w in words))
        patterns[cat] = tuple(tuple(pat) for pat in pats)
    seen: dict[str, str] = {}
    for cat, words in phrases.items():
        for w in words:
            if w in seen:
                logger.warning("lexicon %s lists %r under %s and %s; %s wins", path, w, seen[w], cat,
                               min(seen[w], cat, key=MATCHED.index))
            seen.setdefault(w, cat)
    return Lexicon(phrases, patterns, str(path), hashlib.sha256(raw).hexdigest())


def _lexicon_error(path: Path, problem: str) -> InvalidInputError:
    return InvalidInputError(f"planning lexicon {str(path)!r}: {problem}")


# -- pipelines ----------------------------------------------------------------------------------


def _mark_sentence_starts(doc: Any) -> Any:
    """Sentence starts for pipelines without a parser: the first word, a word after . ! ? or a newline."""
    flags, start = [], True
    for tok in doc:
        if tok.is_space:
            flags.append(1 if tok.i == 0 else -1)
            start = start or "\n" in tok.text
            continue
        flags.append(1 if start else -1)
        start = tok.text[-1] in _SENT_END or "\n" in tok.whitespace_
    if flags:  # one bulk write: setting Token.is_sent_start one by one is quadratic
        doc.from_array([SENT_START], numpy.asarray(flags, dtype=numpy.int64).astype(numpy.uint64).reshape(-1, 1))
    return doc


if not Language.has_factory(_STARTS):
    Language.component(_STARTS, assigns=["token.is_sent_start"])(_mark_sentence_starts)


def _build_nlp(pipeline: str) -> Language:
    if pipeline.startswith("blank:"):
        lang = pipeline.split(":", 1)[1]
        try:
            nlp = spacy.blank(lang)
        except (ImportError, KeyError) as exc:
            raise InvalidInputError(f"unknown spaCy language {lang!r} in pipeline {pipeline!r}") from exc
        nlp.add_pipe(_STARTS)
        return _split_markup(nlp)
    if not (spacy.util.is_package(pipeline) or Path(pipeline).is_dir()):
        raise InvalidInputError(
            f"spaCy pipeline {pipeline!r} is not installed (nor a directory); install it "
            f"(python -m spacy download {pipeline}) or use 'blank:en'"
        )
    try:
        nlp = spacy.load(pipeline, exclude=["ner"])
    except (OSError, ValueError, ImportError) as exc:
        raise ModelLoadError(f"could not load spaCy pipeline {pipeline!r}: {exc}") from exc
    if not _assigned(nlp) & {"token.is_sent_start"}:
        nlp.add_pipe(_STARTS)
    return _split_markup(nlp)


def _split_markup(nlp: Language) -> Language:
    """Split at < and > inside words, so "check</think>" gives the word "check" (special tokens)."""
    current = getattr(nlp.tokenizer.infix_finditer, "__self__", None)  # the pipeline's own compiled regex
    pattern = current.pattern if isinstance(current, re.Pattern) else "|".join(nlp.Defaults.infixes)
    nlp.tokenizer.infix_finditer = re.compile(f"{pattern}|<|>" if pattern else "<|>").finditer
    return nlp


def _assigned(nlp: Language) -> set[str]:
    """What the pipeline's enabled components declare they assign (e.g. token.lemma)."""
    out: set[str] = set()
    for name in nlp.pipe_names:
        out.update(nlp.get_pipe_meta(name).assigns)
    if "token.pos" in out or "token.tag" in out:  # attribute_ruler/lemmatizer chains set these together
        out.update({"token.pos", "token.tag"})
    return out


def _pattern_attrs(pattern: tuple[dict[str, Any], ...]) -> set[str]:
    return {str(key).upper() for spec in pattern for key in spec}


@dataclass
class _Loaded:
    nlp: Language
    phrase: PhraseMatcher
    matcher: Matcher
    lexicon: Lexicon
    skipped: int
    lock: threading.Lock


@functools.lru_cache(maxsize=8)
def _load(pipeline: str, lexicon_path: str, _stamp: tuple[int, int]) -> _Loaded:
    """One nlp + matchers per (pipeline, lexicon file, file version); edits to the file reload it."""
    lexicon = load_lexicon(lexicon_path)
    nlp = _build_nlp(pipeline)
    assigned = _assigned(nlp)
    phrase = PhraseMatcher(nlp.vocab, attr="LOWER")
    matcher = Matcher(nlp.vocab, validate=True)
    skipped = 0
    for cat in MATCHED:
        words = lexicon.phrases.get(cat, ())
        if words:
            phrase.add(cat, [nlp.make_doc(w) for w in words])
        usable = []
        for pat in lexicon.patterns.get(cat, ()):
            missing = {a for a in _pattern_attrs(pat) if a in _NEEDS and _NEEDS[a] not in assigned}
            if missing:
                skipped += 1
                logger.debug("pipeline %s lacks %s; skipping %s pattern %s", pipeline, missing, cat, pat)
            else:
                usable.append([dict(spec) for spec in pat])
        if usable:
            try:
                matcher.add(cat, usable)
            except ValueError as exc:  # spaCy's MatchPatternError is a ValueError
                raise _lexicon_error(Path(lexicon_path), f"bad {cat} pattern: {exc}") from exc
    if skipped:
        logger.info("planning tagger on %s: %d lexicon patterns need annotations it lacks", pipeline, skipped)
    return _Loaded(nlp, phrase, matcher, lexicon, skipped, threading.Lock())


# -- tagger -------------------------------------------------------------------------------------


class PlanningTagger:
    """Tags words with planning categories using a spaCy pipeline and a lexicon file.

    pipeline: None (en_core_web_sm when installed, else blank English), "blank:<lang>", an installed
    pipeline package name, or a pipeline directory. lexicon: path of the JSON lexicon.
    """

    def __init__(self, pipeline: str | None = None, lexicon: str | Path = DEFAULT_LEXICON) -> None:
        self.pipeline = resolve_pipeline(pipeline)
        self.lexicon_path = Path(lexicon).resolve()
        self._loaded()  # fail now, not on first use

    def _loaded(self) -> _Loaded:
        try:
            st = self.lexicon_path.stat()
        except OSError as exc:
            raise InvalidInputError(f"cannot read planning lexicon {str(self.lexicon_path)!r}: {exc}") from exc
        return _load(self.pipeline, str(self.lexicon_path), (st.st_mtime_ns, st.st_size))

    @property
    def pipeline_name(self) -> str:
        """The active pipeline: "blank:en" or the trained package's name (e.g. en_core_web_sm)."""
        if self.pipeline.startswith("blank:"):
            return self.pipeline
        meta = self._loaded().nlp.meta
        return f"{meta.get('lang', '')}_{meta.get('name', '')}".strip("_") or self.pipeline

    def describe(self) -> dict[str, Any]:
        """What produced the tags, for a trace's record: pipeline, version, lexicon path and sha256."""
        loaded = self._loaded()
        return {
            "pipeline": self.pipeline_name,
            "pipeline_version": str(loaded.nlp.meta.get("version", "")),
            "spacy": spacy.__version__,
            "lexicon": loaded.lexicon.path,
            "lexicon_sha256": loaded.lexicon.sha256,
            "skipped_patterns": loaded.skipped,
        }

    def identity(self) -> str:
        """Who writes these tags (`tag_layer.tagger_identity`), as stored in a trace's `tags_by` layer."""
        return tagger_identity(self.pipeline, self.lexicon_path)

    def tag_text(self, text: str) -> list[tuple[int, int, str]]:
        """(start, end, category) character spans for every non-space word of `text`, in order."""
        body = text.lstrip()
        if not body:
            return []
        offset = len(text) - len(body)
        loaded = self._loaded()
        with loaded.lock:
            loaded.nlp.max_length = max(loaded.nlp.max_length, len(body) + 1)
            doc = loaded.nlp(body)
            matches = []
            if len(loaded.phrase):
                matches += [(s, e, loaded.nlp.vocab.strings[m]) for m, s, e in loaded.phrase(doc)]
            if len(loaded.matcher):
                matches += [(s, e, loaded.nlp.vocab.strings[m]) for m, s, e in loaded.matcher(doc)]
        cats = [DEFAULT] * len(doc)
        # Longest match first, then earliest, then category order; a match overlapping one of another
        # category loses, overlapping ones of the same category merge ("so the answer" + "the answer is").
        for s, e, cat in sorted(set(matches), key=lambda m: (m[0] - m[1], m[0], MATCHED.index(m[2]))):
            if all(c in (DEFAULT, cat) for c in cats[s:e]):
                cats[s:e] = [cat] * (e - s)
        return [
            (offset + tok.idx, offset + tok.idx + len(tok.text), cats[tok.i]) for tok in doc if not tok.is_space
        ]

    def tag_tokens(self, tokens: list[str]) -> list[str]:
        """One category per LM token; tokens' join is the text. See `words_to_tokens` for the rule."""
        return words_to_tokens(self.tag_text("".join(tokens)), tokens)

    def __repr__(self) -> str:
        return f"PlanningTagger(pipeline={self.pipeline!r}, lexicon={str(self.lexicon_path)!r})"


# -- words -> LM tokens -------------------------------------------------------------------------


def token_spans(tokens: list[str]) -> list[tuple[int, int]]:
    """(start, end) character offsets of each token in "".join(tokens)."""
    spans, pos = [], 0
    for tok in tokens:
        spans.append((pos, pos + len(tok)))
        pos += len(tok)
    return spans


def words_to_tokens(words: list[tuple[int, int, str]], tokens: list[str]) -> list[str]:
    """Per-token categories from word spans: a token takes the first non-execute category among the
    words it overlaps (so a word split over several tokens tags them all); no overlap -> execute.
    An empty token (part of a character split over byte tokens) goes with the next character."""
    out, w = [], 0
    for start, end in token_spans(tokens):
        end = max(end, start + 1)
        while w < len(words) and words[w][1] <= start:
            w += 1
        cat, j = DEFAULT, w
        while j < len(words) and words[j][0] < end:
            if words[j][2] != DEFAULT:
                cat = words[j][2]
                break
            j += 1
        out.append(cat)
    return out


@functools.lru_cache(maxsize=1)
def default_tagger() -> PlanningTagger:
    """The shared tagger: en_core_web_sm when installed, else blank English; default lexicon."""
    return PlanningTagger()


def tag_tokens(tokens: list[str], tagger: PlanningTagger | None = None) -> list[str]:
    """One planning category per token (see CATEGORIES)."""
    return (tagger or default_tagger()).tag_tokens(list(tokens))


def tag_planning(trace: Trace, tagger: PlanningTagger | None = None) -> list[str]:
    """Per-token planning categories of a trace's response."""
    return tag_tokens(trace.tokens, tagger)


def trace_tags(trace: Trace) -> list[str]:
    """The trace's planning tags: its "tags" layer when the default tagger would write them again
    (`tag_layer.current_tags`), else the tagger's."""
    stored = current_tags(trace)
    return stored if stored is not None else [str(t) for t in tag_planning(trace)]


def store_tags(trace: Trace, tagger: PlanningTagger | None = None) -> Trace:
    """Give `trace` in place its "tags", "segments" and `tags_by` layers (what a stored trace carries, so
    that its views and exports need no tagger), unless it has the default tagger's tags already."""
    tagger = tagger or default_tagger()
    if trace.annotations.get(TAGS_BY) != tagger.identity() or "segments" not in trace.annotations:
        trace.annotations.update(tags=tag_planning(trace, tagger), segments=segment_tokens(trace.tokens),
                                 **{TAGS_BY: tagger.identity()})
    return trace


# -- thinking vs answer -------------------------------------------------------------------------


def think_regions(text: str, open: str = "<think>", close: str = "</think>") -> list[tuple[int, int]]:
    """[start, end) character regions of `text` inside thinking delimiters, delimiters included.

    An unclosed open runs to the end; a close with no open before it closes a region opened in the
    prompt (R1-style chat templates put "<think>" there), so the text before it is thinking.
    """
    if not open or not close:
        raise InvalidInputError(f"thinking delimiters must be non-empty, got open={open!r} close={close!r}")
    regions, pos = [], 0
    first_open, first_close = text.find(open), text.find(close)
    if first_close != -1 and (first_open == -1 or first_close < first_open):
        pos = first_close + len(close)
        regions.append((0, pos))
    while (s := text.find(open, pos)) != -1:
        c = text.find(close, s + len(open))
        e = len(text) if c == -1 else c + len(close)
        regions.append((s, e))
        pos = e
    return regions


def segment_tokens(tokens: list[str], open: str = "<think>", close: str = "</think>") -> list[str]:
    """Per token "think" or "answer": a token is "think" if any of its characters (for an empty token,
    the next character) lies in a thinking region; no delimiters at all -> every token is "answer"."""
    text = "".join(tokens)
    regions = think_regions(text, open, close)
    out, r = [], 0
    for start, end in token_spans(tokens):
        end = max(end, start + 1)
        while r < len(regions) and regions[r][1] <= start:
            r += 1
        out.append("think" if r < len(regions) and regions[r][0] < end else "answer")
    return out


def annotate_tags(
    trace: Trace, tagger: PlanningTagger | None = None, open: str = "<think>", close: str = "</think>"
) -> Trace:
    """A copy of `trace` with the "tags" and "segments" annotation layers."""
    return trace.annotate(tags=tag_planning(trace, tagger), segments=segment_tokens(trace.tokens, open, close))
