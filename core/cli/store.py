"""forkpoint ls | export | import: the trace store and files others open."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from core.cli.common import _Bar, _fail_cleanly, _pair, _store, main, pair_options, store_option
from core.metrics import DEFAULT_SCORE, SCORES


@main.command(name="ls")
@store_option
@click.option("--unreadable", is_flag=True, help="List files that could not be read, with the reason.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV instead of a table.")
@_fail_cleanly
def ls(store_path: str | None, unreadable: bool, as_csv: bool) -> None:
    """Summary table of the stored traces."""
    store = _store(store_path)
    if unreadable:
        for path, reason in store.unreadable():
            click.echo(f"{path}\t{reason}")
        return
    frame = store.summaries()
    click.echo(frame.to_csv(index=False) if as_csv else frame.to_string(index=False, max_colwidth=40))


@main.command()
@store_option
@click.argument("keys", nargs=-1)
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "parquet", "html"]), default="jsonl",
              show_default=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Output file.")
@click.option("--score", "score_name", type=click.Choice(SCORES), default=DEFAULT_SCORE, show_default=True,
              help="Heatmap metric (html).")
@click.option("--overwrite", is_flag=True)
@_fail_cleanly
def export(store_path: str | None, keys: tuple[str, ...], fmt: str, out: str, score_name: str, overwrite: bool) -> None:
    """Export traces (all, or the given keys) as JSONL, CSV, Parquet or self-contained HTML."""
    from tqdm import tqdm

    from core.io.exports import export as run_export

    store = _store(store_path)
    keys = keys or tuple(store.keys())
    traces = [store.get(k) for k in tqdm(keys, desc="read", file=sys.stderr, leave=False)]
    kwargs = {"score": score_name} if fmt == "html" else {}
    run_export(traces, out, fmt, overwrite=overwrite, **kwargs)
    click.echo(f"{len(traces)} traces -> {out}")


@main.command(name="import")
@pair_options
@store_option
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@_fail_cleanly
def import_(path: str, store_path: str | None, **opts: Any) -> None:
    """Score a JSONL of {id, prompt, response[, answer]} made elsewhere into the store."""
    from core.io.imports import import_jsonl

    pair = _pair(opts)
    bar = _Bar("import")
    report = import_jsonl(pair, path, _store(store_path), progress=bar)
    bar.close()
    click.echo(json.dumps(report.to_dict(), default=str))


