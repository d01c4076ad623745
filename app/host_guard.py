"""`HostGuard`: the Host check on plain HTTP that `forkpoint app`'s server (app/serve.py) puts first.

Streamlit checks `server.allowedHosts` on the WebSocket only, so `/`, `/_stcore/health`, `/_stcore/metrics`
and the static files answer any Host header, and a DNS-rebinding page (attacker.example re-resolved to
127.0.0.1) can read them. `HostGuard` refuses those requests with 403 by the same rule Streamlit applies
to the WebSocket (`server.allowedHosts`; empty, as when bound to 0.0.0.0, allows every Host). It is the
middleware `st.App` runs before its own, so the switchboard's live route (app/live.py) sits behind it too.
"""

from __future__ import annotations

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
