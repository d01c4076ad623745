"""`forkpoint app`'s server: Streamlit's public `st.App` around app/main.py, with the Host check on plain HTTP
(app/host_guard.py) and a shared link's first paint (app/first_paint.py) as its middleware, and the switchboard's
live route (app/live.py) as its route.

    streamlit run app/serve.py --server.address 127.0.0.1 --server.allowedHosts 127.0.0.1 -- <app arguments>
    uvicorn app.serve:streamlit_app --host 127.0.0.1        # or any ASGI server (app arguments: none, the demo)

`forkpoint app` runs the first line. `streamlit run app/main.py` still serves the app, without the live route
(a click on the switchboard then switches through a fragment rerun) and without the Host check on plain HTTP.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run app/serve.py` puts app/ on the path, not the repo root
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.routing import Route  # noqa: E402

from app.first_paint import FirstPaint  # noqa: E402
from app.host_guard import HostGuard  # noqa: E402
from app.live import ROUTE, LiveRoute  # noqa: E402

MAIN = ROOT / "app" / "main.py"


async def _not_found(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """What the live route passes on: nothing, since the route only sees its own path."""
    await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"not found\n"})


def live_path() -> str:
    """The live route's path under `server.baseUrlPath` (where the Trace page posts its switches)."""
    from streamlit import config

    base = (config.get_option("server.baseUrlPath") or "").strip("/")
    return f"/{base}{ROUTE}" if base else ROUTE


def routes() -> list[Route]:
    """The routes `st.App` serves beside Streamlit's own: the switchboard's live route."""
    return [Route(live_path(), LiveRoute(_not_found))]


def middleware() -> list[Middleware]:
    """What runs before Streamlit's own middleware on every request: the Host check (app/host_guard.py), then a
    shared link's first paint (app/first_paint.py: the trace's text in the page's shell)."""
    return [Middleware(HostGuard), Middleware(FirstPaint)]


def _preload() -> None:
    """The pair the app was started with, into the process's cache (app/resources.load_pair, st.cache_resource:
    the first session finds it there, or waits on the same load); then the store's full read."""
    # deferred: app.resources pulls in torch and transformers, which the launcher's module import must not wait on
    from app import first_paint, resources
    from app.config import parse_args, script_args

    try:
        first_paint.warm()  # a shared link's first shell builds its token view with these modules
    except Exception as err:  # noqa: BLE001 - the first shell imports them itself
        logging.getLogger(__name__).info("first paint warm-up failed: %s", err)
    config = parse_args(script_args(sys.argv))
    try:
        resources.load_pair(config.pair)
    except Exception as err:  # noqa: BLE001 - the first session loads it again and shows the error
        logging.getLogger(__name__).info("pair preload failed: %s", err)
    try:  # then the store's full read, which the Problems page's damaged-file list waits on (5.5 s at 5,600 traces)
        path = resources.store_path(config.store)
        if resources.get_store(path).exists():
            resources.deep_check(path).result(wait_s=0)
    except Exception as err:  # noqa: BLE001 - the Problems page starts the read itself and shows any error
        logging.getLogger(__name__).info("store read-ahead failed: %s", err)


@asynccontextmanager
async def lifespan(_app: Any) -> AsyncIterator[None]:
    """At server start, load the models in the background: a shared link opened right after `forkpoint app`
    starts waits for them less (its first page drew nothing until they were loaded); then start the store's full
    read (app/resources.DeepCheck). Startup is not delayed."""
    threading.Thread(target=_preload, name="forkpoint-preload", daemon=True).start()
    yield


# Streamlit finds this by name (`streamlit run app/serve.py`); an ASGI server imports it (`app.serve:streamlit_app`).
streamlit_app = st.App(MAIN, routes=routes(), middleware=middleware(), lifespan=lifespan)
