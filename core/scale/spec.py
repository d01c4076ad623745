"""`PairSpec`: a model pair described by where it comes from, small enough to ship to remote workers.

A worker rebuilds the same pair (same models, revisions, prompt formats, dtype) on its own device, so
traces made there carry the same fingerprint, hence the same store keys, as traces made in-process.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from core import settings
from core.demo.pair import DEMO_DIR, demo_formats
from core.errors import InvalidInputError
from core.pair.loading import load_pair
from core.pair.options import load_pair_arguments


@dataclass(frozen=True)
class PairSpec:
    """Arguments of `core.load_pair`, minus the device (each worker picks its own)."""

    base: str
    reason: str
    base_format: str | None = None
    reason_format: str | None = None
    base_revision: str | None = None
    reason_revision: str | None = None
    dtype: str = settings.DTYPE
    trust_remote_code: bool = False  # the fields: core/pair/options.py PAIR_OPTIONS but the per-worker device

    @classmethod
    def from_pair(cls, pair: Any) -> PairSpec:
        """The spec of a loaded `ModelPair` (hub ids or local paths, revisions, formats, dtype)."""
        specs, formats = pair.specs, pair.formats
        for side in ("base", "reason"):
            if specs[side].gguf_file:
                raise InvalidInputError(
                    f"The {side} model was loaded from GGUF ({specs[side].gguf_file}); scale-out ships hub ids "
                    "or local directories. Convert it, or run in-process (no --ray)."
                )
        return cls(
            base=specs["base"].id, reason=specs["reason"].id,
            base_format=formats["base"].spec, reason_format=formats["reason"].spec,
            base_revision=specs["base"].revision, reason_revision=specs["reason"].revision,
            dtype=str(pair.dtype).removeprefix("torch."), trust_remote_code=bool(getattr(pair, "trust_remote_code", False)),
        )

    @classmethod
    def demo(cls, base_format: str | None = None, reason_format: str | None = None) -> PairSpec:
        """The bundled demo pair (its files ship inside the package, so every node has them); given formats
        replace its trained ones, as `demo_pair` does."""

        formats = demo_formats(DEMO_DIR)
        formats.update({k: v for k, v in (("base_format", base_format), ("reason_format", reason_format)) if v})
        return cls(base=str(DEMO_DIR / "base"), reason=str(DEMO_DIR / "reason"), dtype="float32", **formats)

    def load(self, device: str = settings.DEVICE, device_map: str | None = None) -> Any:
        """Load the pair on `device` (auto: CUDA when this process sees a GPU, else CPU); device_map="auto"
        spreads each model over every GPU this process sees instead."""

        return load_pair(**load_pair_arguments(asdict(self), per_worker=False), device=device, device_map=device_map)

    def token_text(self, token_id: int) -> str:
        """One token's own text, as `ModelPair.token_text` gives it, from the base tokenizer alone: a driver
        that only ships the pair to its workers still names tokens without loading a model."""
        tokenizer = _tokenizer(self.base, self.base_revision, self.trust_remote_code)
        return tokenizer.decode([int(token_id)], skip_special_tokens=False, clean_up_tokenization_spaces=False)


@lru_cache(maxsize=4)
def _tokenizer(source: str, revision: str | None, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer  # heavy: loaded only when a token is named

    return AutoTokenizer.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code)


def as_spec(pair: Any) -> PairSpec:
    """A PairSpec from a PairSpec or a loaded ModelPair (anything else: InvalidInputError)."""
    if isinstance(pair, PairSpec):
        return pair
    if hasattr(pair, "specs") and hasattr(pair, "formats"):
        return PairSpec.from_pair(pair)
    raise InvalidInputError(f"Expected a ModelPair or a PairSpec, got {type(pair).__name__}")
