"""The walk of one flip, measured: a click's request goes through the live route (app/live.py), whose handler
calls core, and every Python call on the way is recorded (sys.setprofile, on every thread) by the room of core
(tests/test_architecture.py ROOM_ORDER) its function lives in.

The rules, the ones docs/ARCHITECTURE.md's "The walk of one flip" states:

1. **Each stage enters each room once.** The handler has two stages: the switch (read the parent, core's
   takeover, grade and store) and the view (`LiveView.render`, drawing the stored child). The rooms each
   stage's own app code enters, in order (one entry per call from app/ into core/ that is not already
   inside core; consecutive calls into one room counted once; the shared root modules errors, settings,
   packaged and trace, which every stage reads, left out), name no room twice: the edge never leaves a
   room and comes back to it within a stage. The measured order is pinned (FLIP_WALK), so a change to the
   walk changes docs/ARCHITECTURE.md with it.
2. **No call climbs back.** A function of one room of core calls a function of a later room (or of the
   app) only through what a caller in a later room handed down to it: a callable passed as an argument
   (`on_trace=grade_trace`, `on_token=`), or a method of an object passed (`store=`: TraceStore.put). Such
   a call is a hook the caller asked for, not a dependency of the lower room. Only direct calls are judged:
   a call made by library code (transformers calling the KV cache's `update`, the import system calling a
   finder) is the library's, on an object core gave it.
3. **The child is graded, then stored once**: one TraceStore.put, after the first grade_trace.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from functools import partial

import pytest
from test_architecture import ROOM_ORDER
from test_decoding import PROMPTS

import core
from app import live
from core.io.store import TraceStore

RANK = {room: i for i, room in enumerate(ROOM_ORDER)}
APP = "app"  # the edge: above every room


def room(module: str | None) -> str | None:
    """The room of a module of core (core.io for core.io.store), APP for app's modules, None for the rest."""
    if not module:
        return None
    if module == "app" or module.startswith("app."):
        return APP
    parts = module.split(".")
    if parts[0] != "core":
        return None
    return ".".join(parts[:2]) if len(parts) > 2 or ".".join(parts[:2]) in RANK else module


def rank(r: str) -> int:
    return len(ROOM_ORDER) if r == APP else RANK[r]


SHARED_ROOMS = {"core.errors", "core.settings", "core.packaged", "core.trace"}  # what every stage shares


class Walk:
    """Records every call into core or app made directly by core or app code: (caller's room, callee's room,
    callee's name, whether the callee was handed down), and the rooms the edge enters from its own code."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, bool]] = []
        self.entries: list[str] = []  # rooms the edge's own code entered, in order, repeats merged
        self.stages: list[int] = []  # where in `entries` the view's drawing (LiveView.render) began
        self.handed_codes: set = set()
        self.handed_ids: set[int] = set()
        self._rooms: dict = {}
        self._lock = threading.Lock()

    def _room(self, frame) -> str | None:
        code = frame.f_code
        found = self._rooms.get(code, 0)
        if found == 0:
            found = self._rooms[code] = room(frame.f_globals.get("__name__"))
        return found

    def _hand(self, value) -> None:
        """Remember a value passed down the stage order: a function (its code), a bound method (its code and
        object), or any other object (whose methods the lower room may call)."""
        if isinstance(value, (int, float, str, bytes, bool, type(None))):
            return
        code = getattr(value, "__code__", None)
        if code is not None:
            self.handed_codes.add(code)
        func = getattr(value, "__func__", None)
        if func is not None and hasattr(func, "__code__"):
            self.handed_codes.add(func.__code__)
            self.handed_ids.add(id(value.__self__))
        self.handed_ids.add(id(value))

    def _inside_core(self, frame) -> bool:
        while frame is not None:
            r = self._room(frame)
            if r is not None and r != APP:
                return True
            frame = frame.f_back
        return False

    def profile(self, frame, event, arg) -> None:
        if event != "call":
            return
        callee = self._room(frame)
        parent = frame.f_back
        if callee is None or parent is None:
            return
        caller = self._room(parent)
        if caller is None:  # called by library code (transformers calling a cache's update, the import system)
            return
        name = f"{frame.f_globals.get('__name__')}.{frame.f_code.co_qualname}"
        with self._lock:
            handed = frame.f_code in self.handed_codes or id(frame.f_locals.get("self")) in self.handed_ids
            self.calls.append((caller, callee, name, handed))
            if rank(caller) > rank(callee):
                for value in frame.f_locals.values():
                    self._hand(value)
            if caller == APP and callee == APP and frame.f_code.co_name == "live_render":
                self.stages.append(len(self.entries))
            if caller == APP and callee not in (APP, *SHARED_ROOMS) and not self._inside_core(parent):
                if not self.entries or self.entries[-1] != callee:
                    self.entries.append(callee)

    def __enter__(self) -> "Walk":
        threading.setprofile(self.profile)
        sys.setprofile(self.profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    def climbs(self) -> list[str]:
        """Direct calls from a room of core into a later room (or the app) of a callable not handed down."""
        return sorted({f"{a} -> {b}: {name}" for a, b, name, handed in self.calls
                       if a != APP and rank(b) > rank(a) and not handed})


@pytest.fixture(scope="module")
def flip(qwen_pair, tmp_path_factory):
    """One flip through the route's handler, as the page posts it, recorded."""
    from app.config import PairChoice
    from app.context import Context
    from app.sidebar import Settings
    from app.trace_panels import live_render
    from app.view import SpikeRule

    store = TraceStore(tmp_path_factory.mktemp("walk_store"))
    root = core.generate(qwen_pair, PROMPTS[1], core.make_policy("base_only"), max_new_tokens=20, store=store)
    ctx = Context(settings=Settings(store_path=str(store.path), problems_path=None, score="cross_entropy",
                                    scale="linear", rule=SpikeRule(), pair_spec=PairChoice()),
                  pair=qwen_pair, store=store)
    view = live.LiveView(pair=qwen_pair, store=store, then="policy", decode=qwen_pair.token_text,
                         render=partial(live_render, ctx))  # as app/trace_panels.py registers it
    live.SESSIONS.put("walk", view)
    pos = 4
    body = json.dumps({"session": "walk", "key": root.key, "pos": pos, "token": None}).encode()
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    async def inner(scope, receive, send):  # pragma: no cover - the route answers itself
        raise AssertionError("the switch reached Streamlit")

    scope = {"type": "http", "method": "POST", "path": live.ROUTE,
             "headers": [(b"content-type", b"application/json"), (b"host", b"127.0.0.1:8501"),
                         (b"origin", b"http://127.0.0.1:8501")]}
    route = live.LiveRoute(inner)
    with Walk() as walk:
        asyncio.run(route(scope, receive, send))
    messages = [json.loads(line) for m in sent if m["type"] == "http.response.body"
                for line in m["body"].decode().splitlines()]
    return walk, messages, root, store, pos


# What the flip's walk measured (docs/ARCHITECTURE.md, "The walk of one flip"): the switch, then the view.
FLIP_WALK = (("core.io", "core.decoding", "core.evaluation"),
             ("core.annotate", "core.io", "core.instruments", "core.scoring", "core.views"))


def test_the_flip_is_made_and_stored(flip):
    walk, messages, root, store, pos = flip
    kinds = [next(iter(m)) for m in messages]
    assert kinds[0] == "start" and kinds[-2:] == ["done", "stored"], messages
    child = store.get(messages[-1]["stored"])
    assert child.meta["parent"] == root.key and child.key != root.key
    assert messages[-2]["view"]["key"] == child.key


def test_each_stage_of_the_flip_enters_each_room_once(flip):
    walk = flip[0]
    assert len(walk.stages) == 1, walk.stages  # the view was drawn once
    switch, view = walk.entries[:walk.stages[0]], walk.entries[walk.stages[0]:]
    for stage in (switch, view):
        assert len(stage) == len(set(stage)), f"a room entered twice: {stage}"
    assert (tuple(switch), tuple(view)) == FLIP_WALK


def test_no_call_of_the_flip_climbs_back(flip):
    walk = flip[0]
    assert walk.climbs() == []
    hooks = {f"{a} -> {b}: {n}" for a, b, n, handed in walk.calls if handed and a != APP and rank(b) > rank(a)}
    # the recorder saw the climbs that were handed down (so it would have seen others)
    assert {"core.decoding -> core.evaluation: core.evaluation.grading.grade_trace",
            "core.decoding -> core.io: core.io.store.TraceStore.put",
            "core.decoding -> app: app.live.run_switch.<locals>.on_token"} <= hooks, sorted(hooks)


def test_the_child_is_graded_then_stored_once(flip):
    walk = flip[0]
    names = [n for _, _, n, _ in walk.calls]
    puts = [i for i, n in enumerate(names) if n == "core.io.store.TraceStore.put"]
    assert len(puts) == 1, len(puts)
    assert names.index("core.evaluation.grading.grade_trace") < puts[0]


def test_the_recorder_sees_a_climb_that_was_not_handed_down(qwen_pair):
    """Trace._repr_html_ draws through a renderer core/__init__ registered in the record's module: a global
    hook, not one handed down, so it counts as the record climbing into a later room (outside the flip)."""
    trace = core.generate(qwen_pair, PROMPTS[0], core.make_policy("base_only"), max_new_tokens=4)
    with Walk() as walk:
        trace._repr_html_()
    assert any(c.startswith("core.trace -> ") for c in walk.climbs()), walk.climbs()
