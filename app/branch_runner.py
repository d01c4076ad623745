"""The Trace page's queued-branch runner: a branch or a fan queued by the selection panel
(`app/selection_panel.py`) runs here, in a full run with a progress bar and a Cancel button."""

from __future__ import annotations

import streamlit as st

from app import actions, resources, state
from app.branch_panels import COLS_KEY
from app.context import Context
from app.view import md_escape
from core.errors import ForkpointError
from core.views.presentation import no_change_line, outcome_line


def run_pending(ctx: Context) -> None:
    """Run a queued branch with a progress bar; the Cancel button interrupts it (nothing is stored)."""
    ss = st.session_state
    job = ss.get("pending")
    if not job:
        return
    slot = st.empty()
    box = slot.container(border=True)
    where = f"token #{job['pos']}" + ("" if job.get("token") is None else f" with token id {job['token']}")
    box.markdown(f"**Generating {job['n']} alternatives from token #{job['pos']}** …" if job.get("kind") == "fan"
                 else f"**Generating a branch at {where}** …")
    if box.button("Cancel", key="cancel_pending"):
        ss["pending"] = None
        state.notice("info", "Branch cancelled; nothing was stored.")
        st.rerun()
    if ctx.pair is None:
        ss["pending"] = None
        box.error("No model pair is loaded; load one in the sidebar to branch.")
        return
    bar = box.progress(0.0, text="Generating the branch: starting")

    def progress(done: int, total: int) -> None:
        bar.progress(min(1.0, done / max(total, 1)), text=f"Generating the branch: {done} / {total} tokens")

    s = ctx.settings
    if job.get("kind") == "fan":
        if _run_fan(ctx, job, box, progress):
            slot.empty()
        return
    try:
        parent = resources.load_trace(s.store_path, job["parent"])
        child = actions.run_branch(ctx.pair, ctx.store, parent, job["pos"], job["token"], job["max_new_tokens"],
                                   progress=progress, rest=job.get("rest") or (), **(job.get("sampling") or {}))
    except ForkpointError as err:
        ss["pending"] = None
        box.error(f"Could not branch: {err}")
        return
    ss["pending"] = None
    if child.key == parent.key:  # the branch changes no token: core gives the parent back, nothing is stored
        slot.empty()
        state.notice("info", md_escape(f"#{job['pos']}: " + no_change_line(parent, int(job["pos"]),
                                                                         resources.decoder(ctx.pair, parent)), 300))
        return
    ss["compare"] = {"parent": parent.key, "child": child.key, "pos": job["pos"]}
    ss["sel_pos"] = job["pos"]
    slot.empty()
    state.notice("success", f"Branch stored ({len(child)} tokens, {md_escape(outcome_line(child), 200)}).")


def _run_fan(ctx: Context, job: dict, box, progress) -> bool:
    """Make a queued fan (actions.run_fan) and put its traces side by side with their parent (False: it
    failed, and `box` says why)."""
    ss = st.session_state
    try:
        parent = resources.load_trace(ctx.settings.store_path, job["parent"])
        kids, new = actions.run_fan(ctx.pair, ctx.store, parent, job["pos"], job["n"], job["temperature"],
                                    then=job.get("then", "policy"), progress=progress)
    except ForkpointError as err:
        ss["pending"] = None
        box.error(f"Could not make the alternatives: {md_escape(err, 400)}")
        return False
    ss["pending"] = None
    ss["compare"] = None
    keys = list(dict.fromkeys(k.key for k in kids if k.key != parent.key))
    ss["sel_pos"] = job["pos"]
    if not keys:
        state.notice("info", f"All {job['n']} samples from token #{job['pos']} wrote the open trace's own tokens at "
                             f"temperature {job['temperature']:g}: nothing new was stored. Try a higher temperature, "
                             "or a token where the reasoner writes something else (n / p walk them).")
        return True
    ss[COLS_KEY] = {"parent": parent.key, "keys": keys}
    same = job["n"] - len(keys)
    state.notice("success", f"{fan_stored(len(keys), sum(k in new for k in keys), job['pos'])}: side by side below the "
                            "text and as siblings in the branch graph."
                            + (f" {same} of the {job['n']} samples repeated the open trace or another sample." if same
                               else ""))
    return True


def fan_stored(n: int, new: int, pos: int) -> str:
    """How many of a fan's `n` alternatives were made now (`new`) and how many were in the store already."""
    what = f"{n} alternative{'' if n == 1 else 's'} from token #{pos}"
    if new == n:
        return f"{what} stored"
    if new == 0:
        return f"{what}, {'it' if n == 1 else 'all'} already stored (the same samples were drawn before)"
    return f"{what}: {new} new, {n - new} already stored"
