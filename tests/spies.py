"""Spies on the decoding engine shared by test files."""

from __future__ import annotations

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
