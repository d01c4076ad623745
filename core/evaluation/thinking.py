"""The paper's recovery reference: a same-size thinking model (e.g. Qwen3-0.6B in thinking mode) that
writes every token alone, in its own prompt format, while the pair's guide only scores the tokens.

`load_thinking` loads the model with the same vocabulary check as `load_pair` and returns a `ModelPair`
whose *base* side is the thinking model and whose reason side is the already loaded guide (shared, not
copied); `Solo` is the policy that never hands over and runs the guide lazily (one scoring pass at the
end), so a thinking run costs about one model's decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from core.decoding.policies import Policy, Step, register_policy
from core.pair.formats import PromptFormat, format_spec
from core.pair.loading import ModelPair, check_same_vocabulary, load_one, load_tokenizer

DEFAULT_THINKING_FORMAT = "chat:think"


@register_policy
@dataclass
class Solo(Policy):
    """The base side writes every token; the other model is run only to score them, in one pass."""

    name: ClassVar[str] = "solo"
    label: ClassVar[str] = "Solo"
    help: ClassVar[str] = "One model writes every token alone; the other only scores them (the thinking reference)."
    lazy: ClassVar[bool] = True
    internal: ClassVar[bool] = True  # built by the evaluation, not offered as a choice

    def takeover(self, step: Step) -> np.ndarray:
        return np.zeros(len(step.taken), dtype=bool)


def load_thinking(pair: ModelPair, source: str, fmt: str = DEFAULT_THINKING_FORMAT, revision: str | None = None,
                  trust_remote_code: bool = False) -> ModelPair:
    """A pair (thinking model, pair's guide) for the thinking reference; the thinking model's vocabulary
    must match the pair's (renamed or added special tokens are tolerated and reported)."""
    tokenizer = load_tokenizer(str(source), revision, trust_remote_code)  # checked before the weights load
    notes = check_same_vocabulary(pair.tokenizer, tokenizer, names=("pair", "thinking"))
    model, tokenizer, spec = load_one(str(source), revision, pair.device, pair.dtype, trust_remote_code,
                                      tokenizer=tokenizer)
    eos = set(pair.eos_ids)
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            eos.add(value)
        elif isinstance(value, (list, tuple)):
            eos.update(int(v) for v in value)
    return replace(pair, base=model, specs={**pair.specs, "base": spec},
                   formats={**pair.formats, "base": PromptFormat(format_spec(fmt))}, eos_ids=frozenset(eos),
                   vocab_notes=[*pair.vocab_notes, *notes],
                   prompt_tokenizers={**pair.prompt_tokenizers, "base": tokenizer})


def from_models(pair: ModelPair, model: Any, fmt: str = DEFAULT_THINKING_FORMAT, spec: Any = None) -> ModelPair:
    """A thinking pair from an already loaded model sharing `pair`'s tokenizer (tests, notebooks)."""
    return replace(pair, base=model, specs={**pair.specs, "base": spec or pair.specs["reason"]},
                   formats={**pair.formats, "base": PromptFormat(format_spec(fmt))})
