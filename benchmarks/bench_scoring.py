"""Scoring overhead and memory: full teacher-forced scoring vs the two bare forward passes it needs.

    python benchmarks/bench_scoring.py                 # CPU: 8 layers, hidden 512, vocab 32k, T=2048, float32
    python benchmarks/bench_scoring.py --memory        # + peak RSS of chunked vs naive scoring (subprocesses)
    python benchmarks/bench_scoring.py --cuda          # GPU: Qwen3-0.6B- and 8B-shaped random weights, bf16

(a) "bare"  : `model(ids).logits` for both models (full (T, V) logits, what any forward costs).
(b) "score" : what core.score does after tokenizing: core.forward.backbone for both models, then
              core.scoring.teacher_forced.metrics_from_hidden (the head chunk by chunk + every metric + top-k, to numpy).
Timings are medians over interleaved repeats (a, b, a, b, ...). Models are random (from_config): speed
does not depend on the weights. No tokenizer is needed: the ModelPair is built by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.pair.forward import backbone, head  # noqa: E402
from core.pair.loading import ModelPair, ModelSpec, PromptFormat  # noqa: E402
from core.scoring.teacher_forced import DEFAULT_CHUNK, DEFAULT_K, metrics_from_hidden  # noqa: E402


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer shape (Llama/Qwen3 family)."""

    arch: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False


SHAPES = {
    # the CPU benchmark model: small enough for 2 cores, with a real vocabulary
    "cpu-mid": Shape("llama", 8, 512, 1376, 8, 8, 64, 32000),
    # Qwen3 shapes (config.json of Qwen/Qwen3-0.6B(-Base) and Qwen/Qwen3-8B)
    "qwen3-0.6b": Shape("qwen3", 28, 1024, 3072, 16, 8, 128, 151936, tied=True),
    "qwen3-8b": Shape("qwen3", 36, 4096, 12288, 32, 8, 128, 151936),
    # for checking this script's GPU code path on a CPU
    "tiny-qwen3": Shape("qwen3", 2, 64, 128, 4, 2, 16, 2000),
}


def build_model(shape: Shape, seed: int, device: torch.device, dtype: torch.dtype):
    """A randomly initialised causal LM of `shape`, created directly on `device` in `dtype`."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, max_position_embeddings=40960, tie_word_embeddings=shape.tied,
        bos_token_id=None, eos_token_id=0, pad_token_id=0,
    )
    config = Qwen3Config(**common) if shape.arch == "qwen3" else LlamaConfig(**common)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval().requires_grad_(False)


def make_pair(base_shape: Shape, reason_shape: Shape, device: torch.device, dtype: torch.dtype,
              related: bool = False) -> ModelPair:
    """Two random models in a hand-built ModelPair (no tokenizer: scoring code only needs vocab_size).

    related: the reasoner is the base with every weight perturbed by 20% noise, so the two mostly agree
    (the reasoner's top token is usually in the base's top-k), as real pairs do."""
    if base_shape.vocab != reason_shape.vocab:
        raise ValueError("both shapes need one vocabulary")
    fmt = PromptFormat("{problem}")
    base = build_model(base_shape, 0, device, dtype)
    if related and base_shape == reason_shape:
        import copy

        reason = copy.deepcopy(base)
        with torch.no_grad():
            for param in reason.parameters():
                param.add_(torch.randn_like(param) * 0.2 * param.float().std().to(param.dtype))
    else:
        reason = build_model(reason_shape, 1, device, dtype)
    return ModelPair(
        base=base, reason=reason,
        tokenizer=None, specs={"base": ModelSpec("random:base"), "reason": ModelSpec("random:reason")},
        formats={"base": fmt, "reason": fmt}, device=device, dtype=dtype, vocab_size=base_shape.vocab,
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def bare(pair: ModelPair, ids: torch.Tensor) -> None:
    """(a): both models' full forward, logits for every position."""
    for model in (pair.base, pair.reason):
        logits = model(ids).logits
        del logits


@torch.inference_mode()
def scored(pair: ModelPair, ids: torch.Tensor, chunk: int, k: int, targets: torch.Tensor | None = None) -> dict:
    """(b): the scoring path: both backbones, then chunked head + metrics, returned as numpy.

    targets: the emitted tokens (T,); default the next input token (random ids: ranks far down the
    vocabulary, the slowest case)."""
    hidden = {side: backbone(pair.model(side), ids)[0][0] for side in ("base", "reason")}
    if targets is None:
        targets = torch.cat([ids[0, 1:], ids[0, :1]])
    return metrics_from_hidden(pair, hidden, targets, k=k, chunk=chunk)


@torch.inference_mode()
def naive_scored(pair: ModelPair, ids: torch.Tensor, k: int) -> dict:
    """The memory-hungry way: full (T, V) float32 logits of both models at once, metrics in one block."""
    from core.scoring.metrics import chunk_metrics

    logits = [model(ids).logits[0, :, : pair.vocab_size].float() for model in (pair.base, pair.reason)]
    targets = torch.cat([ids[0, 1:], ids[0, :1]])
    out = chunk_metrics(logits[0], logits[1], targets, k=k)
    return {name: value.cpu().numpy() for name, value in out.items()}


def timed(fn, device: torch.device) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of fn(). On a shared machine with --threads 1, CPU
    seconds are the steadier measure (waiting for a core does not count)."""
    sync(device)
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    sync(device)
    return time.perf_counter() - start, time.process_time() - cpu


def time_pair(pair: ModelPair, length: int, repeats: int, chunk: int, k: int, base_targets: bool = False) -> dict:
    """Median seconds of (a) bare forwards, (b) full scoring, and (c) the two backbones alone.

    base_targets: score the base model's own greedy choices (rank 0 under the base, as in a base
    rollout) instead of the random next ids."""
    device = pair.device
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, pair.vocab_size, (1, length), generator=gen).to(device)
    targets = None
    if base_targets:
        with torch.inference_mode():
            targets = pair.base(ids).logits[0, :, : pair.vocab_size].argmax(-1)
    both_backbones = lambda: [backbone(pair.model(s), ids) for s in ("base", "reason")]  # noqa: E731
    with torch.inference_mode():
        hidden = {side: backbone(pair.model(side), ids)[0][0] for side in ("base", "reason")}
    full_targets = torch.cat([ids[0, 1:], ids[0, :1]]) if targets is None else targets
    # the part after the backbones, on fixed hidden states: what (a) does there (the head over all T) and
    # what (b) does (head chunk by chunk + every metric); the noisy backbones drop out of this comparison
    heads = lambda: [head(pair.model(s), hidden[s], pair.vocab_size) for s in ("base", "reason")]  # noqa: E731
    heads_metrics = lambda: metrics_from_hidden(pair, hidden, full_targets, k=k, chunk=chunk)  # noqa: E731
    bare(pair, ids)  # warm-up (allocator, kernels, lazy init)
    scored(pair, ids, chunk, k, targets)
    runs: dict[str, list[tuple[float, float]]] = {"bare": [], "score": [], "backbones": [], "heads": [],
                                                  "heads_metrics": []}
    for _ in range(repeats):
        runs["bare"].append(timed(lambda: bare(pair, ids), device))
        runs["score"].append(timed(lambda: scored(pair, ids, chunk, k, targets), device))
        runs["backbones"].append(timed(both_backbones, device))
        runs["heads"].append(timed(heads, device))
        runs["heads_metrics"].append(timed(heads_metrics, device))
    wall = {name: statistics.median(w for w, _ in values) for name, values in runs.items()}
    cpu = {name: statistics.median(c for _, c in values) for name, values in runs.items()}
    return {
        "T": length, "chunk": chunk, "k": k, "repeats": repeats, "wall": wall, "cpu": cpu,
        "ratio_wall": wall["score"] / wall["bare"], "ratio_cpu": cpu["score"] / cpu["bare"],
        # each repeat's (b) next to its own (a): steadier when the machine's load drifts
        "ratio_paired_cpu": statistics.median(s[1] / b[1] for s, b in zip(runs["score"], runs["bare"])),
        # (backbones + head and metrics in chunks) / (backbones + one head): each part timed on its own
        "ratio_parts_cpu": (cpu["backbones"] + cpu["heads_metrics"]) / (cpu["backbones"] + cpu["heads"]),
        "runs": {name: [(round(w, 3), round(c, 3)) for w, c in values] for name, values in runs.items()},
    }


# -- memory (each measurement in a fresh process) ----------------------------------------------------------


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure_memory(mode: str, shape_name: str, length: int, chunk: int, k: int) -> dict:
    """Peak RSS (MiB) of one scoring call above the resident models: reset the high-water mark first."""
    torch.set_grad_enabled(False)
    shape = SHAPES[shape_name]
    pair = make_pair(shape, shape, torch.device("cpu"), torch.float32)
    ids = torch.randint(0, shape.vocab, (1, length), generator=torch.Generator().manual_seed(0))
    with open("/proc/self/clear_refs", "w") as handle:  # Linux: "5" resets VmHWM to the current RSS
        handle.write("5")
    before = _rss_kib("VmRSS")
    if mode == "chunked":
        scored(pair, ids, chunk, k)
    else:
        naive_scored(pair, ids, k)
    peak = _rss_kib("VmHWM")
    return {"mode": mode, "peak_above_models_mib": (peak - before) / 1024, "models_mib": before / 1024}


def memory_table(shape_name: str, length: int, chunk: int, k: int) -> list[dict]:
    rows = []
    for mode in ("chunked", "naive"):
        cmd = [sys.executable, __file__, "--measure", mode, "--shape", shape_name, "--T", str(length),
               "--chunk", str(chunk), "--k", str(k)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def cuda_memory(pair: ModelPair, length: int, chunk: int, k: int) -> dict:
    """Peak CUDA memory (MiB) above the resident models, chunked vs naive."""
    ids = torch.randint(0, pair.vocab_size, (1, length), device=pair.device)
    out = {}
    for mode, fn in (("chunked", lambda: scored(pair, ids, chunk, k)), ("naive", lambda: naive_scored(pair, ids, k))):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(pair.device)
        before = torch.cuda.memory_allocated(pair.device)
        try:
            fn()
            out[mode] = (torch.cuda.max_memory_allocated(pair.device) - before) / 2**20
        except torch.OutOfMemoryError:
            out[mode] = float("nan")
    return out


# -- main ---------------------------------------------------------------------------------------------------


def report_timing(label: str, result: dict) -> None:
    wall, cpu = result["wall"], result["cpu"]
    print(f"{label}: T={result['T']} chunk={result['chunk']} k={result['k']} repeats={result['repeats']}")
    print("                                     wall s    cpu s   (medians)")
    print(f"  (a) bare forwards, full logits  : {wall['bare']:7.3f}  {cpu['bare']:7.3f}")
    print(f"  (b) full scoring, all metrics   : {wall['score']:7.3f}  {cpu['score']:7.3f}")
    print(f"      of which the two backbones  : {wall['backbones']:7.3f}  {cpu['backbones']:7.3f}")
    print(f"  ratio b/a (target <= 1.10)      : {result['ratio_wall']:7.3f}  {result['ratio_cpu']:7.3f}")
    print(f"  median of per-repeat b/a (cpu)  : {result['ratio_paired_cpu']:7.3f}")
    print(f"  after the backbones: one head {cpu['heads']:.3f} s, chunked head + metrics {cpu['heads_metrics']:.3f} s (cpu)")
    print(f"  b/a from the parts (cpu)        : {result['ratio_parts_cpu']:7.3f}   "
          "(backbones + chunked head and metrics) / (backbones + head)")
    for name, values in result["runs"].items():
        print(f"  runs {name:9s} (wall, cpu): {values}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="cpu-mid", choices=sorted(SHAPES), help="model shape (both models)")
    parser.add_argument("--T", type=int, default=2048, help="response length in tokens")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timing repeats (median taken)")
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help="positions per head+metrics chunk")
    parser.add_argument("--k", type=int, default=DEFAULT_K, help="top-k width")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--memory", action="store_true", help="also measure peak RSS, chunked vs naive")
    parser.add_argument("--related", action="store_true",
                        help="reasoner = base with 20%% weight noise (the pair mostly agrees), not independent")
    parser.add_argument("--base-targets", action="store_true",
                        help="score the base's greedy tokens (as in a base rollout), not random ids")
    parser.add_argument("--cuda", action="store_true",
                        help="GPU mode: Qwen3-0.6B-shaped base + 8B-shaped reasoner (and 0.6B+0.6B), bf16")
    parser.add_argument("--cuda-shapes", default="qwen3-0.6b,qwen3-8b",
                        help="base,reason shapes for --cuda (tiny-qwen3,tiny-qwen3 checks the code path)")
    parser.add_argument("--device", default="cuda", help="device for --cuda mode")
    parser.add_argument("--measure", choices=["chunked", "naive"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.measure:
        print(json.dumps(measure_memory(args.measure, args.shape, args.T, args.chunk, args.k)))
        return

    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {os.cpu_count()} CPUs")
    if args.cuda:
        device = torch.device(args.device)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        if device.type == "cuda":
            print(f"device: {torch.cuda.get_device_name(device)}")
        base_name, reason_name = args.cuda_shapes.split(",")
        for names in ((base_name, base_name), (base_name, reason_name)):
            pair = make_pair(SHAPES[names[0]], SHAPES[names[1]], device, dtype, related=args.related)
            for length in (args.T, 4 * args.T):
                result = time_pair(pair, length, args.repeats, args.chunk, args.k, args.base_targets)
                report_timing(f"{names[0]} base + {names[1]} reasoner, {dtype}, {device}", result)
                if device.type == "cuda":
                    mem = cuda_memory(pair, length, args.chunk, args.k)
                    print(f"  peak CUDA memory above models: chunked {mem['chunked']:.0f} MiB, naive {mem['naive']:.0f} MiB")
            del pair
            if device.type == "cuda":
                torch.cuda.empty_cache()
        return

    shape = SHAPES[args.shape]
    print(f"shape {args.shape}: {shape}")
    pair = make_pair(shape, shape, torch.device("cpu"), torch.float32, related=args.related)
    label = f"{args.shape} pair{' (related)' if args.related else ''}, float32, cpu"
    if args.base_targets:
        label += ", base-greedy targets"
    report_timing(label, time_pair(pair, args.T, args.repeats, args.chunk, args.k, args.base_targets))
    if args.memory:
        del pair
        for row in memory_table(args.shape, args.T, args.chunk, args.k):
            print(f"  peak RSS above resident models, {row['mode']:8s}: {row['peak_above_models_mib']:.0f} MiB "
                  f"(models {row['models_mib']:.0f} MiB)")


if __name__ == "__main__":
    main()
