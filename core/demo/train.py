"""Train the demo model organism: a tiny base / reasoning pair on the task in `core.demo.task`.

The base model learns plans and execution from a corpus where, for the "tricky" cue phrasings, the
plan usually takes its favourite route (add) instead of the right one, and execution faithfully
follows that plan; a few plans elsewhere are random. It therefore knows every route but has a
systematic wrong habit. The reasoning model is the base further trained on correct plans only.
Both share one byte-level BPE tokenizer trained on the task corpus and are saved in Hugging Face
format (config + safetensors + tokenizer), loadable like any other pair.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import torch

from core import settings
from core.demo import task as demo_task
from core.errors import InvalidInputError
from core.settings import StageProgress

log = logging.getLogger(__name__)

EOS = "<|endoftext|>"
PROMPT_FORMAT = "Question: {problem}\nAnswer:"
QA_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}Question: {{ message['content'] }}\nAnswer:"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] }}" + EOS + "{% endif %}"
    "{% endfor %}"
)
FAVOURITE_OP = "add"  # the base model's habitual reading of a tricky first step
TEST_SEED = 20260101  # seed of the held-out set (assets/problems/demo_test.jsonl)
CALIB_SEED = 20260202  # seed of the gate-calibration set (assets/problems/demo_calib.jsonl)
N_TEST, N_CALIB = 500, 100


@dataclass(frozen=True)
class DemoConfig:
    """Everything that decides the trained pair (written next to the weights as train_config.json)."""

    # model (LlamaForCausalLM)
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    intermediate: int = 384
    vocab_size: int = 512  # BPE target size (256 byte symbols + merges + 1 special)
    max_positions: int = 192
    # base corpus: how wrong the base's habits are
    habit_rate: float = 0.85  # P(plan takes FAVOURITE_OP) at a tricky first step
    noise_rate: float = 0.04  # P(a step's op is replaced by a random executable one), any cue
    # optimisation
    base_steps: int = 1500
    reason_steps: int = 300
    batch: int = 48
    base_lr: float = 3e-3
    reason_lr: float = 1e-3
    warmup: int = 40
    weight_decay: float = 0.01
    seed: int = 0
    tokenizer_corpus: int = 4000  # problems used to train the tokenizer
    dtype: str = "float32"  # dtype of the saved weights (training is always float32)


SIZES: dict[str, DemoConfig] = {
    "full": DemoConfig(),
    # a few-seconds version for tests: same code path, a toy network and a handful of steps
    "tiny": DemoConfig(hidden=32, layers=1, heads=2, intermediate=64, vocab_size=400, max_positions=320, base_steps=6,
                       reason_steps=3, batch=8, warmup=2, tokenizer_corpus=300),
}


# -- corpora -----------------------------------------------------------------------------------
def base_route(problem: dict, rng: random.Random, cfg: DemoConfig) -> tuple[str, str]:
    """The plan the base corpus writes for `problem`: the habit at tricky cues, sometimes noise."""
    route = list(problem["route"])
    numbers = tuple(problem["numbers"])
    first = _cue(demo_task.FIRST_CUES, problem["cues"][0])
    if first.tricky and rng.random() < cfg.habit_rate:
        route[0] = FAVOURITE_OP
    for step in (0, 1):
        if rng.random() < cfg.noise_rate:
            options = [op for op in demo_task.OPS if op != route[step]
                       and demo_task.run_route(_with(route, step, op), numbers) is not None]
            if options:
                route[step] = rng.choice(options)
    return route[0], route[1]


def _with(route: list[str], step: int, op: str) -> tuple[str, str]:
    new = list(route)
    new[step] = op
    return new[0], new[1]


def _cue(cues: tuple[demo_task.Cue, ...], cue_id: str) -> demo_task.Cue:
    for cue in cues:
        if cue.id == cue_id:
            return cue
    raise KeyError(cue_id)


def corpus(kind: str, seed: int, cfg: DemoConfig, exclude: set[str]) -> Iterator[tuple[str, str]]:
    """Endless (prompt, response) pairs: kind "base" (habits and noise) or "reason" (correct plans)."""
    if kind not in ("base", "reason"):
        raise InvalidInputError(f"Unknown corpus kind {kind!r}; choose one of: base, reason")
    rng = random.Random(seed)
    while True:
        p = demo_task.make_problem(rng)
        if p["question"] in exclude:
            continue
        route = base_route(p, rng, cfg) if kind == "base" else tuple(p["route"])
        yield PROMPT_FORMAT.format(problem=p["question"]), demo_task.render_solution(
            route, tuple(p["numbers"]), p["name"])


def held_out_problems(n: int = N_TEST) -> list[dict]:
    """The held-out problems (ids "demo-<TEST_SEED>-<i>"), the same on every machine."""
    return demo_task.make_problems(n, TEST_SEED)


def calibration_problems(n: int = N_CALIB) -> list[dict]:
    """Problems for calibrating the takeover gate: disjoint from the test set, also held out of training."""
    return demo_task.make_problems(n, CALIB_SEED, exclude={p["question"] for p in held_out_problems()})


def excluded_questions() -> set[str]:
    """Every question of the test and calibration sets (the training corpora skip them)."""
    return {p["question"] for p in held_out_problems() + calibration_problems()}


# -- tokenizer ---------------------------------------------------------------------------------
def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer (digits split one by one) with EOS as end and pad token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, unk_token=None,
                                   model_max_length=1024, clean_up_tokenization_spaces=False)
    fast.chat_template = QA_CHAT_TEMPLATE
    return fast


# -- model and training ------------------------------------------------------------------------
def build_model(cfg: DemoConfig, tokenizer) -> torch.nn.Module:
    """A fresh LlamaForCausalLM sized by `cfg`, seeded by cfg.seed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
        max_position_embeddings=cfg.max_positions, rms_norm_eps=1e-6, tie_word_embeddings=True,
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos,
    )
    return LlamaForCausalLM(config)


def encode_batch(pairs: list[tuple[str, str]], tokenizer, max_len: int) -> dict[str, torch.Tensor]:
    """Right-padded input_ids, attention_mask and labels (prompt and padding masked with -100)."""
    eos = tokenizer.convert_tokens_to_ids(EOS)
    prompts = tokenizer([p for p, _ in pairs], add_special_tokens=False)["input_ids"]
    full = tokenizer([p + r for p, r in pairs], add_special_tokens=False)["input_ids"]
    rows, labels = [], []
    for p_ids, ids in zip(prompts, full):
        assert ids[: len(p_ids)] == p_ids, "prompt tokens must be a prefix of prompt+response tokens"
        ids = ids + [eos]
        assert len(ids) <= max_len, f"sequence of {len(ids)} tokens exceeds max_positions {max_len}"
        rows.append(ids)
        labels.append([-100] * len(p_ids) + ids[len(p_ids):])
    width = max(map(len, rows))
    input_ids = torch.full((len(rows), width), eos, dtype=torch.long)  # (B, L)
    label_t = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, lab) in enumerate(zip(rows, labels)):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        label_t[i, : len(lab)] = torch.tensor(lab)
        mask[i, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": label_t}


def train_lm(model, tokenizer, stream: Iterator[tuple[str, str]], steps: int, lr: float, cfg: DemoConfig,
             desc: str, progress: StageProgress | None) -> list[float]:
    """AdamW with linear warm-up and cosine decay on response tokens; returns the loss per step.
    `progress(desc, step, steps)` after each step."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98))
    warmup = min(cfg.warmup, max(1, steps // 5))

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, steps - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    model.train()
    losses: list[float] = []
    for step in range(steps):
        batch = encode_batch([next(stream) for _ in range(cfg.batch)], tokenizer, cfg.max_positions)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if step % 10 == 0:
            log.info("%s step %d/%d: loss %.4f", desc, step, steps, sum(losses[-10:]) / len(losses[-10:]))
        if progress is not None:
            progress(desc, step + 1, steps)
    model.eval()
    return losses


def train_demo_pair(out_dir: str | Path, steps: int | None = None, size: str = "full", seed: int = settings.SEED,
                    progress: StageProgress | None = None, threads: int | None = 2, **overrides: Any) -> dict:
    """Train the base and reasoning models into out_dir/{base,reason} (+ pair.json, train_log.json).

    `steps` overrides the base step count (the reasoner gets the configured share of it).
    Returns the training log (config, losses, timings). `threads` applies during training only.
    """
    if size not in SIZES:
        raise InvalidInputError(f"Unknown demo size {size!r}; choose one of: {', '.join(SIZES)}")
    cfg = replace(SIZES[size], seed=seed, **overrides)
    if steps is not None:
        ratio = cfg.reason_steps / cfg.base_steps
        cfg = replace(cfg, base_steps=steps, reason_steps=max(1, round(steps * ratio)))
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _train(out_dir, cfg, size, progress)
    finally:  # the thread count is the process's: a caller's setting is not ours to keep
        torch.set_num_threads(before)


def _train(out_dir: str | Path, cfg: DemoConfig, size: str, progress: StageProgress | None) -> dict:
    """`train_demo_pair`'s work, with torch's thread count already set."""
    from transformers import set_seed

    set_seed(cfg.seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    exclude = excluded_questions()
    tok_stream = corpus("reason", cfg.seed + 1, cfg, exclude)
    tok_texts = [p + r + EOS for p, r in (next(tok_stream) for _ in range(cfg.tokenizer_corpus))]
    tokenizer = train_tokenizer(tok_texts, cfg.vocab_size)
    log.info("tokenizer: %d tokens", len(tokenizer))

    model = build_model(cfg, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %d parameters", n_params)
    t1 = time.perf_counter()
    base_losses = train_lm(model, tokenizer, corpus("base", cfg.seed + 2, cfg, exclude), cfg.base_steps,
                           cfg.base_lr, cfg, "base", progress)
    _save(model, tokenizer, out / "base", cfg)
    t2 = time.perf_counter()
    reason_losses = train_lm(model, tokenizer, corpus("reason", cfg.seed + 3, cfg, exclude),
                             cfg.reason_steps, cfg.reason_lr, cfg, "reason", progress)
    _save(model, tokenizer, out / "reason", cfg)
    t3 = time.perf_counter()

    (out / "pair.json").write_text(json.dumps(
        {"base_format": PROMPT_FORMAT, "reason_format": PROMPT_FORMAT}, indent=2) + "\n")
    report = {
        "config": asdict(cfg), "size": size, "parameters": n_params, "vocab": len(tokenizer),
        "threads": torch.get_num_threads(),
        "timings_s": {"tokenizer": round(t1 - t0, 2), "base": round(t2 - t1, 2),
                      "reason": round(t3 - t2, 2), "total": round(t3 - t0, 2)},
        "loss": {"base_first": base_losses[0], "base_last10": _mean(base_losses[-10:]),
                 "reason_first": reason_losses[0], "reason_last10": _mean(reason_losses[-10:])},
        "versions": {"torch": torch.__version__, "transformers": _version("transformers"),
                     "tokenizers": _version("tokenizers")},
    }
    (out / "train_log.json").write_text(json.dumps(report, indent=2) + "\n")
    log.info("trained demo pair in %.1fs -> %s", t3 - t0, out)
    return report


def _save(model, tokenizer, path: Path, cfg: DemoConfig) -> None:
    path.mkdir(parents=True, exist_ok=True)
    model.generation_config.do_sample = False
    dtype = getattr(torch, cfg.dtype)
    saved = model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)
    saved.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    (path / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")


def _mean(xs: list[float]) -> float:
    return sum(xs) / max(1, len(xs))


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)
