"""The CUDA paths (bf16 or float32 weights, float32 metrics) against float64, and the GPU check script.

The device tests are skipped without CUDA. FORKPOINT_TEST_DEVICE=cpu runs them on the CPU instead
(bf16 weights included), which is how their logic is checked on a machine without a GPU.
`benchmarks/gpu_check.py --tiny --device cpu` runs everywhere (slow lane).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from refmetrics import model_reference, reference_errors, reference_metrics
from test_big_vocab import PROMPTS, RESPONSE, VOCAB, build_big_pair, check, guided_for

import core
from core.scoring.metrics import EMITTED, chunk_metrics, emitted_metrics, step_metrics
from core.scoring.registry import METRICS

ROOT = Path(__file__).resolve().parents[1]
DEVICE = os.environ.get("FORKPOINT_TEST_DEVICE", "cuda")
needs_device = pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(),
                                  reason="no CUDA device (FORKPOINT_TEST_DEVICE=cpu runs these on the CPU)")
TOL = 1e-5


@pytest.fixture(scope="module", autouse=True)
def exact_float32():
    """TF32 matmuls would round float32 to 10 mantissa bits: the float32 paths are meant to be exact."""
    if not torch.cuda.is_available():
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@needs_device
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_metric_maths_on_the_device_at_full_vocabulary(dtype: torch.dtype) -> None:
    """chunk_metrics and step_metrics + emitted_metrics on device logits (as the head returns them, or
    bf16) against float64 maths of the very same values."""
    rng = np.random.default_rng(7)
    a = torch.from_numpy(rng.normal(size=(12, VOCAB)) * 4).to(DEVICE, dtype)
    b = (0.6 * a.float() + torch.from_numpy(rng.normal(size=(12, VOCAB)) * 3.2).to(DEVICE)).to(dtype)
    y = torch.from_numpy(rng.integers(0, VOCAB, size=12)).to(DEVICE)
    y[:6] = a[:6].float().argmax(-1)
    got = chunk_metrics(a, b, y)
    assert got["entropy_base"].device.type == torch.device(DEVICE).type and got["jsd"].dtype == torch.float32
    m, lp = step_metrics(a, b)
    m.update(emitted_metrics(lp, y))
    ref = reference_metrics(a.double().cpu().numpy(), b.double().cpu().numpy(), y.cpu().numpy())
    for name in METRICS:
        err = np.max(np.abs(got[name].double().cpu().numpy() - ref[name]))
        assert err <= TOL, f"{name}: {err:.3g}"
        assert torch.equal(m[name], got[name]) or name not in EMITTED, name


@pytest.fixture(scope="module")
def device_pairs(tmp_path_factory) -> dict[str, core.ModelPair]:
    if DEVICE.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    root = tmp_path_factory.mktemp("gpu_pairs")
    return {"float32": build_big_pair(root / "f32", DEVICE, "float32"),
            "bfloat16": build_big_pair(root / "bf16", DEVICE, "bfloat16")}


@needs_device
def test_bf16_score_equals_float64_maths_of_its_logits(device_pairs) -> None:
    """bf16 weights: the forward is bf16, the metrics float32; against float64 maths of the same model's
    full-forward logits (so only the metric maths and the alignment are under test)."""
    pair = device_pairs["bfloat16"]
    assert pair.base.dtype == torch.bfloat16
    same_model = lambda model: model
    for trace in [core.score(pair, PROMPTS[0], RESPONSE),
                  *core.score_batch(pair, [(PROMPTS[1], "12 - 2 = 10."), (PROMPTS[0], RESPONSE)], batch_size=2)]:
        ref = model_reference(pair, same_model, trace.prompt_ids, trace.token_ids.tolist())
        bad = reference_errors(trace, ref, atol=TOL)
        assert not bad, "; ".join(bad)


@needs_device
@pytest.mark.parametrize("lookahead", [1, None], ids=["lock-step", "verify-ahead"])
def test_float32_generate_and_branch_on_the_device(device_pairs, float64_models, lookahead) -> None:
    """float32 weights on the device: generate (single and batched, Guided), the lazy EntropyGated
    catch-up and a branch, every metric within 1e-5 of the float64 forward."""
    pair = device_pairs["float32"]
    single = core.generate(pair, PROMPTS[0], guided_for(pair), max_new_tokens=8, lookahead=lookahead)
    check(pair, float64_models, single, "generate")
    batch = core.generate(pair, PROMPTS, core.Forced({1: 7, 3: "reason"}), max_new_tokens=6, temperature=0.8,
                          seed=2, samples=2, lookahead=lookahead)
    for i, trace in enumerate(batch):
        check(pair, float64_models, trace, f"batched row {i}")
    h = float(np.median(single.metrics["entropy_base"]))
    lazy = core.generate(pair, PROMPTS[1], core.EntropyGated(threshold=h), max_new_tokens=8, lookahead=lookahead)
    check(pair, float64_models, lazy, "EntropyGated")
    child = core.branch(pair, single, 3, max_new_tokens=8, lookahead=lookahead)
    check(pair, float64_models, child, "branch")


@pytest.mark.slow
def test_gpu_check_script_runs_on_cpu_with_tiny_shapes(tmp_path) -> None:
    """benchmarks/gpu_check.py end to end (--tiny --device cpu): every section is written and sane."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import gpu_check

    result = gpu_check.run(tmp_path, device="cpu", tiny=True)
    saved = json.loads((tmp_path / "gpu_check.json").read_text(encoding="utf-8"))
    text = (tmp_path / "gpu_check.md").read_text(encoding="utf-8")
    assert saved["env"]["vocab"] == 2000 and text.startswith("## GPU check")
    assert [r["T"] for r in saved["scoring"]] == [48] and saved["scoring"][0]["ratio"] > 0
    assert set(saved["exactness"]) == set(METRICS) and max(saved["exactness"].values()) <= TOL
    assert [r["batch"] for r in saved["decoding"]] == [1, 3]
    for row in saved["decoding"]:
        assert row["same_tokens"] and row["max_metric_diff"] <= TOL  # verify-ahead = lock-step on CPU float32
        assert row["lockstep_tok_s"] > 0 and row["ahead_tok_s"] > 0
    assert saved["branch"]["parent_tokens"] == 40 and saved["branch"]["far_s"] > 0
    assert result["total_s"] > 0 and "| 1 |" in text
