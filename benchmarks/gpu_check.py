"""The engine on a GPU at the paper's size (issue 34), in one run, written to a folder (JSON + markdown).

    python benchmarks/gpu_check.py --out gpu_results                    # CUDA, bf16, Qwen3 shapes
    python benchmarks/gpu_check.py --out /tmp/gpu_tiny --tiny --device cpu   # the code path, in seconds

A Qwen3-0.6B-shaped base with a Qwen3-8B-shaped reasoner (random weights, bf16 on CUDA, a word-level
tokenizer of Qwen3's 151,936 tokens; no hub), and for each:
  scoring    `core.score`'s path vs the bare forwards of the two models (b/a, bench_scoring.py's method)
             at T = 512 and 2048, and peak CUDA memory above the models, chunked vs naive;
  exactness  every metric of a scored trace (float32 metrics of the bf16 model's logits, on the device)
             against float64 maths of the same logits;
  decoding   tokens/s of `core.generate` (verify-ahead, the default) for base_only, guided, entropy_gated
             and the learned router, each gate set to the same takeover rate ρ on base rollouts (equal-ρ
             calibration, the router trained on them), at batches of 1, 8 and 32 rows of 512 new tokens;
             the base alone through transformers' own `generate` at the same batch as the reference;
             realised ρ, the reasoner's forwards (calls, rows) per token, peak CUDA memory of each run;
  lock-step  Guided at batch 1, lock-step (`lookahead=1`) against verify-ahead: same tokens, speed-up;
  syncs      host-device synchronisations per token of each gate and of `generate` (torch's sync debug mode);
  branch     `core.branch` latency (call to return, 32 new tokens) at position 40 and at 4,000 of a 4,096-token
             parent: cold (its first branch reads the prefix) and held (`warm_caches`).
Every section is written as soon as it ends (decoding: each batch), so a run stopped at a time limit keeps what it
measured; `--budget S` skips the decoding runs that would start after S seconds, `--sections` and `--batches`
choose what runs, `--decode-repeats N` runs each decoder N times, alternating, and reports the median.
Results: OUT/gpu_check.json and OUT/gpu_check.md (the markdown goes into benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import core
from benchmarks.bench_scoring import SHAPES, Shape, build_model, cuda_memory, time_pair
from core.decoding.caches import warm_caches
from core.demo.tiny import SPECIALS, word_tokenizer
from core.pair.forward import backbone, count_forwards, head
from core.pair.loading import ModelPair, ModelSpec, PromptFormat
from core.scoring.metrics import chunk_metrics
from core.scoring.registry import METRICS

FORMAT = "Question: {problem}\nAnswer:"
TINY_REASON = Shape("qwen3", 3, 96, 192, 4, 2, 24, 2000)  # "8x" the tiny base, for --tiny
GATES = ("base_only", "guided", "entropy_gated", "router")  # the gates timed, in this order
FULL = {"base": "qwen3-0.6b", "reason": "qwen3-8b", "score_T": (512, 2048), "new": 512, "batches": (1, 8, 32),
        "calib_rows": 8, "calib": 256, "rho": 0.05, "lockstep_new": 256, "sync_tokens": 64, "prefix": 4096,
        "branch_pos": 40, "branch_new": 32, "repeats": 3, "decode_repeats": 1}
TINY = {"base": "tiny-qwen3", "reason": None, "score_T": (48,), "new": 12, "batches": (1, 3),
        "calib_rows": 4, "calib": 32, "rho": 0.1, "lockstep_new": 12, "sync_tokens": 8, "prefix": 64,
        "branch_pos": 8, "branch_new": 4, "repeats": 1, "decode_repeats": 2}


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


def wall(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def peak_reset(device: torch.device) -> int:
    """Reset the peak counter; returns the bytes allocated now (what a run's peak is measured above)."""
    if device.type != "cuda":
        return 0
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def peak_mib(device: torch.device, before: int) -> float | None:
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20 if device.type == "cuda" else None


def count_syncs(fn: Callable[[], Any], device: torch.device) -> int | None:
    """Host-device synchronisations made by `fn`, as torch's CUDA sync debug mode reports them (None off CUDA)."""
    if device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
            torch.cuda.synchronize(device)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def hf_generate(pair: ModelPair, prompts: list[str], new: int) -> torch.Tensor:
    """The reference: the base alone through transformers' own greedy `generate`, `new` tokens per row, the
    prompts forkpoint formats (left-padded to one batch)."""
    ids = [pair.prompt_ids(p)["base"] for p in prompts]
    width = max(map(len, ids))
    pad = int(pair.tokenizer.pad_token_id or 0)
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids], device=pair.device)
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=pair.device)
    with torch.inference_mode():
        out = pair.base.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                 do_sample=False, pad_token_id=pad)
    return out[:, width:]


# -- sections -----------------------------------------------------------------------------------------------


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


def gates(pair: ModelPair, plan: dict, workdir: Path) -> tuple[dict[str, core.Policy], dict]:
    """Every gate at the same takeover rate ρ: base rollouts, the router trained on them (target "gate"), and
    `build_policy(rho=...)`'s equal-ρ calibration of each gate's knob on them."""
    t0 = time.perf_counter()
    rollouts = core.generate(pair, problems(plan["calib_rows"]), core.BaseOnly(), max_new_tokens=plan["calib"])
    t_rollouts = time.perf_counter() - t0
    router = core.train_router(pair, rollouts, "gate", out=workdir / "router")
    rho = plan["rho"]
    policies: dict[str, core.Policy] = {"base_only": core.BaseOnly()}
    for name in GATES[1:]:
        params = {"path": str(workdir / "router")} if name == "router" else {}
        policies[name] = core.build_policy(pair, name, params, rho=rho, rollouts=rollouts)
    info = {"rho": rho, "rollouts": f"{len(rollouts)} x {plan['calib']} tokens", "rollouts_s": t_rollouts,
            "calibration_s": time.perf_counter() - t0, "router_held_out_auroc": router.card["held_out_auroc"],
            "knobs": {name: {k: v for k, v in policy.record().get("params", {}).items()
                             if k in ("tau", "lam", "threshold", "cut")} for name, policy in policies.items()}}
    return policies, info


def decoding(pair: ModelPair, policies: dict[str, core.Policy], plan: dict, deadline: float,
             on_row: Callable[[dict], None]) -> None:
    """tokens/s of every gate and of transformers' `generate` per batch, each a row passed to `on_row` once the
    batch is measured: `plan["decode_repeats"]` runs of each, alternating decoders (the order reversed every
    repeat), the median's row with the spread beside it; a run that would start after `deadline` is skipped."""
    new, dev, repeats = plan["new"], pair.device, plan["decode_repeats"]
    decoders = ("transformers", *GATES)  # the reference first: its ratio is what each row reads
    for batch in plan["batches"]:
        prompts = problems(batch)
        core.generate(pair, prompts, core.BaseOnly(), max_new_tokens=4)  # warm-up at this batch
        hf_generate(pair, prompts, 4)  # and of transformers' own path
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in decoders}
        for rep in range(repeats):
            for name in decoders if rep % 2 == 0 else decoders[::-1]:
                if time.perf_counter() > deadline:
                    continue
                before = peak_reset(dev)
                if name == "transformers":
                    seconds, out = wall(lambda prompts=prompts: hf_generate(pair, prompts, new), dev)
                    run = {"tokens": int(out.numel()), "taken": 0}
                else:
                    with count_forwards(pair.reason) as reason:
                        seconds, traces = wall(lambda prompts=prompts, name=name: core.generate(
                            pair, prompts, policies[name], max_new_tokens=new), dev)
                    run = {"tokens": sum(len(t) for t in traces),
                           "taken": int(sum((t.source == "reason").sum() for t in traces)),
                           "calls": reason.calls, "rows": reason.rows}
                runs[name].append({**run, "seconds": seconds, "peak_mib": peak_mib(dev, before)})
        for name in decoders:
            row: dict[str, Any] = {"batch": batch, "policy": name, "new_tokens": new}
            if not runs[name]:
                on_row({**row, "skipped": "time budget"})
                continue
            done = sorted(runs[name], key=lambda r: r["seconds"])
            mid = done[(len(done) - 1) // 2]  # the median run (the lower one of an even count)
            row.update(tokens=mid["tokens"], seconds=mid["seconds"], tok_s=mid["tokens"] / mid["seconds"],
                       ms_per_step=1000 * mid["seconds"] / new, rho=mid["taken"] / mid["tokens"],
                       peak_mib=mid["peak_mib"], runs=len(done),
                       ms_per_step_range=[1000 * done[0]["seconds"] / new, 1000 * done[-1]["seconds"] / new])
            if "calls" in mid:
                row.update(reason_calls_per_step=mid["calls"] / new, reason_rows_per_token=mid["rows"] / mid["tokens"])
            on_row(row)


def lockstep(pair: ModelPair, policy: core.Policy, new: int) -> dict:
    """Guided at batch 1: lock-step against verify-ahead (the same tokens; the speed-up)."""
    prompt = problems(1)[0]
    core.generate(pair, prompt, policy, max_new_tokens=4, lookahead=1)  # warm-up
    runs = {}
    for name, lookahead in (("lock-step", 1), ("verify-ahead", None)):
        runs[name] = wall(lambda lookahead=lookahead: core.generate(pair, prompt, policy, max_new_tokens=new,
                                                                    lookahead=lookahead), pair.device)
    (t_lock, lock), (t_ahead, ahead) = runs["lock-step"], runs["verify-ahead"]
    same = bool(np.array_equal(lock.token_ids, ahead.token_ids) and np.array_equal(lock.source, ahead.source))
    diff = {m: float(np.nanmax(np.abs(lock.metrics[m].astype(np.float64) - ahead.metrics[m].astype(np.float64))))
            for m in METRICS if same and len(lock)}
    first = int(np.argmax(lock.token_ids != ahead.token_ids)) if not same and len(lock) == len(ahead) else None
    return {"new_tokens": new, "lockstep_tok_s": len(lock) / t_lock, "ahead_tok_s": len(ahead) / t_ahead,
            "speedup": t_lock / t_ahead, "same_tokens": same, "first_difference": first,
            "metric_diff": diff, "max_metric_diff": max((v for m, v in diff.items() if not m.startswith("rank")),
                                                        default=None),
            "max_rank_diff": max((v for m, v in diff.items() if m.startswith("rank")), default=None),
            "takeovers": int((ahead.source == "reason").sum())}


def syncs(pair: ModelPair, policies: dict[str, core.Policy], new: int) -> dict[str, float | None]:
    """Host-device synchronisations per token at batch 1, per gate and for transformers' `generate`."""
    prompt = problems(1)[0]
    out: dict[str, float | None] = {}
    for name in GATES:
        counted = count_syncs(lambda name=name: core.generate(pair, prompt, policies[name], max_new_tokens=new),
                              pair.device)
        out[name] = None if counted is None else counted / new
    counted = count_syncs(lambda: hf_generate(pair, [prompt], new), pair.device)
    out["transformers"] = None if counted is None else counted / new
    return out


def branching(pair: ModelPair, plan: dict) -> dict:
    """`core.branch` latency near the start and near the end of a long parent (a scored random response):
    its first branch reads the prefix (cold); once held (`warm_caches`), a branch crops the held caches. A
    branch of another parent of the same length runs first, so one-time set-up of the shapes is not counted."""
    prefix, new, repeats = plan["prefix"], plan["branch_new"], plan["repeats"]
    near, far = plan["branch_pos"], prefix - plan["branch_pos"]
    parents = []
    for seed in (3, 4):
        ids = torch.randint(len(SPECIALS) + 1, pair.vocab_size, (prefix,),
                            generator=torch.Generator().manual_seed(seed)).tolist()
        parents.append(wall(lambda ids=ids: core.score(pair, problems(1)[0], ids), pair.device))
    (seconds_scored, parent), (_, other) = parents
    core.branch(pair, other, far, max_new_tokens=far + new)  # warm-up: the shapes of a cold branch
    out: dict[str, Any] = {"parent_tokens": len(parent), "score_s": seconds_scored, "new_tokens": new,
                           "near_pos": near, "far_pos": far}
    out["cold_far_s"], child = wall(lambda: core.branch(pair, parent, far, max_new_tokens=far + new), pair.device)
    out["child_tokens"] = len(child)
    out["warm_s"], _ = wall(lambda: warm_caches(pair, parent), pair.device)
    for label, pos in (("near", near), ("far", far)):
        times = [wall(lambda pos=pos: core.branch(pair, parent, pos, max_new_tokens=pos + new), pair.device)[0]
                 for _ in range(repeats + 1)]
        out[f"{label}_s"] = statistics.median(times[1:])
    out["ratio"] = out["far_s"] / out["near_s"]
    return out


# -- report -------------------------------------------------------------------------------------------------


def fmt(value: Any, spec: str = ".3f") -> str:
    return "–" if value is None or (isinstance(value, float) and np.isnan(value)) else format(value, spec)


def markdown(result: dict) -> str:
    env = result["env"]
    lines = [f"## GPU check ({env['device_name']})", "", "```", result["command"], "```", "",
             (f"{env['base']} base + {env['reason']} reasoner, random weights, {env['dtype']}, vocabulary "
              f"{env['vocab']}, torch {env['torch']}, transformers {env['transformers']}; models "
              f"{fmt(env.get('models_mib'), '.0f')} MiB on the device, built in {fmt(env.get('build_s'), '.1f')} s."), ""]
    if result.get("scoring"):
        lines += ["| scoring T | bare s | score s | **b / a** | peak MiB chunked | peak MiB naive |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for r in result["scoring"]:
            lines.append(f"| {r['T']} | {r['bare_s']:.3f} | {r['score_s']:.3f} | **{r['ratio']:.3f}** | "
                         f"{fmt(r.get('peak_chunked_mib'), '.0f')} | {fmt(r.get('peak_naive_mib'), '.0f')} |")
    if result.get("exactness"):
        worst = max(result["exactness"].items(), key=lambda kv: kv[1])
        lines += ["", (f"Exactness (float32 metrics on the device vs float64 maths of the same logits): worst "
                       f"{worst[0]} {worst[1]:.2e}.")]
    if result.get("gates"):
        g = result["gates"]
        lines += ["", (f"Gates at ρ = {g['rho']} (equal-ρ calibration on {g['rollouts']} base rollouts, "
                       f"{g['calibration_s']:.1f} s with the router's training; router held-out AUROC "
                       f"{fmt(g['router_held_out_auroc'])}): " +
                       "; ".join(f"{n} {json.dumps(k)}" for n, k in g["knobs"].items() if k) + ".")]
    if result.get("decoding"):
        lines += ["", "| batch | decoder | tokens/s | ms / step (range) | vs transformers | ρ | reasoner calls / step | "
                      "reasoner rows / token | peak MiB |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        ref = {r["batch"]: r["tok_s"] for r in result["decoding"] if r["policy"] == "transformers" and "tok_s" in r}
        for r in result["decoding"]:
            if "skipped" in r:
                lines.append(f"| {r['batch']} | {r['policy']} | skipped ({r['skipped']}) | | | | | | |")
                continue
            vs = r["tok_s"] / ref[r["batch"]] if r["batch"] in ref else None
            spread = (f" ({r['ms_per_step_range'][0]:.1f}-{r['ms_per_step_range'][1]:.1f})"
                      if r.get("runs", 1) > 1 else "")
            lines.append(f"| {r['batch']} | {r['policy']} | {r['tok_s']:.1f} | {r['ms_per_step']:.1f}{spread} | "
                         f"{fmt(vs, '.2f')}× | {r['rho']:.3f} | {fmt(r.get('reason_calls_per_step'))} | "
                         f"{fmt(r.get('reason_rows_per_token'))} | {fmt(r.get('peak_mib'), '.0f')} |")
    if result.get("lockstep"):
        r = result["lockstep"]
        lines += ["", (f"Guided, batch 1, {r['new_tokens']} tokens: lock-step {r['lockstep_tok_s']:.1f} tok/s, "
                       f"verify-ahead {r['ahead_tok_s']:.1f} tok/s, speed-up **{r['speedup']:.2f}×**; same tokens: "
                       f"{r['same_tokens']}" + (f" (max diff of a float metric {r['max_metric_diff']:.2e}, of a rank "
                                                  f"{fmt(r['max_rank_diff'], '.0f')})" if r["same_tokens"]
                                                else f" (first difference at {r['first_difference']})") +
                       f"; {r['takeovers']} takeovers.")]
    if result.get("syncs"):
        lines += ["", "Host-device synchronisations per token (batch 1, torch's sync debug mode): " +
                  ", ".join(f"{n} {fmt(v, '.2f')}" for n, v in result["syncs"].items()) + "."]
    if result.get("branch"):
        b = result["branch"]
        lines += ["", (f"Branch ({b['new_tokens']} new tokens) of a {b['parent_tokens']}-token scored parent "
                       f"(scored in {b['score_s'] * 1000:.0f} ms): cold at {b['far_pos']} "
                       f"{b['cold_far_s'] * 1000:.0f} ms; held (warm_caches {b['warm_s'] * 1000:.0f} ms): at "
                       f"{b['near_pos']} {b['near_s'] * 1000:.0f} ms, at {b['far_pos']} {b['far_s'] * 1000:.0f} ms, "
                       f"ratio **{b['ratio']:.2f}**.")]
    if result.get("errors"):
        lines += ["", "Errors: " + "; ".join(f"{k}: {v.splitlines()[-1]}" for k, v in result["errors"].items())]
    lines += ["", (f"Peak CUDA memory of the run: {fmt(env.get('max_memory_allocated_mib'), '.0f')} MiB. "
                   f"Total {result.get('total_s', float('nan')):.0f} s.")]
    return "\n".join(lines) + "\n"


SECTIONS = ("scoring", "exactness", "decoding", "lockstep", "syncs", "branch")


def run(out: Path, device: str = "cuda", tiny: bool = False, dtype: str | None = None,
        budget: float | None = None, sections: tuple[str, ...] = SECTIONS, **overrides: Any) -> dict:
    """Run the checks in `sections` (all by default) under the plan (FULL, or TINY with `tiny`) with `overrides`
    of its entries (e.g. batches=(32,), decode_repeats=3), writing OUT/gpu_check.json and OUT/gpu_check.md after
    each one; returns the result."""
    import transformers

    t0 = time.perf_counter()
    deadline = t0 + (budget if budget is not None else float("inf"))
    plan = TINY if tiny else FULL
    unknown = set(overrides) - set(plan)
    if unknown:
        raise ValueError(f"not entries of the plan: {', '.join(sorted(unknown))}")
    plan = {**plan, **overrides}
    dev = torch.device(device)
    dt = getattr(torch, dtype) if dtype else (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    base_shape = SHAPES[plan["base"]]
    reason_shape = TINY_REASON if tiny else SHAPES[plan["reason"]]
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/gpu_check.py", *sys.argv[1:]]) if __name__ == "__main__" else
        f"gpu_check.run(out, device={device!r}, tiny={tiny})",
        "env": {"device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
                "torch": torch.__version__, "transformers": transformers.__version__,
                "dtype": str(dt).removeprefix("torch."), "vocab": base_shape.vocab, "base": plan["base"],
                "reason": plan["reason"] or "tiny-reason", "plan": plan},
        "errors": {},
    }

    def save() -> None:
        if dev.type == "cuda":
            result["env"]["max_memory_allocated_mib"] = torch.cuda.max_memory_allocated(dev) / 2**20
        result["total_s"] = time.perf_counter() - t0
        (out / "gpu_check.json").write_text(json.dumps(result, indent=2, default=float), encoding="utf-8")
        (out / "gpu_check.md").write_text(markdown(result), encoding="utf-8")

    def section(name: str, fn: Callable[[], Any]) -> Any:
        """One section: its result stored under `name` (or its error, and the run goes on), then saved."""
        if name not in sections:
            return None
        print(f"[{time.perf_counter() - t0:6.1f} s] {name} ...", flush=True)
        try:
            result[name] = fn()
        except Exception:  # a benchmark: record what broke and measure the rest
            result["errors"][name] = traceback.format_exc()
            print(result["errors"][name], flush=True)
        save()
        return result.get(name)

    torch.manual_seed(0)
    t_build = time.perf_counter()
    pair = make_pair(base_shape, reason_shape, dev, dt)
    sync(dev)
    result["env"]["build_s"] = time.perf_counter() - t_build
    result["env"]["models_mib"] = sum(p.numel() * p.element_size() for m in (pair.base, pair.reason)
                                      for p in m.parameters()) / 2**20
    save()
    section("scoring", lambda: scoring(pair, plan["score_T"], plan["repeats"]))
    section("exactness", lambda: exactness(pair, min(64, plan["score_T"][0])))
    with tempfile.TemporaryDirectory() as workdir:
        if {"decoding", "lockstep", "syncs"} & set(sections):
            policies, result["gates"] = gates(pair, plan, Path(workdir))
            save()
        result["decoding"] = []
        section("decoding", lambda: decoding(pair, policies, plan, deadline,
                                             lambda row: (result["decoding"].append(row), save())) or result["decoding"])
        section("lockstep", lambda: lockstep(pair, policies["guided"], plan["lockstep_new"]))
        section("syncs", lambda: syncs(pair, policies, plan["sync_tokens"]))
    section("branch", lambda: branching(pair, plan))
    save()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for gpu_check.json and gpu_check.md")
    parser.add_argument("--device", default="cuda", help="torch device (cpu with --tiny checks the code path)")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes: seconds, for testing this script")
    parser.add_argument("--dtype", default=None, help="model dtype (default bfloat16 on CUDA, float32 elsewhere)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds after which no further decoding run starts (the other sections still run)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated sections to run, in "
                        f"their fixed order (default all: {','.join(SECTIONS)})")
    parser.add_argument("--decode-repeats", type=int, default=None,
                        help="runs of each decoder per batch, alternating (median reported; default: the plan's)")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes of the decoding section, in "
                        "the order run (default: the plan's)")
    args = parser.parse_args()
    sections = tuple(x for x in args.sections.split(",") if x)
    if set(sections) - set(SECTIONS):
        parser.error(f"--sections: unknown {', '.join(sorted(set(sections) - set(SECTIONS)))}")
    overrides: dict[str, Any] = {}
    if args.batches:
        overrides["batches"] = tuple(int(x) for x in args.batches.split(","))
    if args.decode_repeats:
        overrides["decode_repeats"] = args.decode_repeats
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("no CUDA device here; use --tiny --device cpu to check the script")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    result = run(args.out, args.device, args.tiny, args.dtype, args.budget, sections, **overrides)
    print(markdown(result))


if __name__ == "__main__":
    main()
