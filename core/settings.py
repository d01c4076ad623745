"""One table of defaults (name, value, help) read by the API's signatures, the CLI's options and the app's widgets.

A default lives here and nowhere else: code writes `max_new_tokens: int = settings.MAX_NEW_TOKENS`, the CLI
builds `--max-new-tokens` from `SETTINGS["max_new_tokens"]`, and the app seeds its widget from the same row.
Presets (e.g. the paper's sampling) are named overrides of these rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.errors import InvalidInputError


@dataclass(frozen=True)
class Setting:
    """One user-facing setting: its default, a one-line help, and the valid range where there is one."""

    name: str
    value: Any
    help: str
    low: float | None = None
    high: float | None = None

    @property
    def flag(self) -> str:
        """The CLI spelling, e.g. --max-new-tokens."""
        return "--" + self.name.replace("_", "-")


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in [
        Setting("max_new_tokens", 256, "Most response tokens to generate.", 1, None),
        Setting("temperature", 0.0, "Sampling temperature (0 = greedy).", 0.0, None),
        Setting("top_p", 1.0, "Nucleus sampling mass (1 = off).", 0.0, 1.0),
        Setting("seed", 0, "Seed of the sampling streams (draws keyed by seed, sample and position).", 0, None),
        Setting("samples", 1, "Samples per problem (pass@k uses all of them).", 1, None),
        Setting("batch_size", 8, "Rows decoded or scored together.", 1, None),
        Setting("k", 10, "Top-k ids and probabilities kept per token and model.", 1, None),
        Setting("window", 16, "Gate window W: the previous W scores whose mean the current one must exceed λ times.", 1, None),
        Setting("ratio", 0.05, "Calibration ratio r: the gate's tau is the (1 - r) quantile of base-rollout scores.", 0.0, 1.0),
        Setting("calibration_problems", 32, "Problems whose base rollouts calibrate the gate.", 1, None),
        Setting("score", "cross_entropy", "Disagreement score for spikes, gates and colour scales.", None, None),
        Setting("spike_top", 0.01, "Spikes: the top fraction of tokens by score (per trace or dataset).", 0.0, 1.0),
        Setting("held_cache_gib", None, "GiB of recent traces' KV caches held so that a branch needs no re-prefill "
                "(None: 1 GiB on a CPU, a tenth of the GPU's memory on CUDA).", 0.0, None),
        Setting("spike_floor", 0.01, "Spikes: a top-p% spike needs a score above this (nats), so ~0 scores never count.", 0.0, None),
    ]
}

# Typed names for signatures: `def generate(..., max_new_tokens: int = settings.MAX_NEW_TOKENS)`.
MAX_NEW_TOKENS: int = SETTINGS["max_new_tokens"].value
TEMPERATURE: float = SETTINGS["temperature"].value
TOP_P: float = SETTINGS["top_p"].value
SEED: int = SETTINGS["seed"].value
SAMPLES: int = SETTINGS["samples"].value
BATCH_SIZE: int = SETTINGS["batch_size"].value
K: int = SETTINGS["k"].value
WINDOW: int = SETTINGS["window"].value
RATIO: float = SETTINGS["ratio"].value
CALIBRATION_PROBLEMS: int = SETTINGS["calibration_problems"].value
SCORE: str = SETTINGS["score"].value
SPIKE_TOP: float = SETTINGS["spike_top"].value
SPIKE_FLOOR: float = SETTINGS["spike_floor"].value
HELD_CACHE_GIB: float | None = SETTINGS["held_cache_gib"].value

# The seed paper's settings (docs/REPRODUCE.md): 8 samples at T 0.6, top-p 0.95, long chains of thought.
PRESETS: dict[str, dict[str, Any]] = {
    "paper": {"temperature": 0.6, "top_p": 0.95, "samples": 8, "max_new_tokens": 16384},
}


def preset(name: str) -> dict[str, Any]:
    """The overrides of a named preset, or raise with the valid choices."""
    if name not in PRESETS:
        raise InvalidInputError(f"Unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return dict(PRESETS[name])
