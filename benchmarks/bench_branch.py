"""Branch latency vs prefix length, whole call: `core.branch` at token 4,000 against token 40.

    .venv/bin/python benchmarks/bench_branch.py                      # tiny pair, parent of 4,100 tokens
    .venv/bin/python benchmarks/bench_branch.py --pair 8x            # the real problem's shape, scaled down
    .venv/bin/python benchmarks/bench_branch.py --new 16 --repeats 7

A tiny Qwen3 pair (byte-level BPE, 400 tokens, hidden 64, 2 layers) writes a greedy parent of
`--parent` tokens (held caches, as in the app). Then, interleaved, `core.branch(pair, parent, pos,
max_new_tokens=pos + new)` at pos = 40 and pos = 4,000: call to return, CPU seconds of this one-thread
process (steadier than wall time on a shared machine). Target (issue 13): ratio <= 1.3.

`--pair 8x` is bench_decoding's pair with the real problem's shape (a reasoner 8x the base's layers x
width: base 2 layers x hidden 256, reasoner 8 x 512, vocabulary 32,000, GQA as in Qwen3).

For scale it also times (1) the same `new` bare decoding steps of both models (backbone + head, one
token each, on the engine's own growing cache already holding prompt + pos tokens): attention reads
the whole KV cache every step in any decoder, and with the tiny pair (hidden 64, its weights a few
hundred KB) that read is most of a step; (2) what assembling used to cost: re-decoding every prefix
token's display string.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import core
from core.demo.tiny import build_tiny_pair
from core.pair.forward import backbone, head
from core.pair.tokens import display_tokens

PROMPT = "Tom has 3 boxes of 4 apples. He gives away 2. How many apples are left? Explain each step."


def tiny_pair(workdir: Path, hidden: int = 64, layers: int = 2) -> core.ModelPair:
    base, reason = build_tiny_pair(workdir, "qwen3", seed=0, hidden=hidden, layers=layers,
                                   heads=max(1, hidden // 16), kv_heads=max(1, hidden // 32))
    pair = core.load_pair(str(base), str(reason), device="cpu", dtype="float32")
    pair.eos_ids = frozenset()  # random weights: never stop early
    return pair


def branch_times(pair: core.ModelPair, parent: core.Trace, positions: list[int], new: int,
                 repeats: int) -> dict[int, list[float]]:
    """CPU seconds of each `core.branch` call, interleaved over positions (one warm-up call each)."""
    times: dict[int, list[float]] = {pos: [] for pos in positions}
    for rep in range(repeats + 1):
        for pos in positions:
            start = time.process_time()
            child = core.branch(pair, parent, pos, max_new_tokens=pos + new)
            spent = time.process_time() - start
            assert len(child) == pos + new and child.tokens[:pos] == parent.tokens[:pos]
            if rep:
                times[pos].append(spent)
    return times


def bare_steps(pair: core.ModelPair, parent: core.Trace, pos: int, new: int) -> float:
    """CPU seconds of `new` one-token steps of both models (backbone + head) after prompt + pos tokens."""
    from core.decoding.kvcache import growing_cache

    spent = 0.0
    for side in ("base", "reason"):
        model = pair.model(side)
        cache = growing_cache(model.config)
        ids = parent.prompt_ids[side] + parent.token_ids[:pos].tolist()
        backbone(model, torch.tensor([ids]), cache)  # the prefill is not timed (branches reuse held caches)
        start = time.process_time()
        for j in range(new):
            hidden, cache = backbone(model, torch.tensor([[int(parent.token_ids[pos + j])]]), cache)
            head(model, hidden[:, -1], pair.vocab_size)
        spent += time.process_time() - start
    return spent


def eight_x_pair(workdir: Path) -> core.ModelPair:
    """bench_decoding's 8x pair: base 2 layers x hidden 256, reasoner 8 x 512, vocabulary 32,000."""
    from bench_decoding import build_pair

    return build_pair(workdir, 32000, 256, 2, (512, 8))


def run(parent_len: int = 4100, positions: tuple[int, int] = (40, 4000), new: int = 16, repeats: int = 5,
        hidden: int = 64, layers: int = 2, shape: str = "tiny") -> dict:
    """The measurement: medians per position, their ratio, bare steps and the old assembling cost for scale."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        pair = tiny_pair(Path(tmp), hidden, layers) if shape == "tiny" else eight_x_pair(Path(tmp))
        t0 = time.perf_counter()
        parent = core.generate(pair, PROMPT, core.BaseOnly(), max_new_tokens=parent_len)
        gen_s = time.perf_counter() - t0
        times = branch_times(pair, parent, list(positions), new, repeats)
        bare = {pos: statistics.median(bare_steps(pair, parent, pos, new) for _ in range(repeats)) for pos in positions}
    medians = {pos: statistics.median(v) for pos, v in times.items()}
    far, near = max(positions), min(positions)
    ids = parent.token_ids[: far + new].tolist()
    start = time.process_time()
    display_tokens(pair.tokenizer, ids)
    redecode = time.process_time() - start
    return {"parent_tokens": len(parent), "generate_parent_s": gen_s, "new_tokens": new, "repeats": repeats,
            "median_cpu_s": medians, "ratio": medians[far] / medians[near], "redecode_prefix_s": redecode,
            "bare_steps_cpu_s": bare, "bare_ratio": bare[far] / bare[near],
            "runs": {pos: [round(t, 4) for t in v] for pos, v in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parent", type=int, default=4100, help="parent trace length (tokens)")
    parser.add_argument("--near", type=int, default=40, help="the short-prefix branch position")
    parser.add_argument("--far", type=int, default=4000, help="the long-prefix branch position")
    parser.add_argument("--new", type=int, default=16, help="new tokens each branch writes")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (median taken)")
    parser.add_argument("--hidden", type=int, default=64, help="model width (both models)")
    parser.add_argument("--layers", type=int, default=2, help="model depth (both models)")
    parser.add_argument("--pair", choices=("tiny", "8x"), default="tiny",
                        help="tiny: --hidden x --layers both; 8x: a reasoner 8x the base (the real shape)")
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    result = run(args.parent, (args.near, args.far), args.new, args.repeats, args.hidden, args.layers, args.pair)
    med = result["median_cpu_s"]
    print(f"parent: {result['parent_tokens']} tokens (generated in {result['generate_parent_s']:.1f} s wall)")
    print(f"core.branch, call to return, {args.new} new tokens, CPU s medians of {args.repeats}:")
    for pos, value in med.items():
        print(f"  pos {pos:5d}: {value * 1000:8.1f} ms   runs {result['runs'][pos]}")
    print(f"  ratio pos {args.far} / pos {args.near} (target <= 1.3): {result['ratio']:.3f}")
    bare = result["bare_steps_cpu_s"]
    print(f"  bare: {args.new} one-token steps of both models: pos {args.near} {bare[args.near] * 1000:.1f} ms, "
          f"pos {args.far} {bare[args.far] * 1000:.1f} ms, ratio {result['bare_ratio']:.3f}")
    print("  branch - bare steps (the engine's own overhead): "
          + ", ".join(f"pos {p} {(med[p] - bare[p]) * 1000:.1f} ms" for p in (args.near, args.far)))
    print(f"  for scale: re-decoding the display strings of {args.far + args.new} tokens (what assembling "
          f"did before): {result['redecode_prefix_s'] * 1000:.1f} ms")


if __name__ == "__main__":
    main()
