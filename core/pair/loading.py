"""`ModelPair`: a base and a reasoning causal LM that share a vocabulary, each with its own prompt format.

Loads from a hub id, a local directory or a GGUF file; checks that both tokenizers map the same
strings to the same ids (renamed or added special tokens tolerated and reported); formats prompts per
model (`core.pair.formats`). Both models stay resident (one copy when both sides are the same model).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from core import settings
from core.errors import InvalidInputError, ModelLoadError, VocabularyMismatchError
from core.pair.attention import use_block_attention
from core.pair.forward import check_transformers, head_fn
from core.pair.gguf_reads import one_parse
from core.pair.formats import (  # noqa: F401  (re-exported: the pair API names them)
    CHAT_MODES,
    DEFAULT_BASE_FORMAT,
    NAMED_FORMATS,
    PAPER_INSTRUCTION,
    PREFILLS,
    PromptFormat,
    format_spec,
)
from core.pair.placement import resolve_device, resolve_dtype, spread_plan  # noqa: F401  (re-exported)
from core.pair.tokens import display_tokens
from core.trace import SIDES

log = logging.getLogger(__name__)


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
    vocab_notes: list[str] = field(default_factory=list)  # tolerated special-token differences
    prompt_tokenizers: dict[str, Any] = field(default_factory=dict)  # side -> own tokenizer for its template
    trust_remote_code: bool = False  # how it was loaded: a worker loading it again (core.scale) needs the same
    # side -> (model, its head_fn, its decoder): looked up once per model (an explicit cache; `replace` starts empty)
    _runners: dict[str, tuple[Any, Any, Any]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        check_transformers()
        for model in (self.base, self.reason):  # blocks after a long cache must not copy it (core.pair.attention)
            use_block_attention(model)

    def model(self, side: str) -> Any:
        return self.base if side == "base" else self.reason

    def runner(self, side: str) -> tuple[Any, Any]:
        """(`core.pair.forward.head_fn` of the `side` model, its `get_decoder()`), looked up once per model: on
        transformers 5 the lookups cost about what a tiny model's head does, and every forward needs both."""
        model = self.model(side)
        got = self._runners.get(side)
        if got is None or got[0] is not model:
            got = self._runners[side] = (model, head_fn(model), model.get_decoder())
        return got[1], got[2]

    def prompt_ids(self, problem: str) -> dict[str, list[int]]:
        """Each model's formatted prompt for `problem`, as token ids (each with its own tokenizer's template)."""
        settings.check_text(problem, "the problem text")  # for API callers; the CLI, files and app check first
        return {side: self.formats[side].render(self.prompt_tokenizers.get(side, self.tokenizer), problem)
                for side in SIDES}

    def encode(self, text: str) -> list[int]:
        """Response text -> token ids (no special tokens added)."""
        settings.check_text(text, "the response text")
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
            "formats": {side: self.formats[side].describe() for side in SIDES},
            "vocabulary": list(self.vocab_notes),
        }

    def fingerprint(self) -> dict[str, Any]:
        """What a trace must match to be continued with this pair (models and formats, not device)."""
        return {
            "base": self.specs["base"].as_dict(),
            "reason": self.specs["reason"].as_dict(),
            "formats": {side: self.formats[side].spec for side in SIDES},
        }

    def context_length(self, side: str) -> int | None:
        """The `side` model's context in tokens (`max_position_embeddings`), or None when it declares none."""
        limit = getattr(getattr(self.model(side), "config", None), "max_position_embeddings", None)
        return int(limit) if isinstance(limit, int) and limit > 0 else None

    def default_max_new_tokens(self, wanted: int = settings.MAX_NEW_TOKENS) -> int:
        """The response length to use when none was asked for: `wanted`, or half the shorter context when that is
        less (the other half holds the prompt), so a small-context pair (the demo's 192 tokens: 96) is never asked
        by default for more than fits; an explicit length stays the caller's (`check_context` warns)."""
        contexts = [c for c in (self.context_length(side) for side in SIDES) if c]
        return min([int(wanted), *(max(1, c // 2) for c in contexts)])

    def check_context(self, prompt_ids: dict[str, list[int]], max_new_tokens: int) -> int:
        """Refuse (InvalidInputError, before any forward) a prompt that leaves no room in either model's
        context; returns how many new tokens fit (<= max_new_tokens). Tokens past the context are
        meaningless, so a caller may stop there; a warning says when max_new_tokens reaches past it."""
        room = max_new_tokens
        for side in SIDES:
            limit, n = self.context_length(side), len(prompt_ids[side])
            if limit is None:
                continue
            if n >= limit:
                raise InvalidInputError(
                    f"The prompt is {n} tokens for the {side} model, whose context is {limit} tokens: it does not "
                    f"fit (prompt + response may be at most {limit} tokens; max new tokens is {max_new_tokens}); "
                    "shorten the prompt or use a model with a longer context"
                )
            if n + max_new_tokens > limit:
                # once per pair, side and limit: a batch of 100 prompts logged 200 identical warnings
                warned = self.__dict__.setdefault("_context_warned", set())
                level = logging.DEBUG if (side, max_new_tokens) in warned else logging.WARNING
                warned.add((side, max_new_tokens))
                log.log(level, "prompt (%d tokens) + max_new_tokens (%d) exceeds the %s model's context of %d tokens;"
                        " only %d new tokens fit (said once per pair: later prompts stop at the context too)",
                        n, max_new_tokens, side, limit, limit - n)
            room = min(room, limit - n)
        return room


def _split_gguf(source: str) -> tuple[str, str | None]:
    """'dir/model.Q8_0.gguf' -> ('dir', 'model.Q8_0.gguf'); other sources unchanged."""
    if source.lower().endswith(".gguf"):
        path = Path(source)
        return (str(path.parent) if str(path.parent) != "" else ".", path.name)
    return source, None


def _exists(source: str) -> bool:
    """Whether `source` names something on disk; a name the file system refuses (too long, a NUL) is a clear error."""
    try:
        return Path(source).expanduser().exists()
    except (OSError, ValueError) as err:
        shown = source if len(source) <= 80 else source[:79] + "…"
        raise ModelLoadError(f"Model source {shown!r} ({len(source)} characters) is neither a hub id nor a usable "
                             f"path: {getattr(err, 'strerror', None) or err}") from None


def _looks_local(source: str) -> bool:
    """A filesystem path rather than a hub id ("org/name" has one slash and no leading ./ or /)."""
    return _exists(source) or source.startswith((".", "/", "~")) or source.count("/") > 1


def _check_gguf_deps(source: str) -> None:
    """Loading a .gguf through transformers needs gguf, accelerate and psutil: name what is missing."""
    import importlib.util

    missing = [m for m in ("gguf", "accelerate", "psutil") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelLoadError(f"Loading {source!r} needs the package(s) {', '.join(missing)}: "
                             "pip install 'forkpoint[gguf]'")


def _where(source: str) -> tuple[str, str | None, bool]:
    """(repo or directory, gguf file name or None, whether `source` is a local path) of a model source,
    refusing a local path that does not exist before anything loads."""
    repo, gguf_file = _split_gguf(str(source))
    local = _looks_local(str(source))
    if local and not _exists(str(source)):
        raise ModelLoadError(f"Model path {source!r} does not exist")
    if gguf_file:
        _check_gguf_deps(str(source))
    return repo, gguf_file, local


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")  # any one: a tokenizer


def _folder_lacks(folder: Path) -> list[str]:
    """What a local folder lacks of a model directory: config.json, a tokenizer file ([]: none, or not a folder)."""
    if not folder.is_dir():
        return []
    lacks = [] if (folder / "config.json").is_file() else ["config.json"]
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        lacks.append(f"tokenizer file ({', '.join(TOKENIZER_FILES[:-1])} or {TOKENIZER_FILES[-1]})")
    return lacks


def _load_failed(err: Exception, source: str, gguf_file: str | None, local: bool, trust_remote_code: bool) -> ModelLoadError:
    if gguf_file:
        where = "GGUF file (is its architecture and quantisation supported by transformers' GGUF loader?)"
    elif local:
        where = "local model directory"
    else:
        where = "local directory or Hugging Face hub id (is the network reachable?)"
    detail = " ".join(str(err).split()) or type(err).__name__  # all of it, on one line
    if not trust_remote_code and any(s in str(err) for s in ("model type", "does not recognize", "Unrecognized",
                                                             "trust_remote_code", "custom code")):
        detail += (" — if this model ships its own code and you trust its author, pass --trust-remote-code "
                   "(trust_remote_code=True in Python); it is off by default because it runs that code")
    lacks = _folder_lacks(Path(source).expanduser()) if local and not gguf_file else []
    if lacks:
        detail = (f"it has no {' and no '.join(lacks)}; a model directory holds config.json, the tokenizer files "
                  f"and the weights, as save_pretrained writes them (transformers: {detail})")
    return ModelLoadError(f"Could not load {source!r} as a {where}: {detail}")


_LOAD_ERRORS = (OSError, ValueError, KeyError, ImportError, RuntimeError)


def load_tokenizer(source: str, revision: str | None = None, trust_remote_code: bool = False) -> Any:
    """The tokenizer of a hub id, local directory or .gguf file, without its weights (seconds, not minutes:
    a pair's vocabularies are compared before either model loads)."""
    from transformers import AutoTokenizer

    repo, gguf_file, local = _where(source)
    kwargs: dict[str, Any] = {"revision": revision, "trust_remote_code": trust_remote_code}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    try:
        return AutoTokenizer.from_pretrained(repo, **kwargs)
    except _LOAD_ERRORS as err:
        raise _load_failed(err, source, gguf_file, local, trust_remote_code) from err


def load_one(source: str, revision: str | None, device: torch.device, dtype: torch.dtype,
             trust_remote_code: bool = False, spread: int = 0,
             tokenizer: Any = None) -> tuple[Any, Any, ModelSpec]:
    """(model, tokenizer, spec) of one causal LM from a hub id, local directory or .gguf file; with
    `spread` > 0, its layers spread over that many GPUs (`spread_plan`) instead of all on `device`."""
    from transformers import AutoModelForCausalLM

    repo, gguf_file, local = _where(source)
    if tokenizer is None:
        tokenizer = load_tokenizer(source, revision, trust_remote_code)
    kwargs: dict[str, Any] = {"revision": revision, "trust_remote_code": trust_remote_code}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    try:
        if spread:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(repo, **kwargs)
            kwargs["device_map"] = spread_plan(config, spread, dtype, trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            repo, dtype=dtype, use_safetensors=None if gguf_file else True, **kwargs
        )
    except _LOAD_ERRORS as err:
        raise _load_failed(err, source, gguf_file, local, trust_remote_code) from err
    if not spread:
        model.to(device)
    model.eval().requires_grad_(False)
    return model, tokenizer, ModelSpec(str(source), revision, gguf_file)


_load_one = load_one  # the old private name


def _specials(tok: Any) -> set[str]:
    """A tokenizer's special-token strings: its named/additional specials and added tokens marked special."""
    out = set(getattr(tok, "all_special_tokens", []) or [])
    for added in (getattr(tok, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            out.add(str(added))
    return out


def check_same_vocabulary(tok_a: Any, tok_b: Any, names: tuple[str, str] = ("base", "reason")) -> list[str]:
    """Check that both tokenizers map the same strings to the same ids; returns notes on tolerated
    differences (a special token renamed at the same id, or a special token only one side has).
    Raise VocabularyMismatchError for any difference in the regular vocabulary, naming the first ones."""
    vocab_a, vocab_b = tok_a.get_vocab(), tok_b.get_vocab()
    if vocab_a == vocab_b:
        return []
    special_a, special_b = _specials(tok_a), _specials(tok_b)
    by_id_a = {i: s for s, i in vocab_a.items()}
    by_id_b = {i: s for s, i in vocab_b.items()}
    diffs, notes = [], []
    for i in sorted(set(by_id_a) | set(by_id_b)):
        a, b = by_id_a.get(i), by_id_b.get(i)
        if a == b:
            continue
        a_ok, b_ok = a is None or a in special_a, b is None or b in special_b
        if a_ok and b_ok:
            notes.append(f"id {i}: special token {a!r} ({names[0]}) vs {b!r} ({names[1]})" if a and b
                         else f"id {i}: special token {a or b!r} only in the {names[0] if a else names[1]} tokenizer")
        elif len(diffs) < 3:
            diffs.append(f"id {i}: {a!r} vs {b!r}")
    if diffs:
        raise VocabularyMismatchError(
            f"The {names[0]} and {names[1]} tokenizers differ ({len(vocab_a)} vs {len(vocab_b)} entries); "
            f"first differences: {'; '.join(diffs)}. forkpoint needs two models with one shared vocabulary "
            "(renamed or added special tokens are tolerated; regular tokens must match)."
        )
    for note in notes:
        log.warning("vocabulary difference tolerated: %s", note)
    return notes


def load_pair(
    base: str,
    reason: str,
    device: str = settings.DEVICE,
    dtype: str | torch.dtype = settings.DTYPE,
    base_format: str | None = None,
    reason_format: str | None = None,
    base_revision: str | None = None,
    reason_revision: str | None = None,
    trust_remote_code: bool = False,
    device_map: str | None = None,
) -> ModelPair:
    """Load a base and a reasoning model (hub ids, local dirs or .gguf files) that share a vocabulary.

    Formats default to a plain "Question/Answer" template for the base and the chat template (when the
    tokenizer has one) for the reasoner; named formats (NAMED_FORMATS, e.g. "paper-base") are expanded.
    Special tokens renamed or added on one side are tolerated and listed in `pair.vocab_notes`.
    `device_map="auto"`: each model spread over every GPU this process sees (a pair larger than one GPU).
    """
    check_transformers()  # before any weights load (ModelPair checks again, for pairs built by hand)
    spread = 0
    if device_map is not None:
        if device_map != "auto":
            raise InvalidInputError(f"device_map must be None or 'auto' (spread over the visible GPUs), got {device_map!r}")
        spread = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if spread < 1:
            raise InvalidInputError("device_map='auto' spreads the models over GPUs, but torch sees none")
        device = "cuda:0"
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    same = (str(base), base_revision) == (str(reason), reason_revision)  # a self-pair: one resident copy
    gguf = any(_split_gguf(str(source))[1] for source in (base, reason))
    with one_parse() if gguf else contextlib.nullcontext():  # one parse of a .gguf for tokenizer, config, weights
        toks = {}
        for side, source, revision in (("base", base, base_revision), ("reason", reason, reason_revision)):
            try:  # the tokenizers first: a missing path or a vocabulary mismatch is found before any weights load
                toks[side] = toks["base"] if same and side == "reason" else load_tokenizer(str(source), revision,
                                                                                          trust_remote_code)
            except ModelLoadError as err:
                err.side = side
                raise
        notes = check_same_vocabulary(toks["base"], toks["reason"])
        try:
            base_model, base_tok, base_spec = load_one(str(base), base_revision, dev, dt, trust_remote_code, spread,
                                                       tokenizer=toks["base"])
        except ModelLoadError as err:
            err.side = "base"
            raise
        if same:
            reason_model, reason_tok, reason_spec = base_model, base_tok, base_spec
        else:
            try:
                reason_model, reason_tok, reason_spec = load_one(str(reason), reason_revision, dev, dt,
                                                                 trust_remote_code, spread, tokenizer=toks["reason"])
            except ModelLoadError as err:
                err.side = "reason"
                raise
    vocab_size = max(len(base_tok), len(reason_tok))  # an added special token on one side still counts
    for side, model in (("base", base_model), ("reason", reason_model)):
        rows = model.get_output_embeddings().weight.shape[0]
        if rows < len(base_tok if side == "base" else reason_tok):
            raise VocabularyMismatchError(
                f"The {side} model's output layer has {rows} rows but its tokenizer has "
                f"{len(base_tok if side == 'base' else reason_tok)} tokens"
            )
        vocab_size = min(vocab_size, rows)
    given_reason_format = reason_format
    if reason_format is None:
        reason_format = "chat" if getattr(reason_tok, "chat_template", None) else (base_format or DEFAULT_BASE_FORMAT)
    formats = {"base": PromptFormat(format_spec(base_format or DEFAULT_BASE_FORMAT)),
               "reason": PromptFormat(format_spec(reason_format))}
    if same and formats["base"].spec != formats["reason"].spec:
        log.warning("base and reasoner are the same model (%s) but read different prompts (base: %r, reasoner: "
                    "%r%s); their disagreement then measures the prompt format, not the model. Give base_format and "
                    "reason_format the same value to compare like with like", base, formats["base"].spec,
                    formats["reason"].spec, "" if given_reason_format else ", the default for a tokenizer with a "
                    "chat template")
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
        vocab_notes=notes,
        prompt_tokenizers={"reason": reason_tok},  # its own chat template, even where the vocabularies match
        trust_remote_code=trust_remote_code,
    )
