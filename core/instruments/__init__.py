"""Research instruments: the causal effect of a takeover and the success curve (`effects`), the logit
lens per layer (`lens`), and dataset token statistics (`token_stats`).

Import the functions from their modules (`from core.instruments.lens import lens`) or from `core`
(`core.lens`): this package re-exports nothing whose name is also one of its modules.
"""

from core.instruments.effects import success_curve, takeover_effects

__all__ = ["success_curve", "takeover_effects"]
