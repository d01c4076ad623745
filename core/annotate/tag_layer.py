"""The planning tags a trace carries, and whether the tagger in use now would write the same ones.

A trace stores its tags with the identity of the tagger that wrote them (layer `tags_by`): the pipeline
and its version, spaCy's version, the lexicon's sha256 and the version of forkpoint's tagging rules.
That identity is computed here from package metadata and the lexicon's bytes, without importing spaCy,
so a view or an export of a tagged trace starts without it (`core/annotate/planning.py` is the tagger).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from pathlib import Path

from core.packaged import assets_dir
from core.trace import Trace

DEFAULT_LEXICON = assets_dir() / "planning_lexicon.json"  # checkout or wheel (core/packaged.py)
DEFAULT_PIPELINE = "en_core_web_sm"
RULES_VERSION = 1  # bump when planning.py's own rules change what a tagger writes (sentence starts, splits)
TAGS_BY = "tags_by"  # the layer naming the tagger that wrote a trace's "tags"


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def resolve_pipeline(pipeline: str | None) -> str:
    """'auto' (None): the default trained pipeline when installed, else a blank English one."""
    if pipeline is None:
        return DEFAULT_PIPELINE if _version(DEFAULT_PIPELINE) is not None else "blank:en"
    if pipeline == "blank":
        return "blank:en"
    return pipeline


@functools.lru_cache(maxsize=8)
def _identity(pipeline: str, lexicon: str, _stamp: tuple[int, int]) -> str:
    digest = hashlib.sha256(Path(lexicon).read_bytes()).hexdigest()
    own = "" if pipeline.startswith("blank:") else f" {_version(pipeline) or ''}"
    return f"{pipeline}{own}; spacy {_version('spacy')}; lexicon {digest}; rules {RULES_VERSION}"


def tagger_identity(pipeline: str | None = None, lexicon: str | Path = DEFAULT_LEXICON) -> str:
    """Who would write the tags: "<pipeline>[ <version>]; spacy <v>; lexicon <sha256>; rules <n>"."""
    path = Path(lexicon).resolve()
    st = path.stat()
    return _identity(resolve_pipeline(pipeline), str(path), (st.st_mtime_ns, st.st_size))


def current_tags(trace: Trace) -> list[str] | None:
    """The trace's stored tags when the default tagger would write them again (written by it, or with no
    record of who wrote them); None when it has none or another tagger's."""
    tags = trace.annotations.get("tags")
    if tags is None:
        return None
    by = trace.annotations.get(TAGS_BY)
    if by is not None and by != tagger_identity():
        return None
    return [str(t) for t in tags]
