"""CSV cells that spreadsheets cannot run: formula injection neutralised in text columns.

A spreadsheet treats a cell starting with `=`, `+`, `-`, `@` (or a tab / carriage return before one)
as a formula, and model text can start that way. Such a text cell gets a leading apostrophe (`'=1+1`),
the OWASP recommendation; spreadsheets show the text, and the apostrophe is easy to strip. Numeric
columns are left alone: a negative number is data, not a formula.
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd

from core.io.atomic import write_atomic

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def neutralise_cell(value: Any) -> Any:
    """`value` with a leading apostrophe when it is text a spreadsheet would run as a formula."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def neutralise_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of `frame` whose text (object/string) columns are neutralised; numeric columns untouched."""
    out = frame.copy()
    for name in out.columns:
        column = out[name]
        if pd.api.types.is_object_dtype(column) or pd.api.types.is_string_dtype(column):
            out[name] = column.map(neutralise_cell)
    return out


def write_csv(frame: pd.DataFrame, path: str | os.PathLike[str], what: str = "table") -> None:
    """Write `frame` (no index) to `path` as a CSV a spreadsheet can open safely: text cells neutralised,
    the file replaced atomically (a WriteError names it when the write fails)."""
    write_atomic(path, lambda fh: neutralise_frame(frame).to_csv(fh, index=False), what=what)
