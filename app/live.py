"""The switchboard's live channel: a click in the token view posts the switch here, and the new continuation
comes back as it is generated, then the finished trace's view, without waiting for a Streamlit rerun.

    POST /_forkpoint/switch  {"session": s, "key": parent, "pos": p, "token": id | null, "text": typed | null}
    -> application/x-ndjson: {"start": p}, {"text": "..."} ..., {"done": key, "view": {...}}, {"stored": key}
       (and {"note": "..."} when typed text did not all fit) or {"same": "the reasoner writes ' x' here too:
       nothing changes"} (a switch that changes no token:
       no new trace, no history step) or {"error": "..."}

Streamlit reruns a page to change it: a click, a script run and a redraw of every element (0.4-0.5 s on the
demo pair, five times the models' own work). Here the page's token view (app/components, token_view.js)
reads the response of one HTTP request instead and re-flows in place; once the child is stored it tells
Streamlit, whose fragment run then updates the rest of the page (header, switch list, branch graph, URL).
`forkpoint app` serves the route (app/serve.py); without it the view falls back to the rerun path
(app/switchboard.py), which applies the same `switch_request` through the same `core` call.

Safety: the route answers only its exact path, only a POST whose content type is exactly application/json
(a cross-site form cannot send one without a CORS preflight, which this route never grants) and whose Origin
is the app's own address (the Host that app/serve.py's Host check let through), only a session the Trace
page registered (a random token that reaches the page over Streamlit's own WebSocket, valid while that
page's Streamlit session lives), and a body nested at most MAX_DEPTH deep (checked before parsing, so no
recursion limit is reachable). "done" is sent once the child is stored (else an error saying it was not).
The text it returns is data for `textContent`; the view's HTML is core's escaped heatmap.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.decoding.caches import CACHES, warm_caches
from core.decoding.takeover import flipped, set_switches, switches_in_force
from core.errors import ForkpointError, WriteError
from core.evaluation.grading import grade_trace, graded_put
from core.io.foreign import json_depth_exceeds
from core.settings import check_text
from core.trace import Trace
from core.views.presentation import no_change_line

ROUTE = "/_forkpoint/switch"
MAX_BODY = 4096  # bytes: a switch request is a few numbers
MAX_DEPTH = 4  # JSON nesting: a switch request is one flat object
MAX_SESSIONS = 32  # browser sessions remembered (oldest forgotten first)
MAX_FIELD = 256  # characters of the session token or a trace key


def _current_session() -> str | None:
    """The Streamlit session running this script (None outside a script run, e.g. in a test)."""
    try:
        from streamlit.runtime.scriptrunner import get_script_run_ctx

        ctx = get_script_run_ctx(suppress_warning=True)
    except Exception:  # noqa: BLE001 - no Streamlit runtime here
        return None
    return None if ctx is None else ctx.session_id


def _session_alive(session_id: str) -> bool:
    """Whether a Streamlit session is still open (a page closed or reloaded ends its session)."""
    from streamlit.runtime import Runtime

    return not Runtime.exists() or Runtime.instance().is_active_session(session_id)
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
    """An explicit cache: each page's token -> (its Streamlit session, its latest LiveView), newest last, at
    most MAX_SESSIONS. A token is tied to the Streamlit session that registered it and is gone when that
    session ends (checked on every lookup; dead ones are swept on every registration)."""

    def __init__(self) -> None:
        self._views: OrderedDict[str, tuple[str | None, LiveView]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, session: str, view: LiveView) -> None:
        owner = _current_session()
        with self._lock:
            for token, (who, _) in list(self._views.items()):
                if who is not None and not _session_alive(who):
                    del self._views[token]
            self._views[session] = (owner, view)
            self._views.move_to_end(session)
            while len(self._views) > MAX_SESSIONS:
                self._views.popitem(last=False)

    def get(self, session: str) -> LiveView | None:
        with self._lock:
            found = self._views.get(session)
            if found is None:
                return None
            owner, view = found
            if owner is not None and not _session_alive(owner):  # its page has closed
                del self._views[session]
                return None
            return view


SESSIONS = _Sessions()
_ONE_AT_A_TIME = threading.Lock()  # the models and their held caches serve one decoder at a time
_SERVED = threading.Event()  # set once LiveRoute is part of this process's server


log = logging.getLogger(__name__)
_WARMING: set[str] = set()  # trace keys whose model states are being held in the background


def warm(pair: Any, trace: Trace) -> threading.Thread | None:
    """In the background, hold the open trace's model states (core.decoding.caches.warm_caches: one prefill per
    model), so that its first switch resumes from them as later switches do; nothing when they are held or on
    their way. It runs as a switch does, one at a time: a click meanwhile waits for it, then needs no prefill."""
    key = trace.key
    if pair is None or key is None or key in _WARMING or CACHES.get(key) is not None:
        return None
    _WARMING.add(key)

    def run() -> None:
        try:
            with _ONE_AT_A_TIME:
                warm_caches(pair, trace)
        except Exception as err:  # noqa: BLE001 - a warm-up only: the switch itself prefills and reports
            log.info("cache warm-up of %s failed: %s", key, err)
        finally:
            _WARMING.discard(key)

    thread = threading.Thread(target=run, name="forkpoint-warm-caches", daemon=True)
    thread.start()
    return thread


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


def same_text(parent: Trace, pos: int, text: str | None = None, decode: Callable[[int], str] | None = None) -> str:
    """What the page says for a switch that changes no token (core.views.presentation.no_change_line)."""
    if text:
        return f"{text[:40]!r} is what stands there already: nothing changes"
    return no_change_line(parent, pos, decode)


def typed_note(child: Trace, pos: int, asked: int, chars_cut: int = 0) -> str | None:
    """What the page says when typed text did not all go in: cut to MAX_TYPED characters, or its `asked` tokens
    forced from `pos` not all within the models' context (None when all of it is there)."""
    kept = 0
    while kept < asked and pos + kept < len(child) and str(child.source[pos + kept]) == "forced":
        kept += 1
    parts = [f"cut to its first {MAX_TYPED:,} characters"] if chars_cut > 0 else []
    if kept < asked:
        parts.append(f"only {kept} of its {asked} tokens fit in the models' context")
    return f"Your text was {' and '.join(parts)}." if parts else None


def run_switch(view: LiveView, parent: Trace, wanted: dict[int, int | str],
               on_text: Callable[[int, str], None] | None = None) -> Trace:
    """Apply `wanted` to `parent` through core: a new child is graded, then stored once (core's `on_trace` and
    `store`); one stored before is read back and graded if it was not; a switch that changes no token gives
    `parent` itself. `on_text(pos, text)` sees each new token's text as it is decided. One switch runs at a
    time in this process."""
    decode = view.decode

    def on_token(pos: int, token: int, source: str) -> None:
        if on_text is not None:
            on_text(pos, decode(token) if decode is not None else f"#{token}")

    with _ONE_AT_A_TIME:
        child = set_switches(view.pair, parent, wanted, store=view.store, on_trace=grade_trace, then=view.then,
                             on_token=on_token)
    grade_trace(child)
    return child


def keep(view: LiveView, child: Trace) -> Trace:
    """The graded child in the store (`run_switch` stored a new one; an older stored one gains a grade it lacked)."""
    return graded_put(view.store, child)


def _work(view: LiveView, key: str, pos: int, token: int | None, emit: Callable[[dict | None], None],
          text: str | None = None) -> None:
    """The request's job, on a worker thread: stream the new tokens, then the view, then "stored" (or "same" for
    a switch that changes no token: core gives the parent back and nothing is stored)."""
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
        try:  # core stores a new child (graded first); an older stored one gains a grade it lacked
            child = run_switch(view, parent, switch_request(parent, pos, token, typed), on_text)
            if child.key == parent.key:  # a switch that changes no token: core gives the parent, stores nothing
                emit({"same": same_text(parent, pos, text, view.decode)})
                return
            stored = keep(view, child)
        except WriteError as err:  # said in this stream: the page never shows a child as made that is not kept
            emit({"error": f"The switched trace was made but not stored: {err}"})
            return
        emit({"done": stored.key, "view": view.render(stored)})  # the route's views come from live_offer: drawn
        note = typed_note(stored, pos, len(typed)) if typed else None
        if note:
            emit({"note": note})
        emit({"stored": stored.key})
    except ForkpointError as err:
        emit({"error": str(err)})
    except Exception as err:  # noqa: BLE001 - the page must hear of any failure, then fall back to a rerun
        emit({"error": f"{type(err).__name__}: {err}"})
    finally:
        emit(None)


def _parse(body: bytes) -> tuple[str, str, int, int | None, str | None]:
    if json_depth_exceeds(body, MAX_DEPTH):  # before json.loads: its recursion limit is never reached
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    req = json.loads(body.decode("utf-8"))
    if not isinstance(req, dict):
        raise ValueError("not an object")
    session, key, pos, token, text = req["session"], req["key"], req["pos"], req.get("token"), req.get("text")
    if not (isinstance(session, str) and isinstance(key, str) and type(pos) is int
            and (token is None or type(token) is int) and (text is None or (isinstance(text, str)
                                                                              and len(text) <= MAX_TYPED))):
        raise ValueError("bad field types")
    for name, value, most in (("session", session, MAX_FIELD), ("key", key, MAX_FIELD), ("typed text", text, MAX_TYPED)):
        if value is None:
            continue
        try:
            check_text(value, f"the live route's {name}", max_chars=most)
        except ForkpointError as err:
            raise ValueError(str(err)) from None
    return session, key, pos, token, text or None


def _media_type(headers: dict[bytes, bytes]) -> bytes:
    """The content type without parameters, lower case: `application/json; charset=utf-8` -> application/json."""
    return headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()


def _same_origin(headers: dict[bytes, bytes]) -> bool:
    """Whether the request's Origin is the app's own address (the Host HostGuard let through): a page of any
    other origin, a sandboxed frame (Origin: null) or a request without an Origin is refused."""
    origin, host = headers.get(b"origin"), headers.get(b"host")
    return bool(origin and host) and origin.lower() in (b"http://" + host.lower(), b"https://" + host.lower())


def _route_paths() -> frozenset[str]:
    """The exact paths this route answers: ROUTE, under Streamlit's server.baseUrlPath when one is set."""
    try:
        from streamlit import config

        base = (config.get_option("server.baseUrlPath") or "").strip("/")
    except Exception:  # noqa: BLE001 - no Streamlit config here
        base = ""
    return frozenset({ROUTE, f"/{base}{ROUTE}"} if base else {ROUTE})


class LiveRoute:
    """ASGI middleware: answers POST ROUTE itself (streamed NDJSON); every other request goes on to Streamlit."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.paths = _route_paths()
        _SERVED.set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path", "") not in self.paths:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        if scope.get("method") != "POST" or _media_type(headers) != b"application/json":
            await _plain(send, 405, b"POST application/json only\n")
            return
        if not _same_origin(headers):
            await _plain(send, 403, b"cross-origin request refused\n")
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
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError):
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
