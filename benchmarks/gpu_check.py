"""The whole GPU check of issue 13 in a few minutes, written to a folder (JSON + markdown).

    python benchmarks/gpu_check.py --out gpu_results                    # CUDA, bf16, Qwen3 shapes
    python benchmarks/gpu_check.py --out /tmp/gpu_tiny --tiny --device cpu   # the code path, in seconds

A Qwen3-0.6B-shaped base with a Qwen3-8B-shaped reasoner (random weights, bf16 on CUDA, a word-level
tokenizer of Qwen3's 151,936 tokens), and for each:
  scoring   `core.score`'s path vs the bare forwards (ratio b/a, bench_scoring.py's method) at T = 512
            and 2048, and peak CUDA memory above the models, chunked vs naive;
  exactness every metric of a scored trace (float32 metrics of the bf16 model's logits, on the device)
            against float64 maths of the same logits;
  decoding  tokens/s of `core.generate` lock-step (`lookahead=1`) and verify-ahead (default) with a
            Guided gate calibrated at r = 0.05 on a base rollout, batch 1 and 16, and whether the two
            emitted the same tokens;
  branch    `core.branch` latency (call to return, 32 new tokens) near the start and near the end of
            a held parent.
Results: OUT/gpu_check.json and OUT/gpu_check.md (the markdown goes into benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import core
from benchmarks.bench_scoring import SHAPES, Shape, build_model, cuda_memory, time_pair
from core.annotate.spikes import calibrate_gate
from core.demo.tiny import word_tokenizer
from core.pair.forward import backbone, head
from core.pair.loading import ModelPair, ModelSpec, PromptFormat
from core.scoring.metrics import chunk_metrics
from core.scoring.registry import METRICS, score_values

FORMAT = "Question: {problem}\nAnswer:"
TINY_REASON = Shape("qwen3", 3, 96, 192, 4, 2, 24, 2000)  # "8x" the tiny base, for --tiny
FULL = {"base": "qwen3-0.6b", "reason": "qwen3-8b", "score_T": (512, 2048), "new": 256, "calib": 128,
        "parent": 1024, "branch_new": 32, "repeats": 3, "batches": (1, 16)}
TINY = {"base": "tiny-qwen3", "reason": None, "score_T": (48,), "new": 12, "calib": 16, "parent": 40,
        "branch_new": 4, "repeats": 1, "batches": (1, 3)}


def problems(n: int) -> list[str]:
    """n distinct short problems in the word tokenizer's vocabulary."""
    return [f"Tom has {i + 3} boxes of 4 apples. He gives away 2. How many apples are left?" for i in range(n)]


def make_pair(base_shape: Shape, reason_shape: Shape, device: torch.device, dtype: torch.dtype) -> ModelPair:
    """Two random models of the given shapes over a word-level tokenizer of their vocabulary size."""
    if base_shape.vocab != reason_shape.vocab:
        raise ValueError("both shapes need one vocabulary")
    tok = word_tokenizer(base_shape.vocab)
    fmt = PromptFormat(FORMAT)
    return ModelPair(base=build_model(base_shape, 0, device, dtype), reason=build_model(reason_shape, 1, device, dtype),
                     tokenizer=tok, specs={"base": ModelSpec("random:base"), "reason": ModelSpec("random:reason")},
                     formats={"base": fmt, "reason": fmt}, device=device, dtype=dtype, vocab_size=base_shape.vocab,
                     eos_ids=frozenset())  # random weights: never stop early


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall(fn, device: torch.device) -> tuple[float, Any]:
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def scoring(pair: ModelPair, lengths: tuple[int, ...], repeats: int) -> list[dict]:
    rows = []
    for length in lengths:
        result = time_pair(pair, length, repeats, 256, 10)
        row = {"T": length, "bare_s": result["wall"]["bare"], "score_s": result["wall"]["score"],
               "ratio": result["ratio_wall"]}
        if pair.device.type == "cuda":
            mem = cuda_memory(pair, length, 256, 10)
            row.update(peak_chunked_mib=mem["chunked"], peak_naive_mib=mem["naive"])
        rows.append(row)
    return rows


@torch.inference_mode()
def exactness(pair: ModelPair, length: int) -> dict[str, float]:
    """Max |float32 metric on the device - float64 maths of the same logits| per metric."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, pair.vocab_size, (1, length + 1), generator=gen).to(pair.device)
    logits = [head(m, backbone(m, ids[:, :-1])[0][0], pair.vocab_size) for m in (pair.base, pair.reason)]
    targets = ids[0, 1:]
    got = chunk_metrics(logits[0], logits[1], targets)
    ref = chunk_metrics(logits[0].double().cpu(), logits[1].double().cpu(), targets.cpu())
    return {name: float((got[name].double().cpu() - ref[name].double()).abs().max()) for name in METRICS}


def gate_policy(pair: ModelPair, calib: int) -> tuple[core.Guided, dict]:
    """A Guided gate calibrated (r = 0.05, W = 16) on one base rollout of `calib` tokens."""
    rollout = core.generate(pair, problems(1)[0], core.BaseOnly(), max_new_tokens=calib)
    gate = calibrate_gate([score_values(rollout.metrics, "cross_entropy")], 0.05, 16)
    return core.Guided(tau=gate.tau, lam=gate.lam, window=gate.window), {"tau": gate.tau, "lam": gate.lam}


def decoding(pair: ModelPair, policy: core.Guided, new: int, batches: tuple[int, ...]) -> list[dict]:
    rows = []
    for batch in batches:
        prompts = problems(batch)
        core.generate(pair, prompts, policy, max_new_tokens=4, lookahead=1)  # warm-up
        runs = {}
        for name, lookahead in (("lock-step", 1), ("verify-ahead", None)):
            seconds, traces = wall(lambda prompts=prompts, lookahead=lookahead: core.generate(
                pair, prompts, policy, max_new_tokens=new, lookahead=lookahead), pair.device)
            runs[name] = (seconds, traces if isinstance(traces, list) else [traces])
        (t_lock, lock), (t_ahead, ahead) = runs["lock-step"], runs["verify-ahead"]
        tokens = sum(len(t) for t in ahead)
        same = all(np.array_equal(a.token_ids, b.token_ids) for a, b in zip(lock, ahead))
        diff = max((float(np.nanmax(np.abs(a.metrics[m].astype(np.float64) - b.metrics[m].astype(np.float64))))
                    for a, b in zip(lock, ahead) for m in METRICS if len(a) == len(b) and len(a)), default=0.0)
        rows.append({"batch": batch, "new_tokens": new, "lockstep_tok_s": sum(len(t) for t in lock) / t_lock,
                     "ahead_tok_s": tokens / t_ahead, "speedup": t_lock / t_ahead, "same_tokens": same,
                     "max_metric_diff": diff, "takeovers": int(sum((t.source != "base").sum() for t in ahead))})
    return rows


def branching(pair: ModelPair, parent_len: int, new: int, repeats: int) -> dict:
    parent = core.generate(pair, problems(1)[0], core.BaseOnly(), max_new_tokens=parent_len)
    out = {"parent_tokens": len(parent), "new_tokens": new}
    for label, pos in (("near", min(8, parent_len // 4)), ("far", parent_len - new - 8)):
        times = []
        for _ in range(repeats + 1):
            seconds, child = wall(lambda pos=pos: core.branch(pair, parent, pos, max_new_tokens=pos + new), pair.device)
            assert len(child) == pos + new
            times.append(seconds)
        out[f"{label}_pos"], out[f"{label}_s"] = pos, statistics.median(times[1:])
    out["ratio"] = out["far_s"] / out["near_s"]
    return out


def markdown(result: dict) -> str:
    env = result["env"]
    lines = [f"## GPU check ({env['device_name']})", "", "```", result["command"], "```", "",
             (f"{env['base']} base + {env['reason']} reasoner, random weights, {env['dtype']}, vocabulary "
              f"{env['vocab']}, torch {env['torch']}."), "",
             "| scoring T | bare s | score s | **b / a** | peak MiB chunked | peak MiB naive |", "|---:|---:|---:|---:|---:|---:|"]
    for r in result["scoring"]:
        lines.append(f"| {r['T']} | {r['bare_s']:.3f} | {r['score_s']:.3f} | **{r['ratio']:.3f}** | "
                     f"{r.get('peak_chunked_mib', float('nan')):.0f} | {r.get('peak_naive_mib', float('nan')):.0f} |")
    worst = max(result["exactness"].items(), key=lambda kv: kv[1])
    lines += ["", (f"Exactness (float32 metrics on the device vs float64 maths of the same logits): worst "
                   f"{worst[0]} {worst[1]:.2e}."), "",
              "| batch | lock-step tok/s | verify-ahead tok/s | speedup | same tokens | max metric diff | takeovers |",
              "|---:|---:|---:|---:|---|---:|---:|"]
    for r in result["decoding"]:
        lines.append(f"| {r['batch']} | {r['lockstep_tok_s']:.1f} | {r['ahead_tok_s']:.1f} | **{r['speedup']:.2f}** | "
                     f"{r['same_tokens']} | {r['max_metric_diff']:.2e} | {r['takeovers']} |")
    b = result["branch"]
    lines += ["", (f"Branch ({b['new_tokens']} new tokens, held parent of {b['parent_tokens']}): pos {b['near_pos']} "
                   f"{b['near_s'] * 1000:.0f} ms, pos {b['far_pos']} {b['far_s'] * 1000:.0f} ms, ratio **{b['ratio']:.2f}**."),
              f"Total {result['total_s']:.0f} s."]
    return "\n".join(lines) + "\n"


def run(out: Path, device: str = "cuda", tiny: bool = False, dtype: str | None = None) -> dict:
    """Run every check and write OUT/gpu_check.json and OUT/gpu_check.md; returns the result."""
    t0 = time.perf_counter()
    plan = TINY if tiny else FULL
    dev = torch.device(device)
    dt = getattr(torch, dtype) if dtype else (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    base_shape = SHAPES[plan["base"]]
    reason_shape = TINY_REASON if tiny else SHAPES[plan["reason"]]
    torch.manual_seed(0)
    pair = make_pair(base_shape, reason_shape, dev, dt)
    result: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/gpu_check.py", *sys.argv[1:]]) if __name__ == "__main__" else
        f"gpu_check.run(out, device={device!r}, tiny={tiny})",
        "env": {"device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
                "torch": torch.__version__, "dtype": str(dt).removeprefix("torch."), "vocab": base_shape.vocab,
                "base": plan["base"], "reason": plan["reason"] or "tiny-reason"},
    }
    result["scoring"] = scoring(pair, plan["score_T"], plan["repeats"])
    result["exactness"] = exactness(pair, min(64, plan["score_T"][0]))
    policy, result["gate"] = gate_policy(pair, plan["calib"])
    result["decoding"] = decoding(pair, policy, plan["new"], plan["batches"])
    result["branch"] = branching(pair, plan["parent"], plan["branch_new"], plan["repeats"])
    if dev.type == "cuda":
        result["env"]["max_memory_allocated_mib"] = torch.cuda.max_memory_allocated(dev) / 2**20
    result["total_s"] = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2, default=float), encoding="utf-8")
    (out / "gpu_check.md").write_text(markdown(result), encoding="utf-8")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for gpu_check.json and gpu_check.md")
    parser.add_argument("--device", default="cuda", help="torch device (cpu with --tiny checks the code path)")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes: seconds, for testing this script")
    parser.add_argument("--dtype", default=None, help="model dtype (default bfloat16 on CUDA, float32 elsewhere)")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("no CUDA device here; use --tiny --device cpu to check the script")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    result = run(args.out, args.device, args.tiny, args.dtype)
    print(markdown(result))


if __name__ == "__main__":
    main()
