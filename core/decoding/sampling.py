"""Sampling: the decoding settings recorded in every generated trace, and one token draw.

Draws are keyed by position: step t of a row uses a generator seeded by (row seed, t) only, so a
re-draw after a cache crop, a branch replaying its parent, or a row alone or in a batch all give the
same token.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch

from core import settings
from core.errors import InvalidInputError


def sample_token(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> int:
    """(V,) logits -> one token id: argmax at temperature 0, else nucleus sampling from softmax(logits / T)."""
    if temperature == 0.0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # smallest prefix whose mass reaches top_p
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def position_generator(seed: int | None, t: int) -> torch.Generator | None:
    """The random stream of response position t of a row seeded `seed` (None: greedy, no stream)."""
    return None if seed is None else torch.Generator().manual_seed(seed * 1_000_003 + t)


def sample_seeds(seed: int, pos: int, samples: int) -> list[int]:
    """Position-keyed seeds: sample i at `pos` draws from its own stream, the same in any run or batch."""
    return [int.from_bytes(hashlib.blake2b(f"{seed}:{pos}:{i}".encode(), digest_size=4).digest(), "little") >> 1
            for i in range(samples)]


def row_seed(sampling: Sampling, sample: int) -> int | None:
    """A row's seed from the run's seed and its sample index (None when greedy)."""
    return int(sampling.seed) * 1009 + sample if sampling.temperature > 0 else None


@dataclass(frozen=True)
class Sampling:
    """Decoding settings recorded in every generated trace."""

    temperature: float = settings.TEMPERATURE
    top_p: float = settings.TOP_P
    seed: int = settings.SEED
    max_new_tokens: int = settings.MAX_NEW_TOKENS
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0):
            raise InvalidInputError(f"temperature must be ≥ 0, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidInputError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.max_new_tokens < 1:
            raise InvalidInputError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens!r}")
        # one stop string is one string, not its characters; any other sequence becomes a tuple
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        if not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidInputError(f"stop strings must be non-empty strings, got {self.stop!r}")

    def record(self, sample: int = 0) -> dict[str, Any]:
        """The trace's meta["sampling"] for row `sample`."""
        return {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed, "sample": sample,
                "max_new_tokens": self.max_new_tokens, "stop": list(self.stop)}
