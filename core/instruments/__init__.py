"""Research instruments: the causal effect of a takeover (`effects`), the success curve (`success_curve`),
which takeovers matter (`ablation`), the logit lens per layer (`lens`), dataset token statistics
(`token_stats`); `continuations` names the rows that effects and the curve decode through the child-trace kernel.

Import the functions from their modules (`from core.instruments.lens import lens`) or from `core`
(`core.lens`): this package re-exports nothing whose name is also one of its modules (so `success_curve`
is `core.success_curve` or `core.instruments.success_curve.success_curve`).
"""

from core.instruments.effects import takeover_effects

__all__ = ["takeover_effects"]
