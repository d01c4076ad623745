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
from hypothesis import given
from hypothesis import strategies as st
from refmetrics import model_reference, reference_errors, reference_metrics
from spies import HostReads
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


@given(st.lists(st.tuples(st.sampled_from([torch.float32, torch.int64, torch.bool, torch.float64]),
                          st.lists(st.integers(0, 3), max_size=3)), max_size=6))
def test_to_host_groups_copies_by_dtype_and_gives_each_tensor_back(specs) -> None:
    """to_host's copy per dtype (as from a GPU) gives every tensor back exactly, in order, with its shape."""
    from core.pair.placement import to_host

    gen = torch.Generator().manual_seed(len(specs))
    tensors = {f"t{i}": (torch.rand(shape, generator=gen, dtype=torch.float64) * 100).to(dtype)
               for i, (dtype, shape) in enumerate(specs)}
    for group in (True, None):
        got = to_host(tensors, group=group)
        assert list(got) == list(tensors)
        for name, x in tensors.items():
            assert got[name].shape == tuple(x.shape) and got[name].dtype == x.numpy().dtype
            assert np.array_equal(got[name], x.numpy())


def test_logit_budgets_grow_with_the_card_and_only_with_its_total_memory(monkeypatch) -> None:
    """On CUDA the verify-ahead block and the lazy runs' kept logits get a share of the card's total memory (at
    batch 32 and V = 151,936 the CPU's bounds allow blocks of 3 positions); the same card gives the same bounds
    whatever it holds, so block sizes (and bf16 rounding) repeat."""
    import types

    from core.decoding import engine

    assert engine.logit_budget(torch.device("cpu")) == (engine.LOGIT_BYTES, engine.DEFERRED_BYTES)
    card = types.SimpleNamespace(total_memory=141 << 30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: card)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: pytest.fail("free memory read"))
    block, deferred = engine.logit_budget(torch.device("cuda:0"))
    assert block == int((141 << 30) / 32) and deferred == block // 4
    per_position = 8 * 32 * 151_936 * 4  # Decoder._block_plan's bytes per block position at batch 32
    assert engine.LOGIT_BYTES // per_position == 3 and block // per_position >= 28
    card.total_memory = 8 << 30  # a small card: never below the CPU's bounds
    assert engine.logit_budget(torch.device("cuda:0")) == (engine.LOGIT_BYTES, engine.DEFERRED_BYTES)


# what a token may cost in host waits, per decoder at batch 1 (the GPU check counted, before its fixes, 3.42 / 12.36 /
# 7.55 / 7.45): the token's id (one read per step: transformers' own `generate` makes 1.12), a block's metrics in one
# copy per dtype, the lazy gates' entropy, top-2 and hidden state in one copy and their entropy's finiteness check
HOST_READS_PER_TOKEN = {"base_only": 1.5, "guided": 4.0, "entropy_gated": 3.5, "router": 3.5}


def test_decoding_waits_for_the_device_about_once_a_token(monkeypatch, tmp_path) -> None:
    """Host reads and blocking copies made by core per token (each a synchronisation on a GPU), counted on the CPU
    with the GPU's grouped copies: the ids fed and their positions cross without a wait, a block's metrics and a
    lazy gate's inputs come in one copy per dtype."""
    sys.path.insert(0, str(ROOT))
    import core.decoding.block_sizing as block_sizing
    import core.decoding.engine as engine
    import core.scoring.teacher_forced as teacher_forced
    from benchmarks import gpu_check
    from core.pair.placement import to_host

    as_from_a_gpu = lambda tensors: to_host(tensors, group=True)  # noqa: E731
    for module in (engine, teacher_forced):
        monkeypatch.setattr(module, "to_host", as_from_a_gpu, raising=False)
    # and a GPU's block sizes: chosen from the outputs alone (a CPU's follow its timings, so its count of blocks,
    # and of reads, moved from run to run: 4.36 reads a token for guided in one CI run)
    monkeypatch.setattr(block_sizing.SIZERS, "start", lambda pair, policy, rows, timed: block_sizing.BlockSizer(timed=False))
    torch.manual_seed(0)
    pair = gpu_check.make_pair(gpu_check.SHAPES["tiny-qwen3"], gpu_check.TINY_REASON, torch.device("cpu"),
                               torch.float32)
    policies, _ = gpu_check.gates(pair, dict(gpu_check.TINY, calib=64, rho=0.05), tmp_path)
    prompt, n = gpu_check.problems(1)[0], 64
    for name, bound in HOST_READS_PER_TOKEN.items():
        with HostReads() as reads:
            trace = core.generate(pair, prompt, policies[name], max_new_tokens=n)
        assert len(trace) == n
        assert reads.total / n <= bound, (name, reads.total / n, reads.sites.most_common(6))


@pytest.mark.slow
def test_gpu_check_script_runs_on_cpu_with_tiny_shapes(tmp_path) -> None:
    """benchmarks/gpu_check.py end to end (--tiny --device cpu): every section is written and sane."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import gpu_check

    result = gpu_check.run(tmp_path, device="cpu", tiny=True)
    saved = json.loads((tmp_path / "gpu_check.json").read_text(encoding="utf-8"))
    text = (tmp_path / "gpu_check.md").read_text(encoding="utf-8")
    assert saved["errors"] == {} and saved["env"]["vocab"] == 2000 and text.startswith("## GPU check")
    assert [r["T"] for r in saved["scoring"]] == [48] and saved["scoring"][0]["ratio"] > 0
    assert set(saved["exactness"]) == set(METRICS) and max(saved["exactness"].values()) <= TOL
    assert set(saved["gates"]["knobs"]) == set(gpu_check.GATES)
    decoders = ["transformers", *gpu_check.GATES]
    assert [(r["batch"], r["policy"]) for r in saved["decoding"]] == [(b, d) for b in (1, 3) for d in decoders]
    for row in saved["decoding"]:
        assert row["tokens"] == row["batch"] * row["new_tokens"] and row["tok_s"] > 0, row
        low, high = row["ms_per_step_range"]
        assert row["runs"] == 2 and low <= row["ms_per_step"] <= high, row  # TINY: two alternating runs, the median's
        assert row["rho"] == 0 or row["policy"] in gpu_check.GATES[1:], row  # base_only and transformers: none
        if row["policy"] == "base_only":  # the reasoner reads each block once after the base: fewer than one a step
            assert 0 < row["reason_calls_per_step"] < 1, row
    lock = saved["lockstep"]
    assert lock["same_tokens"] and lock["max_metric_diff"] <= TOL  # verify-ahead = lock-step on CPU float32
    assert set(saved["syncs"]) == set(decoders) and all(v is None for v in saved["syncs"].values())  # CUDA only
    branch = saved["branch"]
    assert branch["parent_tokens"] == 64 and branch["child_tokens"] == branch["far_pos"] + branch["new_tokens"]
    assert branch["near_s"] > 0 and branch["far_s"] > 0 and branch["cold_far_s"] > 0
    assert result["total_s"] > 0 and "| 3 | transformers |" in text


@pytest.mark.slow
def test_gpu_check_budget_skips_the_decoding_runs_and_keeps_the_rest(tmp_path) -> None:
    """--budget 0: no decoding run starts (each is listed as skipped), every other section is still measured."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import gpu_check

    saved = gpu_check.run(tmp_path, device="cpu", tiny=True, budget=0)
    assert saved["errors"] == {} and saved["decoding"] and all(r["skipped"] for r in saved["decoding"])
    assert saved["scoring"] and saved["lockstep"]["same_tokens"] and saved["branch"]["far_s"] > 0
    assert "skipped (time budget)" in (tmp_path / "gpu_check.md").read_text(encoding="utf-8")
