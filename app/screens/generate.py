"""Generate: run a policy (BaseOnly, Guided at a budget, EntropyGated, ...) on chosen problems.

Runs with a progress bar; Cancel interrupts it. Every trace is graded and stored, so it shows up on
the Problems page.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd
import streamlit as st

from app import actions, resources, state
from app.actions import POLICY_CHOICES, PolicyRequest
from app.context import get_context
from core.errors import ForkpointError
from core.evaluation.problems import Problem

TRACE_PAGE = Path(__file__).resolve().parent / "trace.py"


def _choose_problems(problems: list[Problem]) -> list[Problem]:
    ids = [p.id for p in problems]
    by_id = {p.id: p for p in problems}
    mode = st.radio("Problems", ("chosen", "first N", "typed"), horizontal=True, key="gen_mode",
                    format_func={"chosen": "choose from the set", "first N": "first N of the set",
                                 "typed": "type a problem"}.get)
    if mode == "chosen":
        st.session_state.setdefault("gen_ids", ids[:2])
        chosen = st.multiselect("Problem ids", ids, key="gen_ids")
        return [by_id[i] for i in chosen]
    if mode == "first N":
        n = st.number_input("N", 1, max(1, len(ids)), value=min(8, max(1, len(ids))), key="gen_n")
        return problems[: int(n)]
    text = st.text_area("Problem text", key="gen_text", placeholder="Tom has 3 boxes of 4 apples …")
    gold = st.text_input("Gold answer (optional, for grading)", key="gen_gold")
    return [Problem("typed-" + hashlib.sha256(text.strip().encode()).hexdigest()[:8], text.strip(), gold.strip() or None)] if text.strip() else []


def _policy_form(score: str) -> PolicyRequest:
    name = st.selectbox("Policy", list(POLICY_CHOICES), key="gen_policy", format_func=lambda n: POLICY_CHOICES[n][0])
    params = POLICY_CHOICES[name][1]
    req = PolicyRequest(name=name, score=score)
    cols = st.columns(3)
    i = 0

    def col():
        nonlocal i
        i += 1
        return cols[(i - 1) % 3]

    if "budget" in params:
        req.budget = col().number_input("budget (max share taken over)", 0.0, 1.0, 0.1, 0.01, key="gen_budget")
    if "ratio" in params:
        req.ratio = col().number_input("r (calibration ratio)", 0.001, 0.5, 0.05, 0.01, format="%.3f", key="gen_ratio")
    if "window" in params:
        req.window = int(col().number_input("W (window)", 1, 512, 16, key="gen_window"))
    if "threshold" in params:
        req.threshold = col().number_input("entropy threshold (nats)", 0.0, 20.0, 1.0, 0.1, key="gen_threshold")
    if "rate" in params:
        req.rate = col().number_input("rate", 0.0, 1.0, 0.05, 0.01, key="gen_rate")
    if "seed" in params:
        req.seed = int(col().number_input("policy seed", 0, 2**31 - 1, 0, key="gen_pseed"))
    if name == "guided":
        st.caption("Guided calibrates its gate (τ, λ) on BaseOnly rollouts of the chosen problems first.")
    return req


def main() -> None:
    ctx = get_context()
    state.show_notice()
    st.title("Generate")
    if ctx.pair is None:
        st.error("No model pair is loaded; fix it in the sidebar (Setup → Model pair).")
        return
    try:
        problems = resources.problem_set(ctx.settings.problems_path)
    except ForkpointError as err:
        st.error(f"Could not read the problems: {err}")
        return
    chosen = _choose_problems(problems)
    req = _policy_form(ctx.settings.score)
    c = st.columns(5)
    max_new = int(c[0].number_input("max new tokens", 1, 32768, st.session_state["config"].max_new_tokens, 32,
                                    key="gen_max_new"))
    temperature = float(c[1].number_input("temperature", 0.0, 2.0, 0.0, 0.1, key="gen_temp"))
    top_p = float(c[2].number_input("top-p", 0.01, 1.0, 1.0, 0.05, key="gen_top_p"))
    seed = int(c[3].number_input("seed", 0, 2**31 - 1, 0, key="gen_seed"))
    samples = int(c[4].number_input("samples", 1, 64, 1, key="gen_samples"))
    go = st.button(f"Run on {len(chosen)} problem(s)", type="primary", disabled=not chosen, key="gen_run")
    if not go:
        _show_last()
        return
    slot = st.empty()
    with slot.container(border=True):
        st.button("Cancel", key="gen_cancel", help="Stops the run; traces finished so far stay stored.",
                  on_click=state.notice, args=("info", "Generation cancelled; traces finished before that stay stored."))
        bar = st.progress(0.0, text="starting")

        def progress(done: int, total: int) -> None:
            bar.progress(min(1.0, done / max(total, 1)), text=f"{done} / {total}")

        try:
            policy = req.build(ctx.pair, calibration=chosen, store=ctx.store, max_new_tokens=max_new, progress=progress)
            traces = actions.run_generate(ctx.pair, ctx.store, chosen, policy, max_new_tokens=max_new,
                                          temperature=temperature, top_p=top_p, seed=seed, samples=samples,
                                          progress=progress)
        except ForkpointError as err:
            st.error(f"Generation failed: {err}")
            return
    slot.empty()
    st.session_state["gen_last"] = [t.key for t in traces]
    st.success(f"{len(traces)} trace(s) stored in {ctx.settings.store_path}; they are on the Problems page.")
    _show_last()


def _show_last() -> None:
    keys = st.session_state.get("gen_last") or []
    if not keys:
        return
    ctx = get_context()
    rows = []
    for key in keys:
        try:
            t = resources.load_trace(ctx.settings.store_path, key)
        except ForkpointError:
            continue
        rows.append({"problem": (t.meta.get("problem") or {}).get("id"), "policy": (t.meta.get("policy") or {}).get("name"),
                     "tokens": len(t), "takeovers": int(sum(1 for s in t.source if s != "base")),
                     "answer": t.meta.get("answer"), "correct": t.meta.get("correct"), "key": key})
    st.markdown("**Last run**")
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    pick = st.selectbox("Open a trace", keys, key="gen_open_pick", format_func=lambda k: k[:12])
    if st.button("Open in Trace", key="gen_open"):
        t = resources.load_trace(ctx.settings.store_path, pick)
        state.open_trace(pick, (t.meta.get("problem") or {}).get("id"))
        st.switch_page(TRACE_PAGE)


main()
