"""The per-run context every page reads: settings from the sidebar, the loaded pair, the store."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

import core
from app.sidebar import Settings
from core.io.store import TraceStore

_KEY = "_context"


@dataclass
class Context:
    """Settings (plain values), the model pair (None when it failed to load) and the trace store."""

    settings: Settings
    pair: core.ModelPair | None
    store: TraceStore


def set_context(ctx: Context) -> None:
    st.session_state[_KEY] = ctx


def get_context() -> Context:
    """The context main.py built on this session's latest full run."""
    ctx = st.session_state.get(_KEY)
    if ctx is None:
        raise RuntimeError("app context missing: pages run through app/main.py")
    return ctx
