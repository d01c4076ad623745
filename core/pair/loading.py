"""`ModelPair`: a base and a reasoning causal LM that share a vocabulary, each with its own prompt format.

Loads from a hub id, a local directory or a GGUF file; checks that both tokenizers map the same
strings to the same ids; formats prompts per model. Both models stay resident.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from core.errors import InvalidInputError, ModelLoadError, VocabularyMismatchError
from core.pair.tokens import display_tokens

log = logging.getLogger(__name__)

SIDES = ("base", "reason")
DEFAULT_BASE_FORMAT = "Question: {problem}\nAnswer:"


@dataclass(frozen=True)
class PromptFormat:
    """How one model sees a problem: a raw template with `{problem}`, or the tokenizer's chat template.

    Written as a string: a template like "Question: {problem}\\nAnswer:", or "chat", "chat:think",
    "chat:nothink" (Qwen3's `enable_thinking` switch), optionally "chat|system text".
    """

    spec: str

    def __post_init__(self) -> None:
        if not self.is_chat and "{problem}" not in self.spec:
            raise InvalidInputError(
                f"Prompt format {self.spec!r} has no '{{problem}}' placeholder; use a template such as "
                f"{DEFAULT_BASE_FORMAT!r} or one of: chat, chat:think, chat:nothink"
            )

    @property
    def is_chat(self) -> bool:
        return self.spec.split("|", 1)[0] in ("chat", "chat:think", "chat:nothink")

    def render(self, tokenizer: Any, problem: str) -> list[int]:
        """Token ids of the formatted prompt for `problem` (BOS and chat markup as the model expects)."""
        if not self.is_chat:
            text = self.spec.replace("{problem}", problem)
            return list(tokenizer(text, add_special_tokens=True)["input_ids"])
        if not getattr(tokenizer, "chat_template", None):
            raise InvalidInputError(
                "Prompt format 'chat' needs a tokenizer with a chat template; this one has none. "
                f"Use a raw template such as {DEFAULT_BASE_FORMAT!r}."
            )
        mode, _, system = self.spec.partition("|")
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": problem}
        ]
        kwargs: dict[str, Any] = {}
        if mode != "chat":
            kwargs["enable_thinking"] = mode == "chat:think"
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass(frozen=True)
class ModelSpec:
    """Where one model came from: enough to load it again."""

    id: str
    revision: str | None = None
    gguf_file: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "revision": self.revision, "gguf_file": self.gguf_file}


@dataclass(eq=False)
class ModelPair:
    """Two resident causal LMs over one vocabulary. `vocab_size` is the tokenizer's length:
    logits past it (embedding padding) never count."""

    base: Any
    reason: Any
    tokenizer: Any
    specs: dict[str, ModelSpec]
    formats: dict[str, PromptFormat]
    device: torch.device
    dtype: torch.dtype
    vocab_size: int
    eos_ids: frozenset[int] = field(default_factory=frozenset)

    def model(self, side: str) -> Any:
        return self.base if side == "base" else self.reason

    def prompt_ids(self, problem: str) -> dict[str, list[int]]:
        """Each model's formatted prompt for `problem`, as token ids."""
        return {side: self.formats[side].render(self.tokenizer, problem) for side in SIDES}

    def encode(self, text: str) -> list[int]:
        """Response text -> token ids (no special tokens added)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def display_tokens(self, ids: list[int]) -> list[str]:
        return display_tokens(self.tokenizer, ids)

    def token_text(self, token_id: int) -> str:
        """One token's own text (for top-k lists), with byte-level markers resolved where possible."""
        return self.decode([int(token_id)])

    def spec(self) -> dict[str, Any]:
        """The pair part of the reproducibility record."""
        return {
            "base": self.specs["base"].as_dict(),
            "reason": self.specs["reason"].as_dict(),
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
            "vocab_size": self.vocab_size,
        }

    def fingerprint(self) -> dict[str, Any]:
        """What a trace must match to be continued with this pair (models and formats, not device)."""
        return {
            "base": self.specs["base"].as_dict(),
            "reason": self.specs["reason"].as_dict(),
            "formats": {side: self.formats[side].spec for side in SIDES},
        }


def resolve_device(device: str = "auto") -> torch.device:
    """'auto' -> CUDA when present, else CPU; anything else is passed to torch.device."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise InvalidInputError(f"Unknown device {device!r}; use auto, cpu, cuda or cuda:N") from err
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (dev.index or 0) >= count:
            raise InvalidInputError(
                f"Device {device!r} is not available ({count} CUDA devices visible to torch "
                f"{torch.__version__}); use auto or cpu"
            )
    return dev


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """'auto' -> bfloat16 on CUDA, float32 on CPU (bf16 matmuls are very slow on these CPUs)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in choices:
        raise InvalidInputError(f"Unknown dtype {dtype!r}; choose one of: auto, {', '.join(choices)}")
    return choices[dtype]


def _split_gguf(source: str) -> tuple[str, str | None]:
    """'dir/model.Q8_0.gguf' -> ('dir', 'model.Q8_0.gguf'); other sources unchanged."""
    if source.lower().endswith(".gguf"):
        path = Path(source)
        return (str(path.parent) if str(path.parent) != "" else ".", path.name)
    return source, None


def _looks_local(source: str) -> bool:
    """A filesystem path rather than a hub id ("org/name" has one slash and no leading ./ or /)."""
    return Path(source).expanduser().exists() or source.startswith((".", "/", "~")) or source.count("/") > 1


def _load_one(source: str, revision: str | None, device: torch.device, dtype: torch.dtype,
              trust_remote_code: bool) -> tuple[Any, Any, ModelSpec]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    repo, gguf_file = _split_gguf(str(source))
    local = _looks_local(str(source))
    if local and not Path(source).expanduser().exists():
        raise ModelLoadError(f"Model path {source!r} does not exist")
    if gguf_file:
        try:
            import gguf  # noqa: F401
        except ImportError as err:
            raise ModelLoadError(
                f"Loading {source!r} needs the 'gguf' package: pip install 'forkpoint[gguf]'"
            ) from err
    kwargs: dict[str, Any] = {"revision": revision, "trust_remote_code": trust_remote_code}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    try:
        tokenizer = AutoTokenizer.from_pretrained(repo, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            repo, dtype=dtype, use_safetensors=None if gguf_file else True, **kwargs
        )
    except (OSError, ValueError, KeyError) as err:
        where = "local model directory" if local else "local directory or Hugging Face hub id (is the network reachable?)"
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelLoadError(f"Could not load {source!r} as a {where}: {first_line}") from err
    model.to(device).eval().requires_grad_(False)
    return model, tokenizer, ModelSpec(str(source), revision, gguf_file)


def check_same_vocabulary(tok_a: Any, tok_b: Any, names: tuple[str, str] = ("base", "reason")) -> None:
    """Raise VocabularyMismatchError unless both tokenizers map the same strings to the same ids
    (added and special tokens included), naming the first differing tokens."""
    vocab_a, vocab_b = tok_a.get_vocab(), tok_b.get_vocab()
    if vocab_a == vocab_b:
        for special in set(tok_a.all_special_tokens) | set(tok_b.all_special_tokens):
            if vocab_a.get(special) != vocab_b.get(special):  # pragma: no cover - implied by equal vocabs
                raise VocabularyMismatchError(f"special token {special!r} maps to different ids")
        return
    by_id_a = {i: s for s, i in vocab_a.items()}
    by_id_b = {i: s for s, i in vocab_b.items()}
    diffs = []
    for i in sorted(set(by_id_a) | set(by_id_b)):
        if by_id_a.get(i) != by_id_b.get(i):
            diffs.append(f"id {i}: {by_id_a.get(i)!r} vs {by_id_b.get(i)!r}")
        if len(diffs) == 3:
            break
    raise VocabularyMismatchError(
        f"The {names[0]} and {names[1]} tokenizers differ ({len(vocab_a)} vs {len(vocab_b)} entries); "
        f"first differences: {'; '.join(diffs)}. forkpoint needs two models with one shared vocabulary."
    )


def load_pair(
    base: str,
    reason: str,
    device: str = "auto",
    dtype: str | torch.dtype = "auto",
    base_format: str | None = None,
    reason_format: str | None = None,
    base_revision: str | None = None,
    reason_revision: str | None = None,
    trust_remote_code: bool = False,
) -> ModelPair:
    """Load a base and a reasoning model (hub ids, local dirs or .gguf files) that share a vocabulary.

    Formats default to a plain "Question/Answer" template for the base and the chat template (when the
    tokenizer has one) for the reasoner.
    """
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    base_model, base_tok, base_spec = _load_one(str(base), base_revision, dev, dt, trust_remote_code)
    reason_model, reason_tok, reason_spec = _load_one(str(reason), reason_revision, dev, dt, trust_remote_code)
    check_same_vocabulary(base_tok, reason_tok)
    vocab_size = len(base_tok)
    for side, model in (("base", base_model), ("reason", reason_model)):
        rows = model.get_output_embeddings().weight.shape[0]
        if rows < vocab_size:
            raise VocabularyMismatchError(
                f"The {side} model's output layer has {rows} rows but the tokenizer has {vocab_size} tokens"
            )
    if reason_format is None:
        reason_format = "chat" if getattr(reason_tok, "chat_template", None) else (base_format or DEFAULT_BASE_FORMAT)
    formats = {"base": PromptFormat(base_format or DEFAULT_BASE_FORMAT), "reason": PromptFormat(reason_format)}
    eos: set[int] = set()
    for tok, model in ((base_tok, base_model), (reason_tok, reason_model)):
        for value in (tok.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
            if isinstance(value, int):
                eos.add(value)
            elif isinstance(value, (list, tuple)):
                eos.update(int(v) for v in value)
    log.info("loaded pair %s | %s on %s (%s)", base, reason, dev, dt)
    return ModelPair(
        base=base_model,
        reason=reason_model,
        tokenizer=base_tok,
        specs={"base": base_spec, "reason": reason_spec},
        formats=formats,
        device=dev,
        dtype=dt,
        vocab_size=vocab_size,
        eos_ids=frozenset(eos),
    )
