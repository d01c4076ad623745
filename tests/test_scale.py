"""core.scale in one process: executors give the traces one process gives, skip what is stored, lose and double
nothing; the driver loop, the pair spec, Ray's sizing and errors (no cluster), and a killed driver.

The Ray tests are in test_scale_ray.py (their own file, so `--dist loadfile` can run them beside these).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

import core
from core.errors import ExecutorError, GenerationCancelled, InvalidInputError
from core.scale import InProcessExecutor, PairSpec, drive, make_jobs
from tests.scaling import OPTS, demo, problems, reference, same  # noqa: F401 - demo, problems: fixtures

ROOT = Path(__file__).resolve().parents[1]


# -- jobs and the driver loop (no Ray) ---------------------------------------------------------------


def test_make_jobs_cuts_batches_in_order(problems):
    jobs = make_jobs(problems, core.BaseOnly(), batch_size=4, samples=3, max_new_tokens=5)
    assert [len(j.problems) for j in jobs] == [4, 2]
    assert [p for j in jobs for p in j.problems] == list(problems)
    assert [j.units for j in jobs] == [12, 6] and jobs[0].kwargs()["max_new_tokens"] == 5
    with pytest.raises(InvalidInputError, match="batch_size"):
        make_jobs(problems, batch_size=0)


def test_in_process_matches_engine_and_resumes(demo, problems, tmp_path):
    policy = core.RandomPositions(rate=0.3, seed=1)
    ref = reference(demo, problems, policy, 4, **OPTS)
    store = core.TraceStore(tmp_path / "s")
    ex = InProcessExecutor()
    seen = []
    out = ex.generate_many(demo, problems, policy, batch_size=4, store=store, on_trace=seen.append, **OPTS)
    assert len(out) == len(ref) == 12 and all(same(a, b) for a, b in zip(out, ref))
    assert sorted(store.keys()) == sorted(t.key for t in ref) and len(seen) == 12
    assert ex.summary()["units"].sum() == 12
    # a re-run makes nothing, reads everything, and still passes each trace through on_trace
    again = ex.generate_many(demo, problems, policy, batch_size=4, store=store,
                             on_trace=lambda t: t.meta.setdefault("mark", 1), **OPTS)
    assert ex.summary()["units"].sum() == 0 and all(same(a, b) for a, b in zip(again, ref))
    assert store.get(ref[0].key).meta.get("mark") == 1  # changed by on_trace -> rewritten


class _FakeBackend:
    """Records what the driver sends; 'makes' traces from a dict of prepared ones."""

    def __init__(self, made):
        self.made, self.sent = made, []

    def keys(self, jobs):
        return [[t.key for t in self.made[id(j)]] for j in jobs]

    def run(self, pending, ids):
        for i, (job, skip) in zip(ids, pending):
            self.sent.append((i, sorted(skip)))
            yield i, [None if t.key in skip else t for t in self.made[id(job)]], {}


def test_drive_sends_only_missing_rows_and_stops_between_batches(demo, problems, tmp_path):
    jobs = make_jobs(problems, core.BaseOnly(), batch_size=2, max_new_tokens=6)
    traces = [core.generate(demo, list(j.problems), core.BaseOnly(), max_new_tokens=6) for j in jobs]
    store = core.TraceStore(tmp_path / "s")
    store.put(traces[0][0])
    store.put(traces[0][1])  # job 0 fully stored
    store.put(traces[1][1])  # job 1 half stored
    backend = _FakeBackend({id(j): t for j, t in zip(jobs, traces)})
    ticks = []
    out = drive(backend, jobs, store, progress=lambda d, n: ticks.append((d, n)))
    assert backend.sent == [(1, [traces[1][1].key]), (2, [])]
    assert [[t.key for t in ts] for ts in out] == [[t.key for t in ts] for ts in traces]
    assert ticks[-1] == (6, 6) and len(store.keys()) == 6
    # cancelled after the second batch came back: both finished batches are stored, the third never made
    store2 = core.TraceStore(tmp_path / "s2")
    asked = []
    with pytest.raises(GenerationCancelled):
        drive(_FakeBackend({id(j): t for j, t in zip(jobs, traces)}), jobs, store2,
              should_stop=lambda: asked.append(1) or len(asked) == 2)
    assert sorted(store2.keys()) == sorted(t.key for t in traces[0] + traces[1])


def test_drive_asks_keys_one_window_at_a_time(demo, problems, tmp_path, monkeypatch):
    """Keys are computed per window of jobs as the run reaches it (not for every job up front); the rows and
    what is sent are the same as with one window."""
    from core.scale import executors

    jobs = make_jobs(problems, core.BaseOnly(), batch_size=1, max_new_tokens=6)
    traces = [core.generate(demo, list(j.problems), core.BaseOnly(), max_new_tokens=6) for j in jobs]
    store = core.TraceStore(tmp_path / "s")
    store.put(traces[2][0])  # job 2 stored: read, not sent

    class Windowed(_FakeBackend):
        parallel = 1

        def __init__(self, made):
            super().__init__(made)
            self.asked, self.log = [], []

        def keys(self, jobs_):
            self.asked.append(len(jobs_))
            self.log.append(("keys", len(self.sent)))
            return super().keys(jobs_)

    monkeypatch.setattr(executors, "KEYS_WINDOW", 2)
    monkeypatch.setattr(executors, "KEYS_PER_WORKER", 1)
    backend = Windowed({id(j): t for j, t in zip(jobs, traces)})
    out = drive(backend, jobs, store)
    assert len(jobs) == 6 and backend.asked == [2, 2, 2]
    assert backend.log == [("keys", 0), ("keys", 2), ("keys", 3)]  # the next window's keys after this one ran
    assert [i for i, _ in backend.sent] == [0, 1, 3, 4, 5]
    assert [[t.key for t in ts] for ts in out] == [[t.key for t in ts] for ts in traces]
    monkeypatch.setattr(executors, "KEYS_PER_WORKER", 4)  # a pool of 2 workers: windows of 8 jobs
    backend = Windowed({id(j): t for j, t in zip(jobs, traces)})
    backend.parallel = 2
    drive(backend, jobs, core.TraceStore(tmp_path / "s2"))
    assert backend.asked == [6]


class _ReadCountingStore(core.TraceStore):
    """A TraceStore that counts the trace files read in full (get)."""

    reads = 0

    def get(self, key):
        self.reads += 1
        return super().get(key)


def test_drive_keeps_summaries_and_resumes_from_the_index(demo, problems, tmp_path):
    """keep="summaries": one small record per row, no traces; a resume reads the store's index, not the
    trace files, except rows `recheck` names (stored ungraded: read, graded, rewritten)."""
    from core.evaluation.grading import grade_trace
    from core.trace import RowSummary

    ex = InProcessExecutor()
    store = _ReadCountingStore(tmp_path / "s")
    opts = {"batch_size": 2, "max_new_tokens": 6, "samples": 2}
    made = ex.generate_many(demo, problems[:4], core.BaseOnly(), store=store, keep="summaries", **opts)
    assert all(isinstance(r, RowSummary) for r in made) and len(made) == 8
    traces = {k: store.get(k) for k in store.keys()}
    assert [r.key for r in made] == [t.key for t in ex.generate_many(demo, problems[:4], core.BaseOnly(), **opts)]
    for r in made:
        t = traces[r.key]
        assert (r.length, r.takeovers, r.problem, r.policy, r.correct) == (len(t), t.n_takeovers,
                                                                           t.meta["problem"]["id"], "base_only", None)
    fresh = _ReadCountingStore(tmp_path / "s")  # a new driver: nothing held in memory
    again = ex.generate_many(demo, problems[:4], core.BaseOnly(), store=fresh, keep="summaries", **opts)
    assert again == made and fresh.reads == 0 and ex.summary()["units"].sum() == 0
    graded = ex.generate_many(demo, problems[:4], core.BaseOnly(), store=fresh, keep="summaries",
                              on_trace=grade_trace, recheck=lambda row: row["correct"] is None, **opts)
    assert fresh.reads == 8 and all(r.correct is not None for r in graded)
    assert all(fresh.get(r.key).meta["correct"] == r.correct for r in graded)
    fresh.reads = 0
    ex.generate_many(demo, problems[:4], core.BaseOnly(), store=fresh, keep="summaries", on_trace=grade_trace,
                     recheck=lambda row: row["correct"] is None, **opts)
    assert fresh.reads == 0  # graded rows are now summarised from the index alone
    with pytest.raises(InvalidInputError, match="keep"):
        ex.generate_many(demo, problems[:1], keep="everything")


def test_in_process_path_resumes_from_the_index(demo, problems, tmp_path):
    """Without an executor too, keep="summaries" resumes from the store's index with the driver's rule
    (`RowSummary.resumed`): zero full-trace reads for stored rows, the summaries the executor gives; in a
    batch with stored and new rows only the new ones are made. The harness's resume reads nothing either."""
    from core.decoding import generate_many
    from core.evaluation import harness as ev

    opts = {"batch_size": 2, "max_new_tokens": 6}
    store = _ReadCountingStore(tmp_path / "s")
    first = generate_many(demo, problems[:4], core.BaseOnly(), store=store, keep="summaries", samples=2, **opts)
    fresh = _ReadCountingStore(tmp_path / "s")
    again = generate_many(demo, problems[:4], core.BaseOnly(), store=fresh, keep="summaries", samples=2, **opts)
    assert again == first and fresh.reads == 0
    driver = InProcessExecutor().generate_many(demo, problems[:4], core.BaseOnly(), store=fresh, keep="summaries",
                                               samples=2, **opts)
    assert driver == first and fresh.reads == 0
    more = generate_many(demo, problems[:4], core.BaseOnly(), store=fresh, keep="summaries", samples=3, **opts)
    assert fresh.reads == 0 and len(fresh.keys()) == 12  # sample 2 of each problem made, 0 and 1 from the index
    assert [r for j, r in enumerate(more) if j % 3 < 2] == first
    made = {t.key: t for t in [fresh.get(r.key) for r in more]}
    assert all((r.length, r.takeovers) == (len(made[r.key]), made[r.key].n_takeovers) for r in more)
    fresh.reads = 0
    common = {"samples": 2, "store": fresh, "max_new_tokens": 6, "batch_size": 2}
    graded = ev.run_records(demo, problems[:4], {"base": core.BaseOnly()}, **common)
    assert fresh.reads == 8  # stored ungraded: read once, graded, rewritten
    fresh.reads = 0
    resumed = ev.run_records(demo, problems[:4], {"base": core.BaseOnly()}, **common)
    assert fresh.reads == 0
    pd.testing.assert_frame_equal(resumed, graded)


def test_pair_spec_round_trip(demo):
    spec = PairSpec.from_pair(demo)
    assert spec == PairSpec.demo()
    assert spec.load("cpu").fingerprint() == demo.fingerprint()
    # a pair loaded with remote code allowed is loaded the same way on the workers
    trusted = PairSpec(spec.base, spec.reason, spec.base_format, spec.reason_format, dtype="float32",
                       trust_remote_code=True).load("cpu")
    assert trusted.trust_remote_code and PairSpec.from_pair(trusted).trust_remote_code
    with pytest.raises(InvalidInputError, match="ModelPair or a PairSpec"):
        core.scale.as_spec("not a pair")


def test_missing_ray_is_a_clear_error(monkeypatch):
    from core.scale import ray_executor

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ExecutorError, match=r"pip install 'forkpoint\[ray\]'"):
        ray_executor.import_ray()
    with pytest.raises(InvalidInputError, match="workers"):
        ray_executor.RayExecutor(workers=0)


def test_ray_worker_count_and_devices(monkeypatch):
    """Workers from the *free* resources: one per GPU (or per gpus_per_worker GPUs) on a GPU cluster, else
    one per CPU; `workers` wins; what does not fit is named ("3 workers of 1 GPU asked, 2 GPUs free")."""
    ray = pytest.importorskip("ray")
    from core.scale import RayExecutor

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 64.0, "GPU": 8.0})
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 64.0, "GPU": 8.0})
    assert RayExecutor()._resources() == (8, 1, 1, "cuda")
    assert RayExecutor(gpus_per_worker=2)._resources() == (4, 2, 1, "cuda")
    assert RayExecutor(workers=3, gpus_per_worker=0.5)._resources() == (3, 0.5, 1, "cuda")
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 60.0, "GPU": 2.0})  # 6 GPUs busy
    assert RayExecutor()._resources() == (2, 1, 1, "cuda")
    assert RayExecutor(workers=3)._shortfall(3, 1, 1) == "3 workers of 1 GPU asked, 2 GPUs free"
    assert RayExecutor()._shortfall(2, 1, 1) is None
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 1.0, "GPU": 2.0})
    assert RayExecutor()._shortfall(2, 1, 1) == "2 workers of 1 CPU asked, 1 CPU free"
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 6.0})
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 5.0})
    assert RayExecutor()._resources() == (5, 0.0, 1, "cpu")
    assert RayExecutor(cpus_per_worker=4)._resources() == (1, 0.0, 4, "cpu")
    with pytest.raises(InvalidInputError, match="whole number of GPUs"):
        RayExecutor(gpus_per_worker=1.5)


def test_auth_error_names_the_token(monkeypatch):
    """Joining a token-authenticated cluster without the token says so (not "start a cluster")."""
    ray = pytest.importorskip("ray")
    from core.scale import ray_executor

    def refuse(*args, **kwargs):
        raise ConnectionError("Failed to connect to GCS: UNAUTHENTICATED: Invalid or missing auth token")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(ExecutorError, match="token authentication") as err:
        ray_executor.connect("ray://head:10001")
    assert "RAY_AUTH_TOKEN" in str(err.value) and "start a cluster" not in str(err.value).lower()

    def unreachable(*args, **kwargs):
        raise ConnectionError("Could not find any running Ray instance")

    monkeypatch.setattr(ray, "init", unreachable)
    with pytest.raises(ExecutorError, match="ray start --head"):
        ray_executor.connect("auto")


def test_cli_ray_sizing_flags_need_ray():
    from click.testing import CliRunner

    from core.cli import main

    result = CliRunner().invoke(main, ["generate", "--workers", "2", "--limit", "1"])
    assert result.exit_code != 0 and "need --ray" in result.output


def test_spread_plan_places_every_parameter(tmp_path):
    """A pair larger than one GPU: each model's decoder layers in equal contiguous shares over the GPUs,
    embeddings on GPU 0, norm and (untied) head on the last; checked on an empty meta-device model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    from core.demo.pair import DEMO_DIR
    from core.pair.loading import spread_plan

    config = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=12,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    plan = spread_plan(config, 4, torch.bfloat16)
    assert [plan[f"model.layers.{i}"] for i in range(12)] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert plan["model.embed_tokens"] == 0 and plan["model.norm"] == 3 and plan["lm_head"] == 3
    model = AutoModelForCausalLM.from_config(config)
    for name, _ in model.named_parameters():  # every weight is placed, exactly once
        assert sum(name == k or name.startswith(k + ".") for k in plan) == 1, name
    # the demo reasoner (tied head: it stays with the embeddings), over 2 GPUs and over 1
    demo = AutoConfig.from_pretrained(DEMO_DIR / "reason")
    two = spread_plan(demo, 2, torch.float32)
    layers = [two[f"model.layers.{i}"] for i in range(demo.num_hidden_layers)]
    assert layers == sorted(layers) and set(layers) == {0, 1} and two["lm_head"] == two["model.embed_tokens"] == 0
    assert set(spread_plan(demo, 1, torch.float32).values()) == {0}


def test_import_reader_streams_blocks(tmp_path):
    """The pipeline's reader yields blocks as it goes (a generator), with the importer's line numbers."""
    import inspect

    from core.scale.ray_data import read_blocks

    path = tmp_path / "big.jsonl"
    good = json.dumps({"id": 1, "prompt": "p", "response": [3, 4], "answer": None})
    path.write_text("\n".join([good] * 150 + ["[oops"] + [good] * 49) + "\n")
    blocks = read_blocks(str(path), "jsonl", rows_per_block=64)
    assert inspect.isgenerator(blocks)
    first = next(blocks).to_pylist()
    assert len(first) == 64 and first[0]["line"] == 1 and json.loads(first[0]["response"]) == [3, 4]
    rest = [row for block in blocks for row in block.to_pylist()]
    assert len(first) + len(rest) == 200
    bad = [row for row in rest if row["error"]]
    assert [row["line"] for row in bad] == [151] and "not valid JSON" in bad[0]["error"]
    assert json.loads(first[0]["answer"]) is None


@pytest.mark.slow
def test_killed_driver_loses_nothing_and_resumes(tmp_path, problems):
    """A driver killed (SIGKILL) mid-run leaves every finished batch readable; the re-run makes only the rest."""
    script = tmp_path / "drive.py"
    script.write_text(textwrap.dedent("""
        import sys, time, torch
        torch.set_num_threads(1)
        import core
        from core.scale import InProcessExecutor
        pair, problems = core.demo_pair(device="cpu"), core.demo_problems(limit=6)
        store = core.TraceStore(sys.argv[1])
        slow = sys.argv[2] == "slow"
        def tick(done, total):
            print(done, flush=True)
            if slow and done >= 4:
                time.sleep(60)  # killed here, with 2 of 3 batches written
        ex = InProcessExecutor()
        ex.generate_many(pair, problems, None, batch_size=2, store=store, progress=tick, max_new_tokens=8)
        print("units", int(ex.summary()["units"].sum()), flush=True)
    """))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    store = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, str(script), str(store), "slow"], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env=env)
    for line in proc.stdout:
        if line.strip() == "4":
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    kept = core.TraceStore(store)
    assert len(kept.keys()) == 4 and not kept.unreadable()
    done = subprocess.run([sys.executable, str(script), str(store), "fast"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "units 2" in done.stdout  # only the missing batch was made
    assert len(core.TraceStore(store).keys()) == 6


@pytest.mark.slow
def test_driver_memory_grows_by_summaries_not_traces():
    """The 100k-problem simulation's slope, small: synthetic rows of 3,000 tokens through stream_records and
    the real drive loop; the rows go to disk, so peak driver RSS grows by the problem list alone, a few dozen
    bytes per row at these sizes (rows kept in memory: ~400 B per row; a driver holding the traces: ~370 B
    per token, 1.1 MB per row)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_driver_memory import TRACE_BYTES_PER_TOKEN, measure, slope

    points = [measure(n, 3000) for n in (250, 2500)]
    assert [p["rows"] for p in points] == [250 * 32, 2500 * 32] and all(p["policies"] == 4 for p in points)
    per_row = slope(points)
    assert per_row < 150, f"{per_row:.0f} B of driver memory per row"
    assert per_row < 3000 * TRACE_BYTES_PER_TOKEN / 5000
