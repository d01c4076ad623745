"""Declared parameters: a `param(...)` dataclass field carries a parameter's default, range and help once,
and `declared_params(cls)` reads them back as `Param`s for the CLI's options, the app's widgets and checks.
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from core.errors import InvalidInputError


@dataclass(frozen=True)
class Param:
    """One declared policy parameter: what a CLI option or an app widget needs to offer it."""

    name: str
    kind: type  # int, float, str or dict
    default: Any
    help: str
    low: float | None = None  # inclusive range, None = unbounded
    high: float | None = None
    choices: tuple[str, ...] = ()  # for str parameters
    optional: bool = False  # None is allowed and means "off" (e.g. no budget cap)
    from_gate: bool = False  # Guided's tau/lam/window: set by a calibrated Gate (make_policy(gate=...))
    quiet_default: bool = False  # left out of a policy's record at its default (keeps older traces' keys)
    open_range: bool = False  # low and high themselves excluded (a rate in (0, 1))

    def check(self, value: Any, owner: str = "policy") -> Any:
        """`value` coerced to `kind` if it is valid, else raise naming the parameter and the valid range."""
        if value is None and self.optional:
            return None
        where = f"{owner} parameter {self.name}"
        if self.kind is str:
            if not self.choices:  # free text (a path): any non-empty string
                if not isinstance(value, str) or not value.strip():
                    raise InvalidInputError(f"{where} must be a non-empty string, got {value!r}")
                return value
            if value not in self.choices:
                raise InvalidInputError(f"{where} must be one of: {', '.join(self.choices)}; got {value!r}")
            return value
        if self.kind is dict:
            if not isinstance(value, dict):
                raise InvalidInputError(f"{where} must be a dict, got {value!r}")
            return value
        number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
        if not number or not math.isfinite(float(value)) or (self.kind is int and float(value) != int(value)):
            raise InvalidInputError(f"{where} must be {'an integer' if self.kind is int else 'a number'}"
                                    f"{self.range_text()}, got {value!r}")
        value = self.kind(value)
        if self.open_range and value in (self.low, self.high):
            raise InvalidInputError(f"{where} must be{self.range_text()}, got {value!r}")
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise InvalidInputError(f"{where} must be{self.range_text()}, got {value!r}")
        return value

    def range_text(self) -> str:
        """' in [low, high]' / ' ≥ low' / '' for messages and help."""
        if self.low is not None and self.high is not None:
            return f" in ({self.low:g}, {self.high:g})" if self.open_range else f" in [{self.low:g}, {self.high:g}]"
        if self.low is not None:
            return f" ≥ {self.low:g}"
        return f" ≤ {self.high:g}" if self.high is not None else ""


def param(default: Any, help: str, *, low: float | None = None, high: float | None = None,
          choices: Sequence[str] = (), from_gate: bool = False, quiet_default: bool = False,
          open_range: bool = False) -> Any:
    """A dataclass field that declares a policy parameter (kind and optional-ness come from the annotation).
    `quiet_default`: a parameter added later, recorded only when it differs from its default, so that the
    request keys of traces made before it existed stay the same."""
    meta = {"help": help, "low": low, "high": high, "choices": tuple(choices), "from_gate": from_gate,
            "quiet_default": quiet_default, "open_range": open_range}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata={"param": meta})
    return field(default=default, metadata={"param": meta})


def declared_params(cls: type) -> tuple[Param, ...]:
    """The `param(...)` fields of a policy class, as `Param`s (kind and optional-ness read from the annotation)."""
    if not hasattr(cls, "__dataclass_fields__"):
        return ()
    out = []
    for f in fields(cls):
        meta = f.metadata.get("param")
        if meta is not None:
            kind, optional = _kind_of(f.type)
            out.append(Param(f.name, kind, {} if kind is dict else f.default, optional=optional, **meta))
    return tuple(out)


_KINDS = {"int": int, "float": float, "str": str, "dict": dict}


def _kind_of(annotation: Any) -> tuple[type, bool]:
    """(kind, optional) of a field annotation such as `float | None` or `dict[int, int | str]`, string or not."""
    if not isinstance(annotation, str):
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        members = typing.get_args(annotation) if union else (annotation,)
        kind = next(m for m in members if m is not type(None))
        return typing.get_origin(kind) or kind, type(None) in members
    head = re.match(r"\s*(?:typing\.)?(\w+)", annotation)
    outer = annotation.split("[", 1)[0]
    if head is None or head.group(1) not in _KINDS:
        raise InvalidInputError(f"A policy parameter must be int, float, str or dict (optionally | None), "
                                f"got {annotation!r}")
    return _KINDS[head.group(1)], "None" in outer or "None" in annotation.rsplit("]", 1)[-1]
