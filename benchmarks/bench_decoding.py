"""Decoding-engine benchmark: time ratios on random model pairs on CPU, one run.

    .venv/bin/python benchmarks/bench_decoding.py            # all sections, T = 1024, 1 thread
    .venv/bin/python benchmarks/bench_decoding.py --sections 5678 --ahead-tokens 256   # verify-ahead only
    .venv/bin/python benchmarks/bench_decoding.py --tokens 256 --layers 4   # quick look

Prints (targets from the issues):
  1. lock-step cached decoding (policy, both models' metrics) vs a bare step of each model   ≤ 1.15
  2. naive full-prefix recompute vs cached decoding, per token at T                           ≥ 10
  3. time to a branch's first new token at pos 900 vs pos 50 (held caches)                   ≤ 1.3
  4. EntropyGated vs Guided wall time at a similar takeover rate                              (reported)
  5. verify-ahead vs lock-step (lookahead=1) at equal output, mid-size pair                   ≥ 1.8
  6. the same on a pair whose reasoner is 8x the base's layers x width                        ≥ 1.8
  7. tokens/s at batch 1 and 16 (8x pair, Guided), lock-step and verify-ahead                 (reported)
  8. a 16,384-token response from a tiny pair: CPU per token early vs late (no O(T²) work), KV-cache
     and per-token-record bytes per token, peak RSS

The mid-size pair is built once into --workdir: a byte-level BPE with a 32k vocabulary (trained on random
words) and two random Qwen3 models (8 layers, hidden 512); the 8x pair has a 2-layer, hidden-256 base.
Other jobs on the machine make wall time noisy, so times are CPU seconds of this (one-thread) process
(beside wall seconds); in [1] the bare baseline runs interleaved with the engine, one step each, inside
the engine's progress callback. Results: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import core
from core.annotate.spikes import calibrate_gate
from core.decoding import CACHES
from core.demo.tiny import CORPUS, build_tiny_model, build_tiny_tokenizer
from core.pair.forward import backbone, head
from core.scoring.metrics import chunk_metrics

PROMPT = "Tom has 3 boxes of 4 apples. He gives away 2. How many apples are left? Explain each step."


def random_words(lines: int, seed: int = 0) -> list[str]:
    """A corpus with enough distinct character pairs for a BPE to reach a 32k vocabulary."""
    rng = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    weights = [12, 9, 8, 8, 7, 7, 6, 6, 6, 4, 4, 3, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1]
    word = lambda: "".join(rng.choices(letters, weights, k=rng.randint(2, 9)))
    return CORPUS + [" ".join(word() for _ in range(30)) + f" {rng.randint(0, 99999)}." for _ in range(lines)]


def build_pair(workdir: Path, vocab: int, hidden: int, layers: int,
               reason_shape: tuple[int, int] | None = None) -> core.ModelPair:
    """A random Qwen3 pair (base hidden x layers; the reasoner the same or `reason_shape` (hidden, layers))."""
    rh, rl = reason_shape or (hidden, layers)
    out = workdir / (f"qwen3-v{vocab}-h{hidden}-l{layers}" + (f"-r{rh}x{rl}" if reason_shape else ""))
    if not (out / "reason" / "config.json").exists():
        t0 = time.perf_counter()
        tokenizer = build_tiny_tokenizer(random_words(6000), vocab_size=vocab)
        for i, (side, (h, n)) in enumerate((("base", (hidden, layers)), ("reason", (rh, rl)))):
            heads = max(1, h // 64)
            build_tiny_model(out / side, tokenizer, "qwen3", seed=i, hidden=h, layers=n, heads=heads,
                             kv_heads=max(1, heads // 2))
        print(f"built the pair in {time.perf_counter() - t0:.1f}s -> {out}")
    pair = core.load_pair(str(out / "base"), str(out / "reason"), device="cpu", dtype="float32")
    pair.eos_ids = frozenset()  # random weights: never stop early, so every run reaches T tokens
    return pair


def clock() -> float:
    """CPU seconds of this process. With one torch thread this is the work done, and it is far less
    disturbed than wall time by other jobs sharing the cores (their memory traffic still adds noise)."""
    return time.process_time()


class Stamps:
    """A `progress` callback that records when each new token was finished."""

    def __init__(self) -> None:
        self.start = clock()
        self.times: list[float] = []

    def __call__(self, t: int, limit: int) -> None:
        self.times.append(clock())


class BareStepper:
    """One base step + one reasoner step per token with the same DynamicCache mechanics and nothing else
    (no mask bookkeeping, metrics, policy or sampling; the base's argmax is taken)."""

    def __init__(self, pair: core.ModelPair) -> None:
        from transformers import DynamicCache

        self.pair = pair
        self.caches = {s: DynamicCache(config=pair.model(s).config) for s in ("base", "reason")}
        prompts = pair.prompt_ids(PROMPT)
        for s in self.caches:
            backbone(pair.model(s), torch.tensor([prompts[s]]), cache=self.caches[s])

    @torch.inference_mode()
    def step(self, token: int) -> int:
        x = torch.tensor([[token]])
        hidden, _ = backbone(self.pair.base, x, cache=self.caches["base"])
        nxt = int(head(self.pair.base, hidden[:, -1], self.pair.vocab_size).argmax())
        hidden, _ = backbone(self.pair.reason, x, cache=self.caches["reason"])
        head(self.pair.reason, hidden[:, -1], self.pair.vocab_size)
        return nxt


class Interleaved:
    """A `progress` callback that runs one bare step after each engine step, so both are timed side by side
    at the same sequence length and under the same machine load. Engine step time excludes the bare step."""

    def __init__(self, pair: core.ModelPair) -> None:
        self.bare = BareStepper(pair)
        self.token = 0
        self.engine: list[float] = []  # engine seconds for the step that finished token t (t >= 1)
        self.bare_s: list[float] = []
        self.left = clock()

    def __call__(self, t: int, limit: int) -> None:
        enter = clock()
        if t > 1:  # step 0 follows the prefill, which has no bare counterpart
            self.engine.append(enter - self.left)
            self.token = self.bare.step(self.token)
            self.bare_s.append(clock() - enter)
        else:
            self.bare.step(self.token)  # keep the bare caches at the engine's length
        self.left = clock()


def naive_step(pair: core.ModelPair, ids: list[int]) -> float:
    """CPU seconds for one token without caches: both models re-read their prompt + the whole prefix."""
    prompts = pair.prompt_ids(PROMPT)
    t0 = clock()
    logits = {}
    for s in ("base", "reason"):
        hidden, _ = backbone(pair.model(s), torch.tensor([prompts[s] + ids]))
        logits[s] = head(pair.model(s), hidden[:, -1], pair.vocab_size)
    chunk_metrics(logits["base"], logits["reason"], None)
    int(logits["base"].argmax())
    return clock() - t0


def branch_ttft(pair: core.ModelPair, trace: core.Trace, pos: int) -> float:
    """CPU seconds from calling `branch` to its first new token (the trace's caches are held)."""
    assert CACHES.get(trace.key) is not None, "the parent's caches should be held"
    stamps = Stamps()
    core.branch(pair, trace, pos, max_new_tokens=pos + 1, lookahead=1, progress=stamps)
    return stamps.times[0] - stamps.start


def timed_generate(pair: core.ModelPair, policy: core.policies.Policy, n: int) -> tuple[float, float, core.Trace]:
    """(CPU seconds, wall seconds, trace) of one whole `generate` call."""
    c0, w0 = clock(), time.perf_counter()
    trace = core.generate(pair, PROMPT, policy, max_new_tokens=n)
    return clock() - c0, time.perf_counter() - w0, trace


def lock_step_sections(pair: core.ModelPair, T: int) -> core.Trace:
    """Sections [1]-[4] (lock-step engine overhead, naive recompute, branch latency, lazy vs Guided);
    returns the T-token BaseOnly trace."""
    # 1. lock-step cached decoding vs a bare step of each model, interleaved step by step over T tokens
    w0 = time.perf_counter()
    side = Interleaved(pair)
    trace = core.generate(pair, PROMPT, core.BaseOnly(), max_new_tokens=T, progress=side, lookahead=1)
    wall = time.perf_counter() - w0
    e, b = sum(side.engine) / len(side.engine), sum(side.bare_s) / len(side.bare_s)
    blocks = [sum(side.engine[i:i + 64]) / sum(side.bare_s[i:i + 64]) for i in range(0, len(side.engine) - 63, 64)]
    print(f"[1] lock-step cached step {e * 1e3:.2f} ms vs bare base+reason step {b * 1e3:.2f} ms (CPU time, "
          f"steps 1..{T - 1}): ratio {e / b:.3f} (target <= 1.15); per 64-step block min/median/max "
          f"{min(blocks):.3f}/{statistics.median(blocks):.3f}/{max(blocks):.3f}; run wall {wall:.0f}s")

    # 2. naive full-prefix recompute at T vs the cached step at T
    ids = trace.token_ids.tolist()
    late = sum(side.engine[-64:]) / 64
    naive = statistics.median(naive_step(pair, ids[: T - 1]) for _ in range(3))
    print(f"[2] naive recompute at T={T}: {naive * 1e3:.0f} ms/token vs cached {late * 1e3:.2f} ms/token "
          f"(last 64 steps): {naive / late:.1f}x faster (target >= 10)")

    # 3. time to a branch's first new token, early vs late in the same trace
    early_pos, late_pos = min(50, T // 20), min(900, T - 2)
    early, late_t = [], []
    for _ in range(10):
        early.append(branch_ttft(pair, trace, early_pos))
        late_t.append(branch_ttft(pair, trace, late_pos))
    te, tl = statistics.median(early[1:]), statistics.median(late_t[1:])
    print(f"[3] branch first token (CPU time, median of 9): pos {early_pos} {te * 1e3:.1f} ms, pos {late_pos} "
          f"{tl * 1e3:.1f} ms: ratio {tl / te:.3f} (target <= 1.3)")

    # 4. EntropyGated vs Guided at a similar takeover rate (gate and threshold fitted on the base run)
    n = max(64, T // 2)
    # The random pair soon repeats itself, so a calibrated lam (> 1) almost never fires; lam = 1 (score above
    # its running mean) with tau at the 95% quantile gives a few per cent of takeovers, as in the paper.
    gate = calibrate_gate([trace.metrics["cross_entropy"]], ratio=0.05, window=16)
    guided = core.Guided(tau=gate.tau, lam=1.0, window=16, budget=0.05)
    g_cpu, g_wall, g = timed_generate(pair, guided, n)
    rate_g = float((g.source == "reason").mean())
    # fire on the high-entropy positions, with the budget capping the rate at Guided's realised rate
    rate_cap = max(rate_g, 1 / n)
    threshold = float(torch.quantile(torch.tensor(trace.metrics["entropy_base"]), max(0.0, 1 - 2 * rate_cap)))
    eg_cpu, eg_wall, eg = timed_generate(pair, core.EntropyGated(threshold=threshold, budget=rate_cap), n)
    rate_e = float((eg.source == "reason").mean())
    print(f"[4] {n} tokens: Guided {g_cpu:.1f}s CPU / {g_wall:.1f}s wall (rate {rate_g:.3f}) vs EntropyGated "
          f"{eg_cpu:.1f}s CPU / {eg_wall:.1f}s wall (rate {rate_e:.3f}, threshold {threshold:.2f} nats): "
          f"ratio {eg_cpu / g_cpu:.3f} CPU, {eg_wall / g_wall:.3f} wall")

    return trace


def timed(pair: core.ModelPair, prompts, policy: core.Policy, n: int, lookahead: int | None):
    """(CPU s, wall s, traces) of one `generate` call."""
    c0, w0 = clock(), time.perf_counter()
    out = core.generate(pair, prompts, policy, max_new_tokens=n, lookahead=lookahead)
    return clock() - c0, time.perf_counter() - w0, out if isinstance(out, list) else [out]


def fitted_guided(trace: core.Trace) -> core.Guided:
    """Guided with tau at the 98 % quantile of a base run's scores and lam = 1: a few per cent of takeovers
    on these random pairs (see [4]; the rate is printed)."""
    gate = calibrate_gate([trace.metrics["cross_entropy"]], ratio=0.02, window=16)
    return core.Guided(tau=gate.tau, lam=1.0, window=16)


def verify_ahead(label: str, pair: core.ModelPair, prompts, policies: dict, n: int, repeats: int = 1) -> list[float]:
    """Verify-ahead vs lock-step at equal output: prints one line per policy (medians of `repeats`
    interleaved runs of each), returns the CPU ratios."""
    ratios = []
    for name, policy in policies.items():
        runs = [(timed(pair, prompts, policy, n, 1), timed(pair, prompts, policy, n, None)) for _ in range(repeats)]
        lc, lw = (statistics.median(r[0][i] for r in runs) for i in (0, 1))
        ac, aw = (statistics.median(r[1][i] for r in runs) for i in (0, 1))
        lock, ahead = runs[0][0][2], runs[0][1][2]
        same = all(np.array_equal(a.token_ids, b.token_ids) and list(a.source) == list(b.source)
                   for a, b in zip(ahead, lock))
        tokens = sum(len(t) for t in lock)
        rho = sum(int((t.source != "base").sum()) for t in lock) / tokens
        ratios.append(lc / ac)
        print(f"{label} {name} (rho {rho:.3f}), {len(lock)} x {n} tokens: lock-step {lc:.1f}s CPU / {lw:.1f}s wall "
              f"({tokens / lw:.1f} tok/s), verify-ahead {ac:.1f}s CPU / {aw:.1f}s wall ({tokens / aw:.1f} tok/s): "
              f"speed-up {lc / ac:.2f}x CPU, {lw / aw:.2f}x wall; identical output: {same}"
              + (f" (medians of {repeats}; CPU ratios per run " + ", ".join(f"{r[0][0] / r[1][0]:.2f}" for r in runs) + ")"
                 if repeats > 1 else ""))
    return ratios


def long_chain(workdir: Path, T: int) -> None:
    """[8] one T-token response from a tiny pair on CPU: time per token early vs late, bytes per token, peak RSS."""
    out = workdir / "tiny-long"
    if not (out / "reason" / "config.json").exists():
        tokenizer = build_tiny_tokenizer()
        for i, side in enumerate(("base", "reason")):
            build_tiny_model(out / side, tokenizer, "qwen3", seed=i, max_positions=T + 512)
    pair = core.load_pair(str(out / "base"), str(out / "reason"), device="cpu", dtype="float32")
    pair.eos_ids = frozenset()
    rss0, now0 = peak_rss_mib(), rss_mib()
    stamps = Stamps()
    w0 = time.perf_counter()
    trace = core.generate(pair, PROMPT, core.BaseOnly(), max_new_tokens=T, temperature=0.6, top_p=0.95,
                          progress=stamps)
    wall = time.perf_counter() - w0
    held = CACHES.get(trace.key)
    kv = sum(cfg_kv_bytes(pair.model(s).config) for s in ("base", "reason"))
    record = sum(v.nbytes for v in trace.metrics.values()) + sum(a.nbytes for s in trace.topk.values() for a in s)
    q = T // 4
    first, last = stamps.times[q] - stamps.times[0], stamps.times[-1] - stamps.times[-q - 1]
    print(f"[8] {len(trace)} tokens (tiny pair, hidden 64, 2 layers, vocab {pair.vocab_size}) in {wall:.0f}s wall: "
          f"CPU per token first/last quarter {first / q * 1e3:.2f}/{last / q * 1e3:.2f} ms; KV cache "
          f"{kv} B/token (both models; held {held.nbytes() / len(trace):.0f} B/token incl. hidden states), "
          f"per-token record {record / len(trace):.0f} B/token; RSS {now0:.0f} -> {rss_mib():.0f} MiB "
          f"(+{(rss_mib() - now0) * 2**20 / len(trace):.0f} B/token), peak RSS {rss0:.0f} -> {peak_rss_mib():.0f} MiB")


def cfg_kv_bytes(cfg) -> int:
    """K and V bytes per token of one model (float32)."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib() -> float:
    """Current resident set (MiB), from /proc (0 where there is none)."""
    try:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0.0
    return int(line.split()[1]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1024, help="T: response length of the long run")
    ap.add_argument("--ahead-tokens", type=int, default=256, help="response length of the verify-ahead runs")
    ap.add_argument("--long-tokens", type=int, default=16384, help="response length of the long chain [8]")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--sections", default="12345678", help="which sections to run, e.g. 567")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved runs per verify-ahead case (medians)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier when other jobs share the CPU)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/forkpoint-bench"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    T, n = args.tokens, args.ahead_tokens
    pair = build_pair(args.workdir, args.vocab, args.hidden, args.layers)
    print(f"pair: Qwen3 {args.layers} layers, hidden {args.hidden}, vocab {pair.vocab_size}; "
          f"T={T}; torch threads={args.threads}; prompt {len(pair.prompt_ids(PROMPT)['base'])} tokens")
    core.generate(pair, PROMPT, max_new_tokens=16)  # warm-up
    if set("1234") & set(args.sections):
        trace = lock_step_sections(pair, T)
    else:
        trace = core.generate(pair, PROMPT, core.BaseOnly(), max_new_tokens=n)
    if "5" in args.sections:
        verify_ahead("[5] mid-size pair", pair, PROMPT, {"BaseOnly": core.BaseOnly(), "Guided": fitted_guided(trace)}, n,
                     args.repeats)
    if set("67") & set(args.sections):
        big = build_pair(args.workdir, args.vocab, args.hidden // 2, args.layers // 4, (args.hidden, args.layers))
        print(f"8x pair: base {args.layers // 4} layers x hidden {args.hidden // 2}, reasoner {args.layers} x "
              f"{args.hidden} (8x layers x width)")
        guided = fitted_guided(core.generate(big, PROMPT, core.BaseOnly(), max_new_tokens=n))
        if "6" in args.sections:
            verify_ahead("[6] 8x pair", big, PROMPT, {"BaseOnly": core.BaseOnly(), "Guided": guided}, n, args.repeats)
        if "7" in args.sections:
            prompts = [f"{PROMPT} Case {i}." for i in range(16)]
            verify_ahead("[7] 8x pair, batch 1", big, prompts[:1], {"Guided": guided}, n // 2)
            verify_ahead("[7] 8x pair, batch 16", big, prompts, {"Guided": guided}, n // 2)
    if "8" in args.sections:
        long_chain(args.workdir, args.long_tokens)


if __name__ == "__main__":
    main()
