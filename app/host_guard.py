"""`forkpoint app` starts Streamlit through here: Streamlit's own server plus a Host check on plain HTTP.

Streamlit checks `server.allowedHosts` on the WebSocket only, so `/`, `/_stcore/health`, `/_stcore/metrics`
and the static files answer any Host header, and a DNS-rebinding page (attacker.example re-resolved to
127.0.0.1) can read them. `HostGuard` refuses those requests with 403 by the same rule Streamlit applies
to the WebSocket (`server.allowedHosts`; empty, as when bound to 0.0.0.0, allows every Host). It is the
first middleware of Streamlit's Starlette stack, installed before the server starts; the second is the
switchboard's live route (app/live.py), so it too sits behind the Host check.

    python -m app.serve run app/main.py --server.allowedHosts 127.0.0.1 ... -- <app arguments>
"""

from __future__ import annotations

import sys
from typing import Any

REFUSED = b"Host not allowed: this forkpoint app answers only the address it is bound to (server.allowedHosts).\n"


class HostGuard:
    """ASGI middleware: an HTTP request whose Host is not allowed gets 403 and never reaches Streamlit."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not host_allowed(scope):
            await send({"type": "http.response.start", "status": 403,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                    (b"content-length", str(len(REFUSED)).encode())]})
            await send({"type": "http.response.body", "body": REFUSED})
            return
        await self.app(scope, receive, send)


def host_allowed(scope: dict[str, Any]) -> bool:
    """Whether the request's Host header passes `server.allowedHosts` (Streamlit's own WebSocket rule)."""
    from streamlit.web.server.starlette.starlette_websocket import is_host_allowed

    hosts = [value for name, value in scope.get("headers", []) if name == b"host"]
    if len(hosts) > 1:  # two Host headers: which one a proxy or browser meant cannot be told
        return False
    return is_host_allowed(hosts[0].decode("latin-1") if hosts else None)


def install() -> None:
    """Put HostGuard first in the middleware of every Starlette app Streamlit creates from now on, then the
    switchboard's live route (app/live.py)."""
    from streamlit.web.server.starlette import starlette_app

    original = starlette_app.create_streamlit_middleware
    if getattr(original, "forkpoint_host_guard", False):
        return

    def with_guard() -> list[Any]:
        from starlette.middleware import Middleware

        from app.live import LiveRoute

        return [Middleware(HostGuard), Middleware(LiveRoute), *original()]

    with_guard.forkpoint_host_guard = True  # type: ignore[attr-defined]
    starlette_app.create_streamlit_middleware = with_guard


def main() -> None:
    """`python -m app.serve <streamlit arguments>`: `streamlit <arguments>` with the guard installed."""
    install()
    from streamlit.web.cli import main as streamlit_main

    streamlit_main(args=sys.argv[1:], prog_name="streamlit")


if __name__ == "__main__":
    main()
