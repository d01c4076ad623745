"""forkpoint search: where a string or regular expression occurs in every stored trace (core.analysis.search)."""

from __future__ import annotations

import click

from core import settings
from core.cli.common import checked_text, echo, fail_cleanly, main, store_option
from core.cli.store import existing_store, warn_unreadable
from core.scoring.registry import DEFAULT_SCORE, SCORES

SHOWN = ["key", "problem", "pos", "match", "score", "spike", "tag", "source", "correct", "answer"]


@main.command(name="search")
@click.argument("pattern", callback=checked_text)
@store_option
@click.option("--regex", is_flag=True, help="Read PATTERN as a Python regular expression (default: literal text).")
@click.option("--ignore-case", "-i", is_flag=True, help="Match regardless of case.")
@click.option("--score", type=click.Choice(SCORES), default=DEFAULT_SCORE, show_default=True,
              help="The score reported for each match (the highest over the tokens it covers).")
@click.option("--spikes-only", is_flag=True,
              help=f"Only matches on a spike (the trace's spikes, else its top {settings.SPIKE_TOP:.0%} by --score).")
@click.option("--tags", is_flag=True, help="Add each match's planning tag (loads spaCy).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many rows.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV (every column) instead of a table.")
@fail_cleanly
def search(pattern: str, store_path: str | None, regex: bool, ignore_case: bool, score: str, spikes_only: bool,
           tags: bool, limit: int | None, as_csv: bool) -> None:
    """Every match of PATTERN in the stored responses: trace, token position, score, spike and tag, outcome."""
    from core.analysis.search import search_traces

    store = existing_store(store_path)
    traces, bad = store.load_all()
    found = search_traces(traces, pattern, regex=regex, case=not ignore_case, score=score, tags=tags,
                          spikes_only=spikes_only, limit=limit)
    if as_csv:
        echo(found.to_csv(index=False), nl=False)
    elif found.empty:
        echo(f"No match for {pattern!r} in {len(traces)} traces.")
    else:
        shown = found[SHOWN].assign(key=found["key"].str[:12])
        echo(shown.to_string(index=False, max_colwidth=30, na_rep=""))
        echo(f"{len(found)} match{'es' if len(found) != 1 else ''} in {found['key'].nunique()} of "
                   f"{len(traces)} traces; {int(found['spike'].sum())} on a spike.")
    warn_unreadable(bad)
