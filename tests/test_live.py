"""The switchboard's live route (app/live.py), driven as the ASGI server drives it: the request's checks,
and a switch streamed line by line — the start, each new token's text, the finished view, then "stored" —
whose child is the trace `core`'s set_switches makes, graded and stored.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from test_decoding import PROMPTS

import core
from app import live
from core.decoding.takeover import flipped, set_switches
from core.io.store import TraceStore


HOST = b"127.0.0.1:8501"
SAME_ORIGIN = b"http://" + HOST  # what a browser sends with the page's own fetch


def _call(app, method: str = "POST", path: str = live.ROUTE, body: bytes = b"",
          content_type: bytes = b"application/json", on_send=None, origin: bytes | None = SAME_ORIGIN,
          host: bytes = HOST) -> tuple[int, list[bytes], list[str]]:
    """One HTTP request through the ASGI app, as the page's fetch sends it (Host, Origin): (status, body chunks,
    what reached the inner app); `on_send` sees each message as the server sends it."""
    sent: list[dict] = []
    chunks = [{"type": "http.request", "body": body[:7], "more_body": True},
              {"type": "http.request", "body": body[7:], "more_body": False}]

    async def receive():
        return chunks.pop(0)

    async def send(message):
        sent.append(message)
        if on_send is not None:
            on_send(message)

    headers = [(b"content-type", content_type), (b"host", host)] + ([(b"origin", origin)] if origin is not None else [])
    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    asyncio.run(app(scope, receive, send))
    status = next((m["status"] for m in sent if m["type"] == "http.response.start"), None)
    return status, [m["body"] for m in sent if m["type"] == "http.response.body"], inner_calls


inner_calls: list[str] = []


async def _inner(scope, receive, send):
    inner_calls.append(scope["path"])
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


@pytest.fixture(scope="module")
def setup(qwen_pair, tmp_path_factory):
    store = TraceStore(tmp_path_factory.mktemp("live_store"))
    root = core.generate(qwen_pair, PROMPTS[1], core.make_policy("base_only"), max_new_tokens=20, store=store)
    drawn: list[str] = []
    text_sent = threading.Event()

    def render(trace):
        # the finished view is made after generation ends: a token's text must have left the server by then
        drawn.append((trace.key, text_sent.wait(timeout=30)))
        return {"key": trace.key, "n": len(trace)}

    view = live.LiveView(pair=qwen_pair, store=store, then="policy", decode=qwen_pair.token_text, render=render)
    live.SESSIONS.put("s3cret", view)
    return store, root, drawn, text_sent


def _request(**fields) -> bytes:
    return json.dumps({"session": "s3cret", **fields}).encode()


def test_other_requests_pass_through_and_bad_ones_are_refused(setup) -> None:
    store, root, _, _ = setup
    app = live.LiveRoute(_inner)
    assert live.serving()
    inner_calls.clear()
    assert _call(app, "GET", "/_stcore/health")[0] == 204 and inner_calls == ["/_stcore/health"]
    inner_calls.clear()
    assert _call(app, "GET", body=b"")[0] == 405  # a link or an <img> cannot switch
    assert _call(app, body=_request(key=root.key, pos=1, token=None), content_type=b"text/plain")[0] == 405
    assert _call(app, body=b"{not json")[0] == 400
    assert _call(app, body=_request(key=root.key, pos="1", token=None))[0] == 400
    assert _call(app, body=_request(key=root.key, pos=True, token=None))[0] == 400
    assert _call(app, body=b'{"session": "' + b"x" * 5000 + b'"}')[0] == 413
    assert _call(app, body=json.dumps({"session": "guess", "key": root.key, "pos": 1, "token": None}).encode())[0] == 403
    assert inner_calls == []  # none of these reached Streamlit
    before = sorted(store.keys())
    status, chunks, _ = _call(app, body=_request(key=root.key, pos=len(root) + 5, token=None))
    messages = [json.loads(line) for line in b"".join(chunks).decode().splitlines()]
    assert status == 200 and "outside this trace" in messages[0]["error"] and len(messages) == 1
    assert sorted(store.keys()) == before  # nothing stored
    status, chunks, _ = _call(app, body=_request(key="0" * 32, pos=1, token=None))
    assert "error" in json.loads(b"".join(chunks).decode().splitlines()[0])


@pytest.mark.parametrize("token", [None, "alternative"])
def test_a_switch_streams_its_tokens_then_the_view_then_stored(setup, qwen_pair, token) -> None:
    store, root, drawn, text_sent = setup
    text_sent.clear()
    pos = 4
    if token == "alternative":
        token = next(int(t) for t in root.topk["base"][0][pos] if int(t) != int(root.token_ids[pos]))
        wanted = {pos: token}
    else:
        wanted = flipped(root, pos)
    status, chunks, _ = _call(live.LiveRoute(_inner), body=_request(key=root.key, pos=pos, token=token),
                              on_send=lambda m: text_sent.set() if b'"text"' in m.get("body", b"") else None)
    messages = [json.loads(line) for line in b"".join(chunks).decode().splitlines()]
    assert status == 200
    kinds = [next(iter(m)) for m in messages]
    assert kinds[0] == "start" and messages[0]["start"] == pos
    assert kinds[-2:] == ["done", "stored"] and set(kinds[1:-2]) == {"text"}
    expected = set_switches(qwen_pair, root, wanted)
    key = messages[-1]["stored"]
    assert key == messages[-2]["done"] == expected.key
    assert drawn[-1] == (key, True), "no token was sent before generation ended: nothing streamed"
    child = store.get(key)
    assert child.token_ids.tolist() == expected.token_ids.tolist()
    assert [m["text"] for m in messages[1:-2]] == [qwen_pair.token_text(int(t)) for t in child.token_ids[pos:]]
    assert child.meta["parent"] == root.key and "correct" in child.meta  # graded before it was stored
    assert messages[-2]["view"] == {"key": key, "n": len(child)}


def test_typed_text_past_the_context_is_said_between_the_view_and_stored(setup, qwen_pair) -> None:
    store, root, _, text_sent = setup
    text_sent.set()
    text = "seven plus " * 90  # far more tokens than the tiny pair's context holds after the prompt
    status, chunks, _ = _call(live.LiveRoute(_inner), body=_request(key=root.key, pos=3, token=None, text=text))
    messages = [json.loads(line) for line in b"".join(chunks).decode().splitlines()]
    assert status == 200 and [next(iter(m)) for m in messages][-3:] == ["done", "note", "stored"], messages[-3:]
    child = store.get(messages[-1]["stored"])
    asked = len(qwen_pair.encode(text))
    assert messages[-2]["note"] == live.typed_note(child, 3, asked) and f"of its {asked} tokens fit" in messages[-2]["note"]


# -- issue 33.5: the route's edges ---------------------------------------------------------------------------


def test_deep_nesting_is_refused_before_parsing(setup) -> None:
    store, root, _, _ = setup
    app = live.LiveRoute(_inner)
    for depth in (5, 990, 2000):  # 990+ levels in 2 kB raised RecursionError (HTTP 500) before the token check
        body = b"[" * depth + b"]" * depth
        assert len(body) <= live.MAX_BODY and _call(app, body=body)[0] == 400
    nested = json.dumps({"session": "s3cret", "key": root.key, "pos": 1, "token": None, "x": [[[[[1]]]]]}).encode()
    assert _call(app, body=nested)[0] == 400
    assert _call(app, body=b"[1, 2]")[0] == 400  # not an object


def test_origin_content_type_and_path_must_match_exactly(setup) -> None:
    store, root, _, _ = setup
    app = live.LiveRoute(_inner)
    ok = _request(key=root.key, pos=len(root) + 5, token=None)  # a valid request (answered with an error line)
    assert _call(app, body=ok)[0] == 200
    for origin in (b"http://evil.example", b"null", None, b"http://127.0.0.1:8502", b"https://evil.example:8501"):
        assert _call(app, body=ok, origin=origin)[0] == 403, origin
    assert _call(app, body=ok, origin=b"HTTP://127.0.0.1:8501")[0] == 200  # the scheme and host are case-blind
    for content_type in (b"application/jsonp", b"application/json-patch+json", b"text/plain", b""):
        assert _call(app, body=ok, content_type=content_type)[0] == 405, content_type
    assert _call(app, body=ok, content_type=b"Application/JSON; charset=utf-8")[0] == 200
    inner_calls.clear()
    for path in ("/x/_forkpoint/switch", "/_forkpoint/switch/", "/static/_forkpoint/switch"):
        assert _call(app, body=ok, path=path)[0] == 204, path  # not this route: Streamlit answers (404 there)
    assert inner_calls == ["/x/_forkpoint/switch", "/_forkpoint/switch/", "/static/_forkpoint/switch"]


def test_a_token_is_gone_when_its_pages_session_ends(setup, monkeypatch) -> None:
    store, root, _, _ = setup
    alive = {"page-1": True, "page-2": True}
    monkeypatch.setattr(live, "_session_alive", lambda sid: alive.get(sid, False))
    sessions = live._Sessions()
    view = live.SESSIONS.get("s3cret")
    monkeypatch.setattr(live, "_current_session", lambda: "page-1")
    sessions.put("tok-1", view)
    monkeypatch.setattr(live, "_current_session", lambda: "page-2")
    sessions.put("tok-2", view)
    assert sessions.get("tok-1") is view and sessions.get("tok-2") is view
    alive["page-1"] = False  # the first page closed: its token no longer answers, the other one still does
    assert sessions.get("tok-1") is None and sessions.get("tok-2") is view
    monkeypatch.setattr(live, "SESSIONS", sessions)
    assert _call(live.LiveRoute(_inner), body=json.dumps({"session": "tok-1", "key": root.key, "pos": 1,
                                                          "token": None}).encode())[0] == 403
    alive["page-2"] = False
    monkeypatch.setattr(live, "_current_session", lambda: "page-3")
    alive["page-3"] = True
    sessions.put("tok-3", view)  # registering sweeps the dead ones
    assert list(sessions._views) == ["tok-3"]


def test_done_comes_only_after_the_child_is_stored(setup, qwen_pair, monkeypatch) -> None:
    from core.errors import WriteError

    store, root, _, _ = setup

    def full(*args, **kwargs):
        raise WriteError("Cannot write trace x: the disk is full; it was not written")

    monkeypatch.setattr(store, "put", full)  # core's one write of the new child fails
    before = sorted(store.keys())
    status, chunks, _ = _call(live.LiveRoute(_inner), body=_request(key=root.key, pos=6, token=None))
    messages = [json.loads(line) for line in b"".join(chunks).decode().splitlines()]
    kinds = [next(iter(m)) for m in messages]
    assert status == 200 and "done" not in kinds and "stored" not in kinds and kinds[-1] == "error"
    assert "not stored" in messages[-1]["error"] and "disk is full" in messages[-1]["error"]
    assert sorted(store.keys()) == before
