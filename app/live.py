"""The switchboard's live channel: a click in the token view posts the switch here, and the new continuation
comes back as it is generated, then the finished trace's view, without waiting for a Streamlit rerun.

    POST /_forkpoint/switch  {"session": s, "key": parent, "pos": p, "token": id | null, "text": typed | null}
    -> application/x-ndjson: {"start": p}, {"text": "..."} ..., {"done": key, "view": {...}}, {"stored": key}
       or {"same": "the reasoner writes ' x' here too: nothing changes"} (a switch that changes no token:
       no new trace, no history step) or {"error": "..."}

Streamlit reruns a page to change it: a click, a script run and a redraw of every element (0.4-0.5 s on the
demo pair, five times the models' own work). Here the page's token view (app/components, token_view.js)
reads the response of one HTTP request instead and re-flows in place; once the child is stored it tells
Streamlit, whose fragment run then updates the rest of the page (header, switch list, branch graph, URL).
`forkpoint app` serves the route (app/serve.py); without it the view falls back to the rerun path
(app/switchboard.py), which applies the same `switch_request` through the same `core` call.

Safety: the route answers only a session the Trace page registered (a random token that reaches the page
over Streamlit's own WebSocket), only a JSON POST (a cross-site form cannot send one without a CORS
preflight, which this route never grants), behind app/serve.py's Host check. The text it returns is data
for `textContent`; the view's HTML is core's escaped heatmap.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.decoding.takeover import flipped, set_switches, switches_in_force
from core.errors import ForkpointError
from core.evaluation.grading import grade_trace, graded_put
from core.trace import Trace

ROUTE = "/_forkpoint/switch"
MAX_BODY = 4096  # bytes: a switch request is a few numbers
MAX_SESSIONS = 32  # browser sessions remembered (oldest forgotten first)
MAX_TYPED = 1000  # characters of typed text one edit may carry


@dataclass(frozen=True)
class LiveView:
    """What a switch needs from the page that asks for it: the pair and store, who decides after the
    switch, the token decoder, and how a finished trace is drawn (the token view's payload)."""

    pair: Any
    store: Any
    then: str
    decode: Callable[[int], str] | None
    render: Callable[[Trace], dict[str, Any]] | None = None  # None for the rerun path, which draws it itself


class _Sessions:
    """An explicit cache: each browser session's latest LiveView, newest last, at most MAX_SESSIONS."""

    def __init__(self) -> None:
        self._views: OrderedDict[str, LiveView] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, session: str, view: LiveView) -> None:
        with self._lock:
            self._views[session] = view
            self._views.move_to_end(session)
            while len(self._views) > MAX_SESSIONS:
                self._views.popitem(last=False)

    def get(self, session: str) -> LiveView | None:
        with self._lock:
            return self._views.get(session)


SESSIONS = _Sessions()
_ONE_AT_A_TIME = threading.Lock()  # the models and their held caches serve one decoder at a time
_SERVED = threading.Event()  # set once LiveRoute is part of this process's server


def serving() -> bool:
    """Whether this process's server answers ROUTE (started through `forkpoint app` / app/serve.py)."""
    return _SERVED.is_set()


def switch_request(parent: Trace, pos: int, token: int | None, typed: list[int] | None = None
                   ) -> dict[int, int | list[int] | str]:
    """The switches a click asks for: typed token ids replace the text from `pos` on (the switches before it
    kept; the rest is written anew), a token id forces that token at `pos` (other switches kept), a plain
    click flips `pos` (core.decoding.takeover.flipped)."""
    if typed:
        return {**{p: w for p, w in switches_in_force(parent).items() if p < int(pos)}, int(pos): [int(i) for i in typed]}
    if token is not None:
        return {**switches_in_force(parent), int(pos): int(token)}
    return flipped(parent, int(pos))


def unchanged(parent: Trace, wanted: dict[int, Any], then: str) -> int | None:
    """The position of a flip that cannot change a token (None when it may): on a greedy trace whose own policy
    decides the rest, a base token handed to the reasoner whose top token is that same token, or a takeover
    handed back to a base whose top token it is. Such a switch is answered without decoding."""
    current = switches_in_force(parent)
    changed = [p for p in set(current) | set(wanted) if current.get(p) != wanted.get(p)]
    temperature = float((parent.meta.get("sampling") or {}).get("temperature") or 0.0)
    if len(changed) != 1 or then != "policy" or temperature > 0 or not 0 <= changed[0] < len(parent):
        return None
    pos = changed[0]
    who, source = wanted.get(pos), str(parent.source[pos])
    side = "reason" if who == "reason" and source == "base" else "base" if who == "base" and source == "reason" else None
    if side is None:
        return None
    return pos if int(parent.topk[side][0][pos][0]) == int(parent.token_ids[pos]) else None


def same_text(parent: Trace, pos: int, decode: Callable[[int], str] | None = None) -> str:
    """What the page says for a switch that changes no token."""
    who = "base" if str(parent.source[pos]) == "reason" else "reasoner"
    tok = int(parent.token_ids[pos])
    return f"the {who} writes {(decode(tok) if decode is not None else parent.tokens[pos])!r} here too: nothing changes"


def is_same(parent: Trace, child: Trace) -> bool:
    """Whether a switch's child is its parent again (core returns the parent itself; an older core a trace with
    the parent's tokens)."""
    return child is parent or child.key == parent.key or (
        len(child) == len(parent) and bool((child.token_ids == parent.token_ids).all()))


def run_switch(view: LiveView, parent: Trace, wanted: dict[int, int | str],
               on_text: Callable[[int, str], None] | None = None) -> Trace:
    """Apply `wanted` to `parent` through core and grade the child (a child stored before is read back, a new
    one is not written yet: `keep` does that); `on_text(pos, text)` sees each new token's text as it is
    decided. One switch runs at a time in this process."""
    decode = view.decode

    def on_token(pos: int, token: int, source: str) -> None:
        if on_text is not None:
            on_text(pos, decode(token) if decode is not None else f"#{token}")

    with _ONE_AT_A_TIME:
        child = set_switches(view.pair, parent, wanted, store=_ReadOnly(view.store), then=view.then,
                             on_token=on_token)
    grade_trace(child)
    return child


def keep(view: LiveView, child: Trace) -> Trace:
    """Store the graded child (once; a stored one only gains a grade it lacked)."""
    return graded_put(view.store, child)


class _ReadOnly:
    """The store as the switch sees it: a child stored before is reused; a new one is written by `keep`,
    once and graded, after its view has gone to the page (not first ungraded, then again graded)."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __contains__(self, key: object) -> bool:
        return key in self._store

    def get(self, key: str) -> Trace:
        return self._store.get(key)

    def put(self, trace: Trace, **_: Any) -> None:
        return None


def _work(view: LiveView, key: str, pos: int, token: int | None, emit: Callable[[dict | None], None],
          text: str | None = None) -> None:
    """The request's job, on a worker thread: stream the new tokens, then the view, then "stored" (or "same" for
    a switch that changes no token: nothing is stored)."""
    started = [False]

    def on_text(p: int, text: str) -> None:
        if not started[0]:
            started[0] = True
            emit({"start": p})
        emit({"text": text})

    try:
        parent = view.store.get(key)
        if not 0 <= pos < len(parent):
            raise ForkpointError(f"Token #{pos} is outside this trace (0..{len(parent) - 1})")
        typed = view.pair.encode(text) if text else None
        if text and not typed:
            raise ForkpointError(f"The typed text {text[:40]!r} has no tokens")
        wanted = switch_request(parent, pos, token, typed)
        still = unchanged(parent, wanted, view.then)
        if still is not None:
            emit({"same": same_text(parent, still, view.decode)})
            return
        child = run_switch(view, parent, wanted, on_text)
        if is_same(parent, child):
            emit({"same": same_text(parent, pos, view.decode)})
            return
        emit({"done": child.key, "view": view.render(child)})  # the route's views come from live_offer: drawn
        emit({"stored": keep(view, child).key})
    except ForkpointError as err:
        emit({"error": str(err)})
    except Exception as err:  # noqa: BLE001 - the page must hear of any failure, then fall back to a rerun
        emit({"error": f"{type(err).__name__}: {err}"})
    finally:
        emit(None)


def _parse(body: bytes) -> tuple[str, str, int, int | None, str | None]:
    req = json.loads(body.decode("utf-8"))
    session, key, pos, token, text = req["session"], req["key"], req["pos"], req.get("token"), req.get("text")
    if not (isinstance(session, str) and isinstance(key, str) and type(pos) is int
            and (token is None or type(token) is int) and (text is None or (isinstance(text, str)
                                                                              and len(text) <= MAX_TYPED))):
        raise ValueError("bad field types")
    return session, key, pos, token, text or None


class LiveRoute:
    """ASGI middleware: answers POST ROUTE itself (streamed NDJSON); every other request goes on to Streamlit."""

    def __init__(self, app: Any) -> None:
        self.app = app
        _SERVED.set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope.get("path", "").endswith(ROUTE):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        if scope.get("method") != "POST" or not headers.get(b"content-type", b"").startswith(b"application/json"):
            await _plain(send, 405, b"POST application/json only\n")
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > MAX_BODY:
                await _plain(send, 413, b"request too large\n")
                return
            if not message.get("more_body"):
                break
        try:
            session, key, pos, token, text = _parse(body)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            await _plain(send, 400, b"expected {session, key, pos, token, text}\n")
            return
        view = SESSIONS.get(session)
        if view is None:
            await _plain(send, 403, b"unknown session: reload the page\n")
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-ndjson; charset=utf-8"),
                                (b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff")]})
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        job = loop.run_in_executor(None, _work, view, key, pos, token,
                                   lambda msg: loop.call_soon_threadsafe(queue.put_nowait, msg), text)
        done = False
        while not done:
            lines = [await queue.get()]
            while not queue.empty():  # whatever else is ready goes in the same chunk
                lines.append(queue.get_nowait())
            done = lines[-1] is None
            chunk = "".join(json.dumps(m, ensure_ascii=False) + "\n" for m in lines if m is not None)
            await send({"type": "http.response.body", "body": chunk.encode("utf-8"), "more_body": not done})
        await job


async def _plain(send: Any, status: int, text: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(text)).encode())]})
    await send({"type": "http.response.body", "body": text})
