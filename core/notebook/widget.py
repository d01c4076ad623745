"""`core.widget(pair, trace)`: the app's token view as a Jupyter widget (anywidget), with branching in the kernel.

The front end is ONE source shared with the app: `app/components/token_view.{js,css}` (read at runtime;
its default export is renamed to `fpTokenView`) plus the notebook's controls in `core/notebook/widget.js`.
State flows through synced traits: the browser sets `score`, `selected` ({view, pos}) and `request`
({action: take_over | show | note, ...}); Python answers with `views` (one payload per shown trace: the
escaped heatmap from `core.views.heatmap.tokens_html` and hover data), `choices`, `tree`, `notes`, `status`.
The Python side exposes the same objects: `w.selection`, `w.branches`, `w.take_over(pos, token)`.
Needs the `notebook` extra (anywidget); `import core` never imports it.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anywidget
import numpy as np
import traitlets

from core import settings
from core.annotate import rank_shift
from core.decoding import branch
from core.decoding.takeover import flipped, set_switches, switches_in_force
from core.errors import ForkpointError, InvalidInputError
from core.evaluation.grading import grade_trace, graded_put
from core.io.notes import add_note, attach_notes, read_notes
from core.scoring.registry import DEFAULT_SCORE, METRICS, SCORES, check_score
from core.trace import Trace
from core.views.heatmap import heatmap_css
from core.views.presentation import (
    branch_token_text,
    no_change_line,
    switch_text,
    takeover_choices,
    tree_label,
)
from core.views.token_payload import view_payload

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent
COMPONENT_DIR = _HERE.parent / "views"  # token_view.{js,css}: the one front end, shared with the app
RANK_SHIFT_LABEL = "Rank shift (unshifted / marginal / shifted)"
_DEFAULT_EXPORT = re.compile(r"^export\s+default\s+function\s*(\w*)\s*\(", re.MULTILINE)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ImportError(f"The notebook widget needs {path} (the app's token view); it could not be read: {exc}"
                          ) from exc


@functools.cache
def _sources(js_mtime: float, css_mtime: float) -> tuple[str, str]:
    view_js = _read(COMPONENT_DIR / "token_view.js")
    renamed, n = _DEFAULT_EXPORT.subn("function fpTokenView(", view_js, count=1)
    if n != 1:
        raise ImportError(f"{COMPONENT_DIR / 'token_view.js'} has no `export default function (component)`; "
                          "the notebook widget mounts the app's token view through it")

    esm_text = renamed + "\n\n" + _read(_HERE / "widget.js")
    css_text = "\n".join([heatmap_css(), _read(COMPONENT_DIR / "token_view.css"), _read(_HERE / "widget.css")])
    return esm_text, css_text


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def esm() -> str:
    """The widget's ES module: the app's token_view.js (default export renamed) + the notebook controls."""
    return _sources(_mtime(COMPONENT_DIR / "token_view.js"), _mtime(COMPONENT_DIR / "token_view.css"))[0]


def css() -> str:
    """The widget's stylesheet: core.views.heatmap's, the app's token_view.css and the notebook controls'."""
    return _sources(_mtime(COMPONENT_DIR / "token_view.js"), _mtime(COMPONENT_DIR / "token_view.css"))[1]


def widget_view(trace: Trace, score: str = DEFAULT_SCORE, decode: Any = None, k: int = settings.HOVER_K) -> dict[str, Any]:
    """The token view's `data` for one trace: the app's payload (core/views/token_payload.py: same hover k, rank
    shifts and paging) without the legend, in the widget's frame (height, probabilities as probabilities)."""
    view = view_payload(trace, score=score, decode=decode, k=k)
    return {**{key: v for key, v in view.items() if key != "legend"}, "height": 420, "prob_mode": "prob"}


@dataclass(frozen=True)
class Selection:
    """The token the user clicked: which shown trace (`view` 0 = the original), its position and token."""

    view: int
    trace: Trace = field(repr=False)
    pos: int
    token_id: int
    token: str


class TokenWidget(anywidget.AnyWidget):
    """The interactive token view. Build it with `core.widget(pair, trace)`."""

    _esm = traitlets.Unicode("").tag(sync=True)  # set per instance from the files (see esm())
    _css = traitlets.Unicode("").tag(sync=True)
    score = traitlets.Unicode(DEFAULT_SCORE).tag(sync=True)
    scores = traitlets.List().tag(sync=True)
    views = traitlets.List().tag(sync=True)
    selected = traitlets.Dict(allow_none=True, default_value=None).tag(sync=True)
    selection_label = traitlets.Unicode("").tag(sync=True)
    choices = traitlets.List().tag(sync=True)
    request = traitlets.Dict(allow_none=True, default_value=None).tag(sync=True)
    tree = traitlets.List().tag(sync=True)
    notes = traitlets.List().tag(sync=True)
    can_note = traitlets.Bool(False).tag(sync=True)
    status = traitlets.Unicode("").tag(sync=True)

    def __init__(self, pair: Any, trace: Trace, *, score: str = DEFAULT_SCORE, store: Any = None,
                 max_new_tokens: int | None = None, k: int = settings.HOVER_K) -> None:
        super().__init__(_esm=esm(), _css=css())
        if not isinstance(trace, Trace):
            raise InvalidInputError(f"widget needs a core.Trace, got {type(trace).__name__}")
        self.pair, self.original, self.store = pair, trace, store
        self.max_new_tokens, self.k = max_new_tokens, k
        self.branches: list[Trace] = []
        self._shown: Trace | None = None
        self._decode = getattr(pair, "token_text", None)
        self.scores = [[name, METRICS[name].score_label] for name in SCORES] + [[rank_shift.NAME, RANK_SHIFT_LABEL]]
        self.can_note = store is not None and trace.key is not None
        self.score = score if score == rank_shift.NAME else check_score(score)
        self._refresh()

    # -- what Python code reads ---------------------------------------------------------------------
    @property
    def shown(self) -> list[Trace]:
        """The traces on screen: the original, then the branch shown beside it (if any)."""
        return [self.original] + ([self._shown] if self._shown is not None else [])

    @property
    def selection(self) -> Selection | None:
        """The clicked token, or None."""
        sel = self.selected
        if not sel:
            return None
        trace = self.shown[int(sel["view"])]
        pos = int(sel["pos"])
        return Selection(int(sel["view"]), trace, pos, int(trace.token_ids[pos]), trace.tokens[pos])

    def trace(self, key: str) -> Trace:
        """The original or a branch by key."""
        for t in [self.original, *self.branches]:
            if t.key == key:
                return t
        raise InvalidInputError(f"No trace {key!r} in this widget; its traces: "
                                f"{', '.join(str(t.key) for t in [self.original, *self.branches])}")

    # -- actions (the front end's requests end here too) ------------------------------------------
    def take_over(self, pos: int, token: int | None = None, *, view: int = 0) -> Trace:
        """Branch the shown trace `view` at `pos` (the reasoner's own choice, or the forced `token`) with
        `core.branch`; the branch is shown beside the original and added to `branches`."""

        parent = self.shown[view]

        def progress(done: int, total: int) -> None:  # live in the front end: traits sync as they are set
            self.status = f"branching at #{pos}: {done} / {total} tokens"

        child = branch(self.pair, parent, int(pos), token, max_new_tokens=self.max_new_tokens, store=self.store,
                       progress=progress)
        if child.key == parent.key:  # the reasoner (or the token) writes what is there: no new trace
            self.status = no_change_line(parent, int(pos), self._decode) if token is None else "no change: the same tokens"
            return parent
        child = graded_put(self.store, child)  # graded like every other trace (a rewrite only when newly graded)
        if all(child.key != b.key for b in self.branches):
            self.branches.append(child)
        self._shown = child
        self.selected = None
        self._refresh()
        self.status = f"branched at #{pos}: {len(child)} tokens, {child.n_takeovers} takeover(s)"
        return child

    def switch(self, at: dict[int, Any] | None = None, *, flip: int | None = None, view: int = 0) -> Trace:
        """Switch takeovers on the shown trace `view` (`core.takeover`'s `at`, or `flip` one token as the app's
        switchboard does); the new trace streams into the status line and is shown beside the original."""
        parent = self.shown[view]
        wanted = flipped(parent, int(flip)) if flip is not None else {**switches_in_force(parent), **(at or {})}
        shown: list[str] = []

        def on_token(pos: int, token: int, source: str) -> None:  # live in the front end: traits sync as set
            shown.append(self._decode(token) if self._decode else str(token))
            self.status = f"#{pos}: …{''.join(shown)[-60:]}"

        child = set_switches(self.pair, parent, wanted, store=self.store, root=self.original,
                             max_new_tokens=self.max_new_tokens, on_trace=grade_trace, on_token=on_token)
        if child.key == parent.key:  # the switch changes no token: no new trace
            self.status = (no_change_line(parent, int(flip), self._decode) if flip is not None
                           else "no change: the same tokens")
            return parent
        child = graded_put(self.store, child)  # a child an older run stored gains the grade it lacked
        if child.key != self.original.key and all(child.key != b.key for b in self.branches):
            self.branches.append(child)
        self._shown = None if child.key == self.original.key else child
        self.selected = None
        self._refresh()
        forced = int(np.sum(np.asarray(child.source, dtype=object) == "forced"))
        self.status = f"{switch_text(child, self._decode) or 'no switches'}: {len(child)} tokens, " \
                      f"{child.n_takeovers} takeover(s){f', {forced} typed or forced' if forced else ''}, " \
                      f"answer {child.meta.get('answer')!r}"
        return child

    def edit(self, pos: int, text: str, *, view: int = 0) -> Trace:
        """Type `text` at token `pos` of the shown trace `view` and let its policy continue from there (Loom's
        edit and continue): the typed tokens are forced ("forced"), never takeovers."""
        if not isinstance(text, str) or not text:
            raise InvalidInputError("edit needs the text to type at the token (a non-empty string)")
        return self.switch({int(pos): text}, view=view)

    def show(self, key: str) -> None:
        """Show the original alone (its key) or a branch beside it."""
        trace = self.trace(key)
        self._shown = None if trace is self.original else trace
        self.selected = None
        self._refresh()
        self.status = "showing the original" if trace is self.original else f"showing the branch @ {trace.meta.get('branch_pos')}"

    def add_note(self, pos: int, text: str, *, end: int | None = None, view: int = 0, bookmark: bool = False) -> Any:
        """Note tokens pos..end of a shown trace in the store (see core/io/notes.py)."""

        if self.store is None:
            raise InvalidInputError("Notes are kept in a store: make the widget with store=core.TraceStore(...)")
        trace = self.shown[view]
        if trace.key not in self.store:
            self.store.put(trace)
        note = add_note(self.store, trace.key, int(pos), end, text, bookmark=bookmark, n_tokens=len(trace))
        self._refresh_notes()
        self._refresh_views()
        return note

    # -- trait plumbing ----------------------------------------------------------------------------
    @traitlets.observe("score")
    def _on_score(self, change: dict[str, Any]) -> None:
        if change["new"] not in (*SCORES, rank_shift.NAME):
            self.status = f"error: unknown score {change['new']!r}"
            self.score = change["old"] if change["old"] in (*SCORES, rank_shift.NAME) else DEFAULT_SCORE
            return
        if hasattr(self, "original"):
            self._refresh_views()

    @traitlets.observe("selected")
    def _on_selected(self, change: dict[str, Any]) -> None:

        sel = self.selection if hasattr(self, "original") else None
        if sel is None:
            self.choices, self.selection_label = [], ""
            return
        choices = takeover_choices(sel.trace, sel.pos, self._decode)
        self.choices = [[c.label, c.token] for c in choices]
        self.selection_label = f"#{sel.pos} {sel.token!r} in {'the original' if sel.view == 0 else 'the branch'}"

    @traitlets.observe("request")
    def _on_request(self, change: dict[str, Any]) -> None:
        req = change["new"]
        if not req:
            return
        try:
            action = req.get("action")
            if action == "take_over":
                token = self.choices[int(req.get("choice", 0))][1] if self.choices else req.get("token")
                self.status = "branching…"
                self.take_over(int(req["pos"]), token, view=int(req.get("view", 0)))
            elif action == "flip":
                self.status = "switching…"
                self.switch(flip=int(req["pos"]), view=int(req.get("view", 0)))
            elif action == "force":
                self.status = "switching…"
                self.switch({int(req["pos"]): int(req["token"])}, view=int(req.get("view", 0)))
            elif action == "edit":
                self.status = "switching…"
                self.edit(int(req["pos"]), str(req.get("text", "")), view=int(req.get("view", 0)))
            elif action == "show":
                self.show(str(req["key"]))
            elif action == "note":
                self.add_note(int(req["pos"]), str(req.get("text", "")), view=int(req.get("view", 0)))
                self.status = "note saved"
            else:
                raise InvalidInputError(f"Unknown widget action {action!r}; choose one of: take_over, flip, force, "
                                        "edit, show, note")
        except ForkpointError as exc:
            self.status = f"error: {exc}"
        except (IndexError, KeyError, TypeError, ValueError) as exc:  # a malformed request from the front end
            self.status = f"error: bad widget request {req!r}: {exc}"

    def _refresh(self) -> None:
        self._refresh_views()
        self._refresh_tree()
        self._refresh_notes()

    def _refresh_views(self) -> None:
        views = []
        for i, trace in enumerate(self.shown):
            title = "original" if i == 0 else f"branch @ {trace.meta.get('branch_pos')}"
            if self.store is not None and trace.key:  # notes are marked on their tokens, the text on hover
                trace = attach_notes(self.store, trace)
            views.append({"title": f"{title} · {len(trace)} tokens", "key": trace.key,
                          "data": widget_view(trace, self.score, self._decode, self.k)})
        self.views = views

    def _refresh_tree(self) -> None:
        self.tree = [{"depth": d, "label": label, "key": key, "shown": key in {t.key for t in self.shown[1:]}}
                     for d, label, key in widget_tree_rows(self.original, self.branches, self._decode)]

    def _refresh_notes(self) -> None:
        if self.store is None:
            return

        rows = []
        for i, trace in enumerate(self.shown):
            if trace.key:
                title = "original" if i == 0 else "branch"
                rows += [{**n.to_dict(), "view": i, "title": title} for n in read_notes(self.store, trace.key)]
        self.notes = rows


def widget_tree_rows(root: Trace, branches: list[Trace], decode: Any = None) -> list[tuple[int, str, str]]:
    """The branch tree of `root` and `branches` (by meta parent), depth-first: (depth, label, key) rows."""

    children: dict[str, list[Trace]] = {}
    for b in branches:
        children.setdefault(str(b.meta.get("parent")), []).append(b)
    rows: list[tuple[int, str, str]] = []

    def walk(trace: Trace, depth: int) -> None:
        node = {"key": trace.key, "branch_pos": trace.meta.get("branch_pos") if depth else None, "n_tokens": len(trace)}
        rows.append((depth, tree_label(depth, node, branch_token_text(trace, decode) if depth else ""), str(trace.key)))
        for child in sorted(children.get(str(trace.key), []), key=lambda t: int(t.meta.get("branch_pos") or 0)):
            walk(child, depth + 1)

    walk(root, 0)
    return rows


def widget(pair: Any, trace: Trace, *, score: str = DEFAULT_SCORE, store: Any = None,
           max_new_tokens: int | None = None, k: int = settings.HOVER_K) -> TokenWidget:
    """An interactive token view of `trace` for Jupyter: metric selector, hover top-k, click a token and branch
    there (`core.branch` runs in the kernel; the branch shows beside the original, with the branch tree).
    With `store`, branches are stored and notes can be added."""
    return TokenWidget(pair, trace, score=score, store=store, max_new_tokens=max_new_tokens, k=k)
