"""Spies on the decoding engine shared by test files."""

from __future__ import annotations

import collections
import os
import sys

import torch
from torch.overrides import TorchFunctionMode

import core
import core.decoding.state as decoding_state


class FeedLog:
    """Records every backbone call: (side, number of tokens fed)."""

    def __init__(self, pair: core.ModelPair, monkeypatch) -> None:
        self.calls: list[tuple[str, int]] = []
        original = decoding_state.backbone

        def spy(model, input_ids, *args, **kwargs):
            self.calls.append(("base" if model is pair.base else "reason", int(input_ids.shape[1])))
            return original(model, input_ids, *args, **kwargs)

        monkeypatch.setattr(decoding_state, "backbone", spy)

    def sizes(self, side: str) -> list[int]:
        return [n for s, n in self.calls if s == side]


class HostReads(TorchFunctionMode):
    """Counts what, called from core/, makes the host wait for an accelerator: a tensor read to the host
    (`.cpu()`, `.item()`, `.tolist()`, `bool`/`int`/`float` of a tensor, `nonzero`) and a blocking copy to a device
    (`.to(device)` without `non_blocking`). Free on a CPU, each is one synchronisation on a GPU: on the code before
    the GPU check's fixes this counted 3.4 / 7.5 / 7.4 per token for base_only / entropy_gated / router at batch 1,
    where torch's sync debug mode on an H200 counted 3.42 / 7.55 / 7.45 (benchmarks/RESULTS.md, GPU check)."""

    READS = frozenset({"cpu", "item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero"})

    def __init__(self) -> None:
        super().__init__()
        self.sites: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        moves = name == "to" and not kwargs.get("non_blocking", False) and isinstance(
            kwargs.get("device", args[1] if len(args) > 1 else None), (torch.device, str))
        if name in self.READS or moves:
            caller = sys._getframe(1)
            where = caller.f_code.co_filename.rsplit(f"{os.sep}core{os.sep}", 1)
            if len(where) == 2:
                self.sites[f"{where[1]}:{caller.f_lineno} {name}"] += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.sites.values())
