"""Research instruments: the causal effect of a takeover and the success curve (`effects`), the logit
lens per layer (`lens`), and dataset token statistics (`token_stats`)."""

from core.instruments.effects import success_curve, takeover_effects
from core.instruments.lens import lens

__all__ = ["lens", "success_curve", "takeover_effects"]
