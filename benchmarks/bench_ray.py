"""Ray scale-out benchmark: the same generation jobs in-process, on 1 Ray worker and on 2, demo pair, CPU.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_ray.py                 # 16 problems, batches of 2
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_ray.py --problems 8 --max-new-tokens 16   # quick

Reports wall seconds for each (after a warm-up batch, so actor start-up and the pair load are reported
separately), the 2-vs-1 worker speed-up, and Ray's overhead per batch and per row: (wall on 1 worker -
the worker's busy seconds) / batches. Every worker uses one thread, as does the in-process run. Checks
that all three runs give token-identical traces.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def _run(executor, pair, problems, args):
    t0 = time.perf_counter()
    traces = executor.generate_many(pair, problems, None, batch_size=args.batch_size,
                                    max_new_tokens=args.max_new_tokens)
    return time.perf_counter() - t0, traces


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()

    import ray
    import torch

    import core
    from core.scale import InProcessExecutor, RayExecutor

    torch.set_num_threads(1)
    pair = core.demo_pair(device="cpu")
    problems = core.demo_problems(limit=args.problems)
    warm = problems[: args.batch_size]
    out: dict[str, object] = {"problems": len(problems), "batch_size": args.batch_size,
                              "batches": -(-len(problems) // args.batch_size), "max_new_tokens": args.max_new_tokens}
    local = InProcessExecutor()
    _run(local, pair, warm, args)
    out["in_process_s"], ref = _run(local, pair, problems, args)
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    out["ray_init_s"] = time.perf_counter() - t0
    for n in (1, 2):
        ex = RayExecutor(workers=n, progress_bar=False)
        t0 = time.perf_counter()
        ex.start(pair)
        out[f"start_{n}w_s"] = time.perf_counter() - t0
        _run(ex, pair, warm, args)
        ex.stats = [type(s)(s.worker, s.device) for s in ex.stats]  # count the timed run only
        wall, traces = _run(ex, pair, problems, args)
        out[f"ray_{n}w_s"] = wall
        out[f"busy_{n}w_s"] = float(ex.summary()["busy_s"].sum())
        out[f"identical_{n}w"] = all(np.array_equal(a.token_ids, b.token_ids) for a, b in zip(ref, traces))
        ex.close()
    ray.shutdown()
    rows, batches = len(problems), out["batches"]
    out["speedup_2w_vs_1w"] = out["ray_1w_s"] / out["ray_2w_s"]
    out["speedup_2w_vs_in_process"] = out["in_process_s"] / out["ray_2w_s"]
    out["overhead_per_batch_ms"] = 1000 * (out["ray_1w_s"] - out["busy_1w_s"]) / batches
    out["overhead_per_row_ms"] = 1000 * (out["ray_1w_s"] - out["busy_1w_s"]) / rows
    out["ray_1w_vs_in_process"] = out["ray_1w_s"] / out["in_process_s"]
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}, indent=1))


if __name__ == "__main__":
    main()
