"""core.scale: executors give the traces one process gives, skip what is stored, lose and double nothing.

The in-process tests are fast. The Ray tests share the session's one local Ray (2 CPUs, `ray_cluster` in
conftest.py) and 2 CPU workers on the demo pair; they compare every result with the in-process run, and
kill workers mid-batch, between stages (through the CLI) and for good.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import core
from core.errors import ExecutorError, GenerationCancelled, InvalidInputError
from core.scale import InProcessExecutor, PairSpec, drive, make_jobs

ROOT = Path(__file__).resolve().parents[1]
OPTS = {"max_new_tokens": 12, "temperature": 0.7, "top_p": 0.95, "seed": 3, "samples": 2}


@pytest.fixture(scope="module")
def demo():
    return core.demo_pair(device="cpu")


@pytest.fixture(scope="module")
def problems():
    return core.demo_problems(limit=6)


def same(a, b) -> bool:
    """Token-identical traces with the same key and sources; metrics equal to float32 rounding (the
    engine's verify-ahead blocks adapt at run time, so the reasoner's sums may group differently)."""
    return (a.key == b.key and np.array_equal(a.token_ids, b.token_ids) and list(a.source) == list(b.source)
            and all(np.allclose(a.metrics[m], b.metrics[m], rtol=1e-5, atol=1e-5, equal_nan=True)
                    for m in a.metrics))


def reference(pair, problems, policy, batch_size, **opts):
    """The plain engine, batch by batch: what every executor must reproduce."""
    out = []
    for i in range(0, len(problems), batch_size):
        out += core.generate(pair, problems[i:i + batch_size], policy, **opts)
    return out


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


# -- Ray ---------------------------------------------------------------------------------------------

class SleepOnce(core.BaseOnly):
    """BaseOnly (same record, same keys) that, the first time any worker runs it, writes its pid to
    `marker` and sleeps: the test kills that process mid-batch."""

    marker = ""

    def takeover(self, step):
        if step.t == 2 and self.marker and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            time.sleep(120)
        return super().takeover(step)


@pytest.fixture(scope="module")
def ray_executor(ray_cluster):
    """2 CPU workers on the session's Ray (max_restarts=1: a second kill of one worker is for good)."""
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need SleepOnce's code
    ex = core.scale.RayExecutor(workers=2, max_restarts=1)
    yield ex
    ex.close()


def _kill(pid: int) -> None:
    """SIGKILL a worker process and wait until it is gone."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


class _CountingStore(core.TraceStore):
    """A TraceStore that counts the writes this process makes."""

    writes = 0

    def put(self, trace, overwrite=False):
        if overwrite or trace.key not in self:
            self.writes += 1
        return super().put(trace, overwrite=overwrite)


def test_ray_matches_in_process(ray_executor, demo, problems, tmp_path):
    policy = core.RandomPositions(rate=0.3, seed=1)
    ref = reference(demo, problems, policy, 2, **OPTS)
    store = core.TraceStore(tmp_path / "s")
    ticks = []
    out = ray_executor.generate_many(demo, problems, policy, batch_size=2, store=store,
                                     progress=lambda d, n: ticks.append((d, n)), **OPTS)
    assert len(out) == 12 and all(same(a, b) for a, b in zip(out, ref))
    assert sorted(store.keys()) == sorted(t.key for t in ref)
    assert ticks[-1] == (12, 12) and [d for d, _ in ticks] == sorted(d for d, _ in ticks)
    summary = ray_executor.summary()
    assert len(summary) == 2 and summary["units"].sum() == 12 and (summary["jobs"] > 0).all()
    # a re-run sends nothing to the workers
    before = summary["units"].sum()
    again = ray_executor.generate_many(demo, problems, policy, batch_size=2, store=store, **OPTS)
    assert ray_executor.summary()["units"].sum() == before and all(same(a, b) for a, b in zip(again, ref))
    # workers_write: the workers grade (on_trace) and write into the shared store; the driver writes nothing
    from core.evaluation.grading import grade_trace

    shared = _CountingStore(tmp_path / "shared")
    ray_executor.workers_write = True
    try:
        made = ray_executor.generate_many(demo, problems[:2], policy, batch_size=1, store=shared,
                                          on_trace=grade_trace, **OPTS)
    finally:
        ray_executor.workers_write = False
    assert shared.writes == 0 and sorted(shared.keys()) == sorted(t.key for t in made) and len(made) == 4
    assert all(shared.get(t.key).meta.get("correct") is not None for t in made)


def test_ray_evaluate_and_gate_match_in_process(ray_executor, demo, problems, tmp_path):
    """core.evaluate's table and core.calibrate's gate are the same with executor=RayExecutor."""
    import pandas.testing

    from core.decoding.policies import make_policy

    calib = core.demo_problems("calib", limit=4)
    gates = [core.calibrate(demo, calib, ratio=0.1, max_new_tokens=12, batch_size=2, executor=ex)
             for ex in (None, ray_executor)]
    assert gates[0].window == gates[1].window
    assert gates[0].tau == pytest.approx(gates[1].tau, rel=1e-5) and gates[0].lam == pytest.approx(gates[1].lam, rel=1e-5)
    policies = {"guided": make_policy("guided", gate=gates[1]), "random": core.RandomPositions(rate=0.2, seed=1)}
    opts = {"samples": 2, "temperature": 0.7, "seed": 3, "max_new_tokens": 12, "batch_size": 2}
    before = ray_executor.summary()["units"].sum()
    tables = [core.evaluate(demo, problems[:4], policies, store=core.TraceStore(tmp_path / name), executor=ex, **opts)
              for name, ex in (("local", None), ("ray", ray_executor))]
    pandas.testing.assert_frame_equal(tables[0], tables[1])
    assert ray_executor.summary()["units"].sum() - before == 4 * 4 * 2  # every row was made on the workers
    assert set(tables[0]["policy"]) == {"base", "reason", "guided", "random"}


@pytest.mark.slow
def test_killed_worker_batch_is_retried(ray_executor, demo, problems, tmp_path):
    SleepOnce.marker = str(tmp_path / "victim.pid")
    ref = reference(demo, problems, core.BaseOnly(), 2, max_new_tokens=10)
    store = core.TraceStore(tmp_path / "s")
    box = {}

    def run():
        try:
            box["out"] = ray_executor.generate_many(demo, problems, SleepOnce(), batch_size=2, store=store,
                                                    max_new_tokens=10)
        except BaseException as exc:  # noqa: BLE001  re-raised below
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.time() + 120
    while not os.path.exists(SleepOnce.marker) or not Path(SleepOnce.marker).read_text():
        assert time.time() < deadline and thread.is_alive(), box.get("error")
        time.sleep(0.2)
    victim = int(Path(SleepOnce.marker).read_text())
    assert victim in ray_executor.pids()
    os.kill(victim, signal.SIGKILL)
    thread.join(timeout=240)
    assert "error" not in box, box.get("error")
    out = box["out"]
    assert all(same(a, b) for a, b in zip(out, ref)) and len(out) == len(ref) == 6
    assert sorted(store.keys()) == sorted(t.key for t in ref)  # nothing lost, nothing doubled
    assert ray_executor.summary()["retried"].sum() == 1


def test_ray_data_import_matches_in_process(ray_executor, demo, problems, tmp_path):
    from core.evaluation.graded_import import import_file
    from core.scale.ray_data import import_file_ray

    path = tmp_path / "rollouts.jsonl"
    lines = [json.dumps({"id": f"r{i}", "prompt": p.prompt, "response": f"The answer is {p.gold}.",
                         "answer": p.gold}) for i, p in enumerate(problems[:4])]
    lines += ["{not json", lines[0]]  # a bad line and a duplicate
    path.write_text("\n".join(lines) + "\n")
    a, b = core.TraceStore(tmp_path / "a"), core.TraceStore(tmp_path / "b")
    mine = import_file(demo, path, a)
    theirs = import_file_ray(demo, path, b, executor=ray_executor, rows_per_block=2, batch_size=2)
    assert theirs.to_dict() == mine.to_dict()
    assert mine.to_dict()["stored"] == 4 and len(mine.errors) == 1 and len(mine.skipped) == 1
    assert sorted(a.keys()) == sorted(b.keys())
    for key in a.keys():  # noqa: SIM118  (a store, not a dict)
        x, y = a.get(key), b.get(key)
        assert same(x, y) and x.meta["import"] == y.meta["import"]


def test_ray_takeover_effects_match_in_process(ray_executor, demo, problems, tmp_path):
    """core.takeover_effects(executor=RayExecutor): the positions of two traces spread over the workers (the
    driver holds only a PairSpec) give the in-process table and store the same continuations."""
    import pandas.testing

    from core.instruments.effects import measure_effects, takeover_effects

    traces = core.generate(demo, problems[:2], max_new_tokens=30)
    where, opts = [3, 6], {"samples": 2, "max_new_tokens": 24}
    local, remote = core.TraceStore(tmp_path / "a"), core.TraceStore(tmp_path / "b")
    ref = pandas.concat([takeover_effects(demo, t, where, store=local, **opts) for t in traces], ignore_index=True)
    ray_executor.start(demo)  # (a test before may have closed the workers; a fresh start resets their counts)
    before = ray_executor.summary()["units"].sum()
    got = measure_effects(core.scale.PairSpec.from_pair(demo), traces, where, store=remote, executor=ray_executor,
                          **opts)
    pandas.testing.assert_frame_equal(got, ref)
    assert sorted(remote.keys()) == sorted(local.keys()) and len(local.keys()) == 2 * 2 * 2 * 2
    assert ray_executor.summary()["units"].sum() - before == 16  # every continuation was made on a worker
    again = takeover_effects(demo, traces[1], where, store=remote, executor=ray_executor, **opts)
    pandas.testing.assert_frame_equal(again, ref.iloc[2:].reset_index(drop=True))
    assert ray_executor.summary()["units"].sum() - before == 16  # the rerun read them back


def test_ray_gate_shoot_out_matches_in_process(ray_executor, demo, problems, tmp_path):
    """core.compare_gates(executor=RayExecutor) (`forkpoint gates --ray`): the same table as in process, wall
    times from the seconds the workers' traces record, reasoner forwards not counted (made elsewhere)."""
    from core.reports.gates import compare_gates

    calib = core.demo_problems("calib", limit=3)
    opts = {"samples": 1, "max_new_tokens": 12, "temperature": 0.7, "seed": 3, "batch_size": 2}
    ray_executor.start(demo)
    before = ray_executor.summary()["units"].sum()
    tables = [compare_gates(demo, problems[:3], calib, (0.1,), gates=("guided", "top_prob"), executor=ex,
                            store=core.TraceStore(tmp_path / name), **opts).set_index("label")
              for name, ex in (("local", None), ("ray", ray_executor))]
    assert ray_executor.summary()["units"].sum() - before == 3 + 4 * 3  # calibration rollouts, 4 stages x 3 problems
    same_cols = ["rho", "accuracy", "pass@k", "calibrated_rho", "knob_value", "reason_evals_per_token"]
    pd.testing.assert_frame_equal(tables[0][same_cols], tables[1][same_cols])
    assert tables[0]["reason_forwards_per_token"].notna().all() and tables[1]["reason_forwards_per_token"].isna().all()
    assert (tables[1]["wall_s_per_token"] > 0).all()


@pytest.mark.slow
def test_one_worker_gives_what_two_give(ray_executor, demo, problems):
    """The number of workers changes nothing: batches are cut by batch_size, never by worker count."""
    policy = core.RandomPositions(rate=0.3, seed=1)
    two = ray_executor.generate_many(demo, problems, policy, batch_size=2, **OPTS)
    ray_executor.close_actors()  # free both CPUs for the one-worker executor
    one = core.scale.RayExecutor(workers=1)
    try:
        single = one.generate_many(demo, problems, policy, batch_size=2, **OPTS)
        assert len(one.summary()) == 1 and one.summary()["jobs"].sum() == 3
    finally:
        one.close_actors()
    assert len(single) == len(two) == 12 and all(same(a, b) for a, b in zip(single, two))


@pytest.mark.slow
def test_cli_generate_and_import_with_ray(ray_executor, problems, tmp_path):
    """`forkpoint generate --ray` and `forkpoint import PATH --ray` store what the in-process commands store."""
    from click.testing import CliRunner

    from core.cli import main

    ray_executor.close_actors()  # the commands start their own workers on this Ray
    runner = CliRunner()
    args = ["generate", "--limit", "3", "--max-new-tokens", "8", "--batch-size", "1"]
    local = runner.invoke(main, [*args, "--store", str(tmp_path / "a")])
    remote = runner.invoke(main, [*args, "--store", str(tmp_path / "b"), "--ray"])
    assert local.exit_code == 0 and remote.exit_code == 0, remote.output
    assert "per-worker throughput" in remote.output
    assert sorted(core.TraceStore(tmp_path / "a").keys()) == sorted(core.TraceStore(tmp_path / "b").keys())
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({"id": i, "prompt": p.prompt, "response": "The answer is 4."}) + "\n"
                            for i, p in enumerate(problems[:2])))
    imported = [runner.invoke(main, ["import", str(path), "--store", str(tmp_path / s), *extra])
                for s, extra in (("c", []), ("d", ["--ray"]))]
    assert all(r.exit_code == 0 for r in imported), imported[1].output
    assert sorted(core.TraceStore(tmp_path / "c").keys()) == sorted(core.TraceStore(tmp_path / "d").keys())
    assert len(core.TraceStore(tmp_path / "d").keys()) == 2


def test_more_workers_than_exist_is_a_message_within_the_timeout(ray_executor, demo):
    """Workers that cannot get resources: a message naming what is missing once start_timeout passes."""
    ray_executor.start(demo)  # the 2 workers hold both CPUs
    greedy = core.scale.RayExecutor(workers=3, start_timeout=3)
    t0 = time.monotonic()
    with pytest.raises(ExecutorError, match=r"0 of 3 Ray workers started within 3 s: 3 workers of 1 CPU asked, "
                                            r"0 CPUs free"):
        greedy.start(demo)
    assert time.monotonic() - t0 < 3 + 60  # the timeout, plus slack for a loaded machine
    assert greedy._actors == [] and len(ray_executor.pids()) == 2  # nothing left behind; the others unharmed


@pytest.mark.slow
def test_worker_killed_between_stages_through_the_cli(ray_executor, tmp_path, monkeypatch):
    """`forkpoint eval --ray` on the demo pair, a worker SIGKILLed after the first stage and before the
    next asks for keys (the reported crash): Ray restarts it, the run finishes with the in-process table."""
    from click.testing import CliRunner

    from core.cli import main
    from core.scale.ray_executor import RayExecutor

    ray_executor.close_actors()  # the command starts its own workers on this Ray
    calib = tmp_path / "calib.jsonl"
    calib.write_text("".join(json.dumps({"id": p.id, "prompt": p.prompt, "answer": p.gold}) + "\n"
                             for p in core.demo_problems("calib", limit=2)))
    args = ["eval", "--limit", "2", "--samples", "1", "--max-new-tokens", "8", "--ratios", "0.1",
            "--calibration", str(calib)]
    runner = CliRunner()
    local = runner.invoke(main, [*args, "--store", str(tmp_path / "a"), "--out", str(tmp_path / "a.csv")])
    assert local.exit_code == 0, local.output
    stages, killed = [0], []
    original = RayExecutor.run_jobs

    def kill_before_second_stage(self, *a, **kw):
        stages[0] += 1
        if stages[0] == 2:
            killed.append(self.pids()[0])
            _kill(killed[0])
        return original(self, *a, **kw)

    monkeypatch.setattr(RayExecutor, "run_jobs", kill_before_second_stage)
    remote = runner.invoke(main, [*args, "--store", str(tmp_path / "b"), "--out", str(tmp_path / "b.csv"), "--ray",
                                  "--workers", "2"])
    assert remote.exit_code == 0, remote.output
    assert killed and stages[0] > 2
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()
    assert sorted(core.TraceStore(tmp_path / "a").keys()) == sorted(core.TraceStore(tmp_path / "b").keys())


@pytest.mark.slow
def test_worker_killed_twice_leaves_the_pool(ray_executor, demo, problems, tmp_path, caplog):
    """max_restarts=1: the first kill is restarted (pids() follows it), the second is for good; the worker
    leaves the pool with a warning and the other one makes every row."""
    ray_executor.start(demo)
    first = ray_executor.pids()[0]
    _kill(first)
    deadline = time.time() + 120
    while ray_executor.pids()[0] == first:  # Ray restarts it; pids() asks the new process
        assert time.time() < deadline
    second = ray_executor.pids()[0]
    assert second != first and second in ray_executor.pids()
    _kill(second)
    store = core.TraceStore(tmp_path / "s")
    with caplog.at_level("WARNING", logger="core.scale.ray_executor"):
        out = ray_executor.generate_many(demo, problems, core.BaseOnly(), batch_size=2, store=store,
                                         max_new_tokens=6)
    ref = reference(demo, problems, core.BaseOnly(), 2, max_new_tokens=6)
    assert all(same(a, b) for a, b in zip(out, ref)) and sorted(store.keys()) == sorted(t.key for t in ref)
    assert "leaves the pool, 1 worker(s) left" in caplog.text
    summary = ray_executor.summary()
    assert list(summary["alive"]) == [False, True] and len(ray_executor.pids()) == 1
    ray_executor.close_actors()  # later tests start a full pool again


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
