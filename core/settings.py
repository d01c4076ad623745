"""One table of defaults (name, value, help) read by the API's signatures, the CLI's options and the app's widgets.

A default lives here and nowhere else: code writes `max_new_tokens: int = settings.MAX_NEW_TOKENS`, the CLI
builds `--max-new-tokens` from `SETTINGS["max_new_tokens"]`, and the app seeds its widget from the same row.
Presets (e.g. the paper's sampling) are named overrides of these rows.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.errors import InvalidInputError


@dataclass(frozen=True)
class Setting:
    """One user-facing setting: its default, a one-line help, and the valid range (or choices) where there is one.

    `open_low` / `open_high` exclude the bound itself (top_p is in (0, 1]); `step` is the widget step."""

    name: str
    value: Any
    help: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    choices: tuple[str, ...] = ()
    step: float | None = None

    @property
    def flag(self) -> str:
        """The CLI spelling, e.g. --max-new-tokens."""
        return "--" + self.name.replace("_", "-")

    def range_text(self) -> str:
        """The valid values in words: "in (0, 1]", "≥ 1", "one of: a, b", or "" when anything goes."""
        if self.choices:
            return "one of: " + ", ".join(self.choices)
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}{')' if self.open_high else ']'}"
        if self.low is not None:
            return f"{'>' if self.open_low else '≥'} {self.low:g}"
        return f"{'<' if self.open_high else '≤'} {self.high:g}" if self.high is not None else ""

    def check(self, value: Any, label: str | None = None) -> Any:
        """`value` if it is valid for this setting, else InvalidInputError naming `label` (default: the flag)."""
        label = label or self.flag
        if self.choices:
            if value not in self.choices:
                raise InvalidInputError(f"{label} must be {self.range_text()}; got {value!r}")
            return value
        kind = type(self.value) if self.value is not None else float
        if kind in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))
                                     or not math.isfinite(value) or (kind is int and not float(value).is_integer())):
            raise InvalidInputError(f"{label} must be a {'whole number' if kind is int else 'number'} "
                                    f"{self.range_text()}; got {value!r}")
        too_low = self.low is not None and (value <= self.low if self.open_low else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.open_high else value > self.high)
        if too_low or too_high:
            raise InvalidInputError(f"{label} must be {self.range_text()}; got {value!r}")
        return value

    def widget_bounds(self) -> tuple[Any, Any]:
        """(min, max) for a closed-range widget: an open bound moves one `step` inside."""
        step = self.step or (1 if isinstance(self.value, int) else 0.01)
        low = None if self.low is None else self.low + (step if self.open_low else 0)
        high = None if self.high is None else self.high - (step if self.open_high else 0)
        if isinstance(self.value, int) and not isinstance(self.value, bool):
            return (None if low is None else int(low)), (None if high is None else int(high))
        return (None if low is None else float(low)), (None if high is None else float(high))


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in [
        Setting("max_new_tokens", 256, "Most response tokens to generate (unless given, at most half the pair's "
                "context: 96 on the demo pair).", 1, None, step=32),
        Setting("temperature", 0.0, "Sampling temperature (0 = greedy).", 0.0, None, step=0.1),
        Setting("top_p", 1.0, "Nucleus sampling mass (1 = off).", 0.0, 1.0, open_low=True, step=0.01),
        Setting("seed", 0, "Seed of the sampling streams (draws keyed by seed, sample and position).", 0, None),
        Setting("samples", 1, "Samples per problem (pass@k uses all of them).", 1, None),
        Setting("batch_size", 8, "Rows decoded or scored together.", 1, None),
        Setting("k", 10, "Top-k ids and probabilities kept per token and model.", 1, None),
        Setting("hover_k", 20, "Most top-k rows on a token's hover card (the app and the notebook; a trace keeps k).",
                1, None),
        Setting("window", 16, "Gate window W: the previous W scores whose mean the current one must exceed λ times.", 1, None),
        Setting("ratio", 0.05, "Calibration ratio r: the gate's tau is the (1 - r) quantile of base-rollout scores.",
                0.0, 1.0, open_low=True, open_high=True, step=0.001),
        Setting("rho", None, "Equal-ρ calibration: set the gate's knob (τ/λ, a threshold, the router's cut) on base "
                "rollouts so that it takes over this share of tokens (unset: off, the knob as given).", 0.0, 1.0,
                open_low=True, open_high=True, step=0.005),
        Setting("calibration_problems", 32, "Most problems whose base rollouts calibrate the gate: the first of a given "
                "calibration set, else held out from the problems (at most a quarter).", 1, None),
        Setting("score", "cross_entropy", "Disagreement score for spikes, gates and colour scales.", None, None),
        Setting("spike_top", 0.01, "Spikes: the top fraction of tokens by score (per trace or dataset).", 0.0, 1.0,
                open_low=True, step=0.001),
        Setting("held_cache_gib", None, "GiB of recent traces' KV caches held so that a branch needs no re-prefill "
                "(None: 1 GiB on a CPU, a tenth of the GPU's memory on CUDA).", 0.0, None),
        Setting("spike_floor", 0.01, "Spikes: a top-p% spike needs a score above this (nats), so ~0 scores never count.", 0.0, None),
        Setting("dtype", "auto", "Weights' dtype: auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16 or float16.",
                choices=("auto", "float32", "bfloat16", "float16")),
        Setting("device", "auto", "auto, cpu, cuda or cuda:N."),
        Setting("ratios", (0.01, 0.02, 0.05, 0.1), "Calibration ratios r of a sweep (each in (0, 1)), e.g. 0.01,0.02,0.05,0.1."),
        Setting("gate_rhos", (0.02, 0.05, 0.1), "Target takeover rates ρ of the gate shoot-out (each in (0, 1)): every "
                "gate is calibrated to each."),
        Setting("effect_samples", 8, "Continuations per arm (the reasoner / the base writes the token) and position "
                "in takeover effects and the success curve.", 1, None),
        Setting("demo_measure_problems", 500, "The demo card is measured on the first N test problems.", 1, None),
        Setting("demo_measure_samples", 8, "Samples per problem for the demo card's pass@k.", 1, None),
        Setting("demo_measure_max_new_tokens", 96, "Most response tokens per demo-card rollout (the demo task's "
                "answers are short).", 1, None),
        Setting("demo_measure_budget", 0.1, "Guided's takeover budget in the demo card's protocol (a share of "
                "tokens), and the ceiling ρ at which its blind baselines also run.", 0.0, 1.0, open_low=True, step=0.01),
        Setting("demo_measure_batch_size", 100, "Rows decoded together while the demo card is measured.", 1, None),
        Setting("report_keep_gib", 1.0, "GiB of traces a report (`forkpoint analyze`; the app's Dataset page, for "
                "its selection) keeps in memory while its analyses scan them: the ones kept are read once, the rest "
                "once per pass.", 0.0, None, step=0.25),
        Setting("page_tokens", 4096, "Most tokens the token view shows at once (a longer trace is paged).", 1, None),
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
HOVER_K: int = SETTINGS["hover_k"].value
WINDOW: int = SETTINGS["window"].value
RATIO: float = SETTINGS["ratio"].value
CALIBRATION_PROBLEMS: int = SETTINGS["calibration_problems"].value
RHO: float | None = SETTINGS["rho"].value
SCORE: str = SETTINGS["score"].value
SPIKE_TOP: float = SETTINGS["spike_top"].value
SPIKE_FLOOR: float = SETTINGS["spike_floor"].value
HELD_CACHE_GIB: float | None = SETTINGS["held_cache_gib"].value
DTYPE: str = SETTINGS["dtype"].value
DEVICE: str = SETTINGS["device"].value
RATIOS: tuple[float, ...] = SETTINGS["ratios"].value
GATE_RHOS: tuple[float, ...] = SETTINGS["gate_rhos"].value
EFFECT_SAMPLES: int = SETTINGS["effect_samples"].value
PAGE_TOKENS: int = SETTINGS["page_tokens"].value
REPORT_KEEP_GIB: float = SETTINGS["report_keep_gib"].value


def gib_bytes(gib: float) -> int:
    """Bytes in `gib` GiB: the `*_gib` settings are in GiB, the memory bounds they set in bytes."""
    return int(gib * (1 << 30))

_SURROGATE = re.compile("[\ud800-\udfff]")
# Every bidirectional formatting character (marks, embeddings, overrides, isolates): in shown text they reorder
# what follows them, so the terminal and the token view show them as escapes (regex class body).
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
# The most characters one text (a prompt, a response, a typed continuation, a problem's field) may hold.
MAX_TEXT_CHARS: int = 8 * 1024 * 1024


def check_text(text: Any, where: str, *, max_chars: int = MAX_TEXT_CHARS, from_bytes: bool = False) -> str:
    """`text` if it can be tokenized, else InvalidInputError naming `where` (a flag, a file's line and field,
    the live route): the one check at every edge where text enters (lone surrogates, NUL, size).

    `from_bytes`: the text was decoded with errors="surrogateescape" (a CSV file, the command line), so a
    surrogate in U+DC80..U+DCFF is a byte that is not UTF-8 and is named as such."""
    if not isinstance(text, str):
        raise InvalidInputError(f"{where} must be text, got {type(text).__name__}")
    if len(text) > max_chars:
        raise InvalidInputError(f"{where} holds {len(text)} characters, over the limit of {max_chars}")
    if "\x00" in text:
        raise InvalidInputError(f"{where} holds a NUL character (at character {text.index(chr(0))}); remove it")
    found = _SURROGATE.search(text)
    if found is not None:
        i, ch = found.start(), found.group()
        if from_bytes and "\udc80" <= ch <= "\udcff":
            raise InvalidInputError(f"{where} is not UTF-8 text: byte 0x{ord(ch) - 0xDC00:02x} at character {i} "
                                    "is not valid UTF-8 (save the file or text as UTF-8)")
        raise InvalidInputError(f"{where} holds a lone surrogate (\\u{ord(ch):04x} at character {i}), which is "
                                "not valid Unicode text")
    return text


# How every long-running core call reports progress (the one protocol; bars are drawn only at the edges):
# progress(done, total), and for calls with several stages progress(stage, done, total).
Progress = Callable[[int, int], None]
StageProgress = Callable[[str, int, int], None]

# The seed paper's settings (docs/REPRODUCE.md): 8 samples at T 0.6, top-p 0.95, long chains of thought.
PRESETS: dict[str, dict[str, Any]] = {
    "paper": {"temperature": 0.6, "top_p": 0.95, "samples": 8, "max_new_tokens": 16384},
}


def preset(name: str) -> dict[str, Any]:
    """The overrides of a named preset, or raise with the valid choices."""
    if name not in PRESETS:
        raise InvalidInputError(f"Unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return dict(PRESETS[name])
