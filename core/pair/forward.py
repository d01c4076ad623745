"""Running one model: the backbone forward (hidden states, KV cache) and the output head per chunk.

Splitting the two is what keeps scoring memory-bounded: the (T, d) hidden states are small, and the
(C, V) logits exist only for one chunk of positions at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import torch
from packaging.version import Version

from core.errors import ModelLoadError

# transformers 5.24 renamed the decoder's `past_key_values` (argument and output) to `cache`, which `backbone`
# passes and reads; older releases ignore the argument. pyproject.toml states the same bound (tests/test_models.py).
TRANSFORMERS_MIN = "5.24"


def check_transformers(version: str | None = None) -> None:
    """Refuse, with the fix, a transformers release (default: the installed one) older than the one whose forward
    API `backbone` uses."""
    try:
        version = version or metadata.version("transformers")
    except metadata.PackageNotFoundError:  # importable without package metadata (vendored): nothing to read
        return
    if Version(version) < Version(TRANSFORMERS_MIN):
        raise ModelLoadError(f"forkpoint needs transformers >= {TRANSFORMERS_MIN} (found {version}): "
                             f"pip install 'transformers>={TRANSFORMERS_MIN},<6'")


@torch.inference_mode()
def backbone(model: Any, input_ids: torch.Tensor, cache: Any = None, attention_mask: torch.Tensor | None = None,
             position_ids: torch.Tensor | None = None, decoder: Any = None) -> tuple[torch.Tensor, Any]:
    """(B, L) ids -> ((B, L, d) final hidden states, the updated cache). Appends to `cache` if given.

    With left padding pass `attention_mask` (B, past + L) and `position_ids` (B, L). `decoder`: the model's
    `get_decoder()`, from a caller that runs it every step (the lookup costs about what a tiny model's layer does)."""
    out = (decoder if decoder is not None else model.get_decoder())(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
        use_cache=cache is not None,
    )
    return out.last_hidden_state, out.cache


def head(model: Any, hidden: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(..., d) hidden -> (..., V) float32 logits over the tokenizer's vocabulary (padding rows dropped).

    A float64 model keeps float64 logits (exact references in tests)."""
    return head_fn(model)(hidden, vocab_size)


def head_fn(model: Any) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """`head(model, ·, vocab_size)` with the model's output layer and logit settings looked up once: a
    decoding loop calls it every step, and those lookups cost as much as a small model's head itself."""
    embed = model.get_output_embeddings()
    cap = getattr(model.config, "final_logit_softcapping", None)
    scale = getattr(model, "logit_scale", None)
    scale = scale if isinstance(scale, (int, float)) else None
    spread = bool(getattr(model, "hf_device_map", None))

    @torch.inference_mode()
    def run(hidden: torch.Tensor, vocab_size: int) -> torch.Tensor:
        logits = embed(hidden)[..., :vocab_size]
        logits = logits if logits.dtype == torch.float64 else logits.float()
        if cap:  # Gemma-style soft-capping is part of the model's distribution
            logits = torch.tanh(logits / cap) * cap
        if scale is not None:  # Cohere-style scaled head
            logits = logits * scale
        if spread and logits.device != model.device:
            logits = logits.to(model.device)  # a model spread over GPUs: its head may sit on the last one
        return logits

    return run



@dataclass
class ForwardCount:
    """What a model's backbone did while `count_forwards` watched it: its calls, and its forwards of one row (a
    call over a batch of B rows is B of them, however many tokens each row reads)."""

    calls: int = 0
    rows: int = 0


@contextmanager
def count_forwards(model: Any) -> Iterator[ForwardCount]:
    """Count the backbone forwards of `model` inside the block (a forward hook on its decoder, so every caller of
    `backbone` is seen, whatever path decoding takes); measured, not inferred from a policy's rule."""
    count = ForwardCount()

    def seen(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], _out: Any) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        count.calls += 1
        count.rows += int(ids.shape[0]) if ids is not None and ids.dim() > 1 else 1

    handle = model.get_decoder().register_forward_hook(seen, with_kwargs=True)
    try:
        yield count
    finally:
        handle.remove()
