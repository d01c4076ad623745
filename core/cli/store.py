"""forkpoint ls | export | import | verify | repair | remove: the trace store and files others open."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import click

from core.cli.common import (
    echo,
    Bar,
    check_output,
    fail_cleanly,
    main,
    make_executor,
    open_bar,
    open_store,
    overwrite_option,
    pair_options,
    pair_or_spec,
    ray_option,
    store_option,
)
from core.errors import ForkpointError
from core.io import maintenance
from core.io.foreign import IMPORT_FORMATS
from core.scoring.registry import DEFAULT_SCORE, SCORES
from core.views.exports import FORMATS as EXPORT_FORMATS


def existing_store(store_path: str | None):
    """The store at --store, or a clear error when there is none (never an empty table)."""
    store = open_store(store_path)
    if not store.exists():
        raise click.ClickException(
            f"No trace store at {store.path} (give --store or set $FORKPOINT_STORE; a store is created by "
            "`forkpoint generate`, `score --store` or `import`)"
        )
    return store


def warn_unreadable(bad: list[tuple[Path, str]]) -> None:
    """Tell the user (on stderr) which trace files were skipped as unreadable, and what to do."""
    if bad:
        echo(f"{len(bad)} unreadable trace file(s) skipped (`forkpoint verify` checks every file, "
                   "`forkpoint repair` sets damaged ones aside):", err=True)
        for path, reason in bad:
            echo(f"  {path.name}: {one_line(reason)}", err=True)


def one_line(text: str) -> str:
    """A reason on one line (pyarrow's messages hold newlines; a listing is one line per file)."""
    return " ".join(str(text).split())


@main.command(name="ls")
@store_option
@click.option("--unreadable", is_flag=True, help="List only the files that could not be read, with the reason.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV instead of a table.")
@fail_cleanly
def ls(store_path: str | None, unreadable: bool, as_csv: bool) -> None:
    """Summary table of the stored traces; damaged files are listed with status DAMAGED (reasons on stderr)."""
    store = existing_store(store_path)
    if unreadable:  # the deep check: every file read in full
        for path, reason in store.unreadable():
            echo(f"{path}\t{one_line(reason)}")
        return
    frame, bad = store.listing()
    frame.insert(1, "status", "ok")
    if bad:
        import pandas as pd

        damaged = pd.DataFrame({"key": [p.name.removesuffix(".parquet") for p, _ in bad], "status": "DAMAGED"})
        frame = pd.concat([frame.astype(object), damaged], ignore_index=True).reindex(columns=frame.columns)
    if not len(frame):
        echo(f"The store {store.path} has no traces.")
        return
    echo(frame.to_csv(index=False) if as_csv else frame.to_string(index=False, max_colwidth=40, na_rep=""))
    warn_unreadable(bad)


@main.command()
@store_option
@click.argument("keys", nargs=-1)
@click.option("--format", "fmt", type=click.Choice(tuple(EXPORT_FORMATS)), help="Output format (default: from the --out suffix).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Output file.")
@click.option("--score", "score_name", type=click.Choice(SCORES), default=DEFAULT_SCORE, show_default=True,
              help="Score whose top tokens are marked as spikes (every format) and that colours the heatmap (html).")
@overwrite_option()
@click.option("--parents", is_flag=True, help="Create --out's folder when it does not exist.")
@fail_cleanly
def export(store_path: str | None, keys: tuple[str, ...], fmt: str | None, out: str, score_name: str,
           overwrite: bool, parents: bool) -> None:
    """Export traces (all readable ones, or the given keys) as JSONL, CSV, Parquet or self-contained HTML.

    Unreadable traces are skipped and named; when a given KEY is among them, the rest are exported and the
    command exits 1."""

    from core.views.exports import export as run_export

    check_output(out, "--out", parents=parents, offer_parents=True)
    store = existing_store(store_path)
    traces, bad = store.load_all(open_bar(iterable=keys, desc="read", unit="trace") if keys else None)
    warn_unreadable(bad)
    if keys and not traces:
        raise click.ClickException(f"none of the {len(keys)} key(s) given is a readable trace (see above); "
                                   "nothing written")
    from core.io.notes import attach_notes

    bad_notes: list[tuple[Path, str]] = []
    traces = attach_notes(store, traces, damaged=bad_notes)  # notes and bookmarks travel with every export
    if bad_notes:
        echo(f"{len(bad_notes)} damaged notes file(s) left out (`forkpoint verify` lists them, "
                   "`forkpoint repair` sets them aside):", err=True)
        for path, reason in bad_notes:
            echo(f"  {path.name}: {one_line(reason)}", err=True)
    try:
        run_export(traces, out, fmt, overwrite=overwrite, score=score_name)
    except OSError as exc:
        if isinstance(exc, ForkpointError):  # e.g. the file exists: its own message names --overwrite
            raise
        from core.io.atomic import os_error_reason

        raise click.BadParameter(f"cannot write {out}: {os_error_reason(exc)}", param_hint="--out") from exc
    left_out = [f"{len(bad)} unreadable skipped"] * bool(bad) + [f"{len(bad_notes)} without their damaged notes"] * bool(bad_notes)
    echo(f"{len(traces)} traces -> {out}" + (f" ({'; '.join(left_out)})" if left_out else ""))
    if keys and bad:  # a key the user named is missing from the file: scripts must notice
        sys.exit(1)


@main.command(name="import")
@pair_options
@store_option
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(IMPORT_FORMATS),
              help="Input format (default: from the file suffix).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False),
              help="Append each record's outcome to this JSONL file as it happens "
                   "(default: <store>/imports/<file>.<time>.jsonl).")
@ray_option
@fail_cleanly
def import_(path: str, store_path: str | None, fmt: str | None, report_path: str | None, ray_address: str | None,
            **opts: Any) -> None:
    """Score records {id, prompt, response[, answer]} made elsewhere (JSONL, CSV or Parquet) into the store.

    Bad records are reported with their line and reason; the rest are stored. Records already in the
    store are skipped, so re-running an interrupted import finishes it.
    """
    from core.evaluation.graded_import import import_file
    from core.io.imports import detect_format

    detect_format(path, fmt)  # a bad suffix fails before the models load
    store = open_store(store_path)
    check_output(store.path, "--store", folder=True)
    if report_path is None:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        report_path = str(store.path / "imports" / f"{Path(path).name}.{stamp}.jsonl")
    else:
        check_output(report_path, "--report")
    executor = make_executor(ray_address, opts)
    pair = pair_or_spec(opts, executor)
    bar = Bar("import", unit="record")
    try:  # the bar closes before the summary is printed
        if executor is None:
            result = import_file(pair, path, store, progress=bar, format=fmt, report_path=report_path)
        else:  # a Ray Data pipeline: the same records, outcomes and traces (docs/SCALE.md)
            from core.scale.ray_data import import_file_ray

            result = import_file_ray(pair, path, store, executor=executor, format=fmt, report_path=report_path,
                                     progress=bar)
    finally:
        bar.close()
        if executor is not None:
            executor.close()
    echo(json.dumps({**result.to_dict(), "report": report_path}, default=str))
    if result.stopped:
        echo(f"Import stopped early: {result.stopped}. Stored {len(result.stored)}, skipped "
                   f"{len(result.skipped)}, failed {len(result.errors)}; lines after {result.last_line} were not "
                   "read. Run the same command again to finish (stored records are skipped).", err=True)
        sys.exit(130 if "Ctrl-C" in result.stopped else 1)


@main.command()
@store_option
@fail_cleanly
def verify(store_path: str | None) -> None:
    """Deep check: read every trace in full (page and footer checksums), the index and temp files.

    Prints a JSON report; exits 1 when a trace file or a side file (notes) is damaged or the index is unusable.
    """
    check = maintenance.verify(existing_store(store_path))
    echo(json.dumps(check.to_dict(), indent=1))
    if not check.ok:
        sys.exit(1)


@main.command()
@store_option
@fail_cleanly
def repair(store_path: str | None) -> None:
    """Set damaged trace files aside (into <store>/damaged/, never deleted), remove dead writers' temp
    files, and rebuild the index. Re-running the request that made a set-aside trace recomputes it.
    Exits 1 when a damaged file could not be moved."""
    report = maintenance.repair(existing_store(store_path))
    echo(json.dumps(report.to_dict(), indent=1))
    if not report.ok:
        echo(f"{len(report.failed)} damaged file(s) could not be moved aside (see failed); "
                   "fix their folder's permissions or move them by hand, then run repair again.", err=True)
        sys.exit(1)


@main.command()
@store_option
@click.argument("keys", nargs=-1)
@click.option("--damaged", is_flag=True, help="Remove every trace file that fails the deep check.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@fail_cleanly
def remove(store_path: str | None, keys: tuple[str, ...], damaged: bool, yes: bool) -> None:
    """Delete the given traces (or, with --damaged, every unreadable trace file) from the store."""
    from core.io.tracefile import check_key

    for key in keys:  # every key checked before anything is asked or removed
        try:
            check_key(key)
        except ForkpointError as err:
            raise click.BadParameter(str(err), param_hint="KEYS") from None
    store = existing_store(store_path)
    missing = [k for k in keys if k not in store.keys()]
    if missing:
        raise click.ClickException(f"No trace with key {missing[0]!r} in {store.path} (see `forkpoint ls`); nothing "
                                   "was removed")
    bad = [path for path, _ in store.unreadable()] if damaged else []
    if not keys and not bad:
        if damaged:
            echo(f"No unreadable trace files in {store.path}.")
            return
        raise click.UsageError("Give the keys to remove, or --damaged")
    if not yes:
        click.confirm(f"Delete {len(keys) + len(bad)} trace file(s) from {store.path}?", abort=True)
    for key in store.remove(dict.fromkeys(keys)):
        echo(f"removed {key}")
    for path in store.remove_unreadable() if damaged else []:
        echo(f"removed {path.name}")
