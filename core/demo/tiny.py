"""Tiny random model pairs built in-process (tokenizer trained with `tokenizers`), saved in HF format.

For tests and benchmarks, where no hub is reachable: the saved directories load through the same
`core.load_pair` path that users' models take.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core import settings
from core.errors import InvalidInputError

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CORPUS = [
    "Question: Tom has 3 boxes of 4 apples. He gives away 2. How many apples are left?",
    "Answer: First, we multiply, then we subtract. 3 * 4 = 12. 12 - 2 = 10. The answer is 10.",
    "Wait, let's check: 12 - 2 = 10. Therefore the answer is \\boxed{10}.",
    "Alternatively, consider the step where we add: 5 + 7 = 12. Hmm, verify it again.",
    "Café naïve — 東京 ✓ emoji 🙂 ünïcödé; tabs\tand  double  spaces.\n\nNew paragraph.",
]


def build_tiny_tokenizer(corpus: list[str] | None = None, vocab_size: int = 400) -> Any:
    """A byte-level BPE tokenizer trained in-process, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator((corpus or CORPUS) * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS[1:],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config(arch: str, vocab_size: int, hidden: int = 64, layers: int = 2, heads: int = 4,
                kv_heads: int = 2, max_positions: int = 8192, pad_vocab_to: int | None = None) -> Any:
    """A small Qwen3 or Llama config; `pad_vocab_to` pads the embedding past the tokenizer, as real models do."""
    from transformers import LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=pad_vocab_to or vocab_size, hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, eos_token_id=0, pad_token_id=0, bos_token_id=None,
        tie_word_embeddings=False,
    )
    if arch == "qwen3":
        return Qwen3Config(head_dim=hidden // heads, **common)
    if arch == "llama":
        return LlamaConfig(**common)
    raise InvalidInputError(f"Unknown arch {arch!r}; choose qwen3 or llama")


def build_tiny_model(out_dir: str | Path, tokenizer: Any, arch: str = "qwen3", seed: int = settings.SEED,
                     **config_kwargs: Any) -> Path:
    """Random-init a small model, save it (safetensors) with the tokenizer into `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(arch, len(tokenizer), **config_kwargs)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # larger logits than the default init, so distributions are not near-uniform
        model.get_output_embeddings().weight.mul_(20.0)
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_pair(out_dir: str | Path, arch: str = "qwen3", seed: int = settings.SEED, **config_kwargs: Any) -> tuple[Path, Path]:
    """Save a base and a reasoning model (same tokenizer, different random weights) under `out_dir`."""
    tokenizer = build_tiny_tokenizer()
    out = Path(out_dir)
    base = build_tiny_model(out / "base", tokenizer, arch, seed=seed, **config_kwargs)
    reason = build_tiny_model(out / "reason", tokenizer, arch, seed=seed + 1, **config_kwargs)
    return base, reason


def word_tokenizer(vocab_size: int = 151_936, corpus: list[str] | None = None) -> Any:
    """A word-level tokenizer of exactly `vocab_size` entries (the specials, the corpus' words, then
    filler words "w0", "w1", ...): a full-size vocabulary in a fraction of a second, for tests and benchmarks."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = list(SPECIALS) + ["<unk>"]
    for word in " ".join(corpus or CORPUS).split() + ["user", "assistant", "system"]:
        if word not in words:
            words.append(word)
    if vocab_size < len(words):
        raise InvalidInputError(f"vocab_size {vocab_size} is below the {len(words)} words the corpus needs")
    words += [f"w{i}" for i in range(vocab_size - len(words))]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>", unk_token="<unk>",
        additional_special_tokens=SPECIALS[1:],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
