"""About: what forkpoint is and how to read its heatmaps (no computation here)."""

from __future__ import annotations

import streamlit as st

from app import state
from core.scoring.registry import METRICS, SCORES
from core.views.heatmap import TAG_COLOURS, heatmap_css, legend_html

TEXT = """
**forkpoint** shows, token by token, where a *base* language model and a *reasoning* model of the same
vocabulary disagree about what comes next, and lets you hand single tokens to the reasoning model to
see how the answer changes.

**How to read a heatmap.** Each token of a response is one box. Its background colour is the chosen
*score* at that position: white = the two models agree, red = they disagree most. Both models read the
same text; the score compares their next-token distributions before the token was written.

- **Colour range.** By default each trace uses its own min..max, so the reddest token of every trace is
  equally red. Choose *fixed across this pair's traces* (sidebar) to compare heat between traces. While a
  branch comparison is open, the main view and both comparison panels share one range, so a token has
  the same colour in all three. *log* spreads the low end; *rank* colours by percentile.
- **Spikes** (violet outline) are the positions the spike rule picks: the top p% of a trace's scores
  (only scores above a small floor count, so a spike always means disagreement; ties at the cut go to the
  earlier token), or the calibrated gate (τ, λ, W fit on base rollouts of this pair).
- **Underlines** mark planning phrases (plan, reflect, verify, conclude); **▲** marks a token the
  reasoning model wrote, **◆** a token you forced.
- **Hover** a token for both models' top-k and probabilities; click one of them to force it there.
- **Click** a token, by the mode above the text: *flips it* (the default) switches the reasoning model's
  takeover there and the response re-flows; *types there* lets you write your own text and the base model
  continues; *selects it* shows its numbers and the branch tools. A dotted underline marks where a flip
  changes the text; **n** / **p** walk those tokens (the spikes in *selects it*), **?** lists every key.
- **Probabilities** keep three significant digits, so none reads 0.000 or 1.000: tiny ones in scientific
  notation (1.31e-05), and those within 0.0005 of 1 as the gap to 1 (1−4.8e-04 is 0.99952). The sidebar
  switches to log-probabilities in nats.
"""


def main() -> None:
    state.show_notice()
    st.title("About forkpoint")
    st.markdown(TEXT)
    st.html(f"<style>{heatmap_css()}</style>" + legend_html(list(TAG_COLOURS)[:4], spike_rule="the sidebar's rule"))
    st.markdown("**Scores** (natural log, nats):")
    st.table({"score": [METRICS[s].score_label for s in SCORES], "formula": [METRICS[s].doc for s in SCORES]})


main()
