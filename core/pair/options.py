"""The options that name a model pair, as one table: the CLI's pair flags (`core/cli/common.py`), the app's
start-up arguments (`app/config.py`), its `PairChoice` and the workers' `PairSpec` are all read from it.

Each row is an argument of `core.load_pair`. A row with a `setting` takes its default, help and choices
from `core/settings.py` SETTINGS; a `switch` row is a flag without a value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core import settings


@dataclass(frozen=True)
class PairOption:
    """One option of a pair: `name` (load_pair's argument), its help, and whether it is a switch or a setting."""

    name: str
    help: str = ""
    switch: bool = False  # a flag without a value (--trust-remote-code)
    setting: bool = False  # default, help and choices from settings.SETTINGS[name]
    per_worker: bool = False  # each process picks its own (a PairSpec does not carry it)

    @property
    def flag(self) -> str:
        """The option on a command line: --base-format."""
        return "--" + self.name.replace("_", "-")

    @property
    def default(self) -> Any:
        """The value when the option is not given: the setting's, False for a switch, "" (core's default) else."""
        if self.setting:
            return settings.SETTINGS[self.name].value
        return False if self.switch else ""

    def describe(self) -> str:
        return settings.SETTINGS[self.name].help if self.setting and not self.help else self.help


PAIR_OPTIONS: tuple[PairOption, ...] = (
    PairOption("base", "Base model: hub id, local directory or .gguf file (default: the demo pair)."),
    PairOption("reason", "Reasoning model: hub id, local directory or .gguf file."),
    PairOption("base_format", "Base prompt format: a template with {problem}, or chat[:think|:nothink]."),
    PairOption("reason_format", "Reasoning prompt format (default: its chat template if it has one)."),
    PairOption("base_revision", "Pin the base model to a hub revision."),
    PairOption("reason_revision", "Pin the reasoning model to a hub revision."),
    PairOption("device", setting=True, per_worker=True),
    PairOption("dtype", setting=True),
    PairOption("trust_remote_code", "Run model code from the hub (only if you trust it).", switch=True),
)
PAIR_OPTION_NAMES = tuple(o.name for o in PAIR_OPTIONS)


def load_pair_arguments(values: Mapping[str, Any], *, per_worker: bool = True) -> dict[str, Any]:
    """`core.load_pair`'s keyword arguments from option values (given by name; a missing or empty one takes
    its default, "" becoming None: core's own default). Without `per_worker`, the options each worker picks
    itself (the device) are left out, as a `PairSpec` leaves them."""
    out: dict[str, Any] = {}
    for option in PAIR_OPTIONS:
        if option.per_worker and not per_worker:
            continue
        value = values.get(option.name)
        if value is None or value == "":
            value = option.default
        out[option.name] = None if value == "" else value
    return out
