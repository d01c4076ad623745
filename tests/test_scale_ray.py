"""core.scale on Ray: the RayExecutor gives the traces one process gives, skips what is stored, loses and doubles
nothing. The tests share one local Ray (2 CPUs, `ray_cluster`) and 2 CPU workers on the demo pair; they compare
every result with the in-process run, and kill workers mid-batch, between stages (through the CLI) and for good.

Order: the tests that use the module's 2 workers as they are come first, then those that kill or close them
(each start of a worker loads the pair in a fresh process: seconds), then those that start pools of their own.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

import core
import core.scale
from core.errors import ExecutorError
from tests.scaling import OPTS, demo, problems, reference, same  # noqa: F401 - demo, problems: fixtures

ROOT = Path(__file__).resolve().parents[1]


# -- Ray ---------------------------------------------------------------------------------------------

def _claim(path: str) -> bool:
    """Create `path` holding this process's id; False when another process made it first (O_EXCL)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


class SleepOnce(core.BaseOnly):
    """BaseOnly (same record, same keys) that stops two workers at step 2: the first to get there writes its
    pid to `marker` and sleeps (the test kills that process mid-batch); the next waits while `hold` exists, so
    that a batch is still waiting for a worker when the killed batch's re-run comes back (the pool sends it to
    the restarted worker). Each is claimed by one process only."""

    marker = ""
    hold = ""

    def takeover(self, step):
        if step.t == 2 and self.marker:
            if _claim(self.marker):
                time.sleep(120)
            elif self.hold and _claim(self.hold + ".taken"):
                while os.path.exists(self.hold):
                    time.sleep(0.05)
        return super().takeover(step)


@pytest.fixture(scope="module")
def ray_cluster():
    """ONE local Ray (2 CPUs) for this file's tests (starting Ray costs seconds); each test starts and stops only
    its own workers on it, and Ray stops with the file (its daemons would otherwise idle on a shared core
    through the rest of the worker's tests)."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_executor(ray_cluster):
    """2 CPU workers on the module's Ray (max_restarts=1: a second kill of one worker is for good)."""
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
def test_killed_worker_batch_is_retried(ray_executor, demo, problems, tmp_path):
    SleepOnce.marker, SleepOnce.hold = str(tmp_path / "victim.pid"), str(tmp_path / "hold")
    Path(SleepOnce.hold).touch()
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
    while len(store.keys()) < 2:  # the re-run batch is stored: the pool has sent the last batch to its worker
        assert time.time() < deadline + 120 and thread.is_alive(), box.get("error")
        time.sleep(0.2)
    Path(SleepOnce.hold).unlink()
    thread.join(timeout=240)
    assert "error" not in box, box.get("error")
    out = box["out"]
    assert all(same(a, b) for a, b in zip(out, ref)) and len(out) == len(ref) == 6
    assert sorted(store.keys()) == sorted(t.key for t in ref)  # nothing lost, nothing doubled
    assert ray_executor.summary()["retried"].sum() == 1  # the batch sent to the restarted worker ran once


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


@pytest.mark.slow
def test_cli_generate_and_import_with_ray(ray_executor, problems, tmp_path):
    """`forkpoint generate --ray` and `forkpoint import PATH --ray` store what the in-process commands store."""
    from click.testing import CliRunner

    from core.cli import main

    ray_executor.close_actors()  # the commands start their own workers on this Ray (one each: a worker's start
    runner = CliRunner()          # costs ~4 s of CPU, and two workers are tested above)
    args = ["generate", "--limit", "3", "--max-new-tokens", "8", "--batch-size", "1"]
    local = runner.invoke(main, [*args, "--store", str(tmp_path / "a")])
    remote = runner.invoke(main, [*args, "--store", str(tmp_path / "b"), "--ray", "--workers", "1"])
    assert local.exit_code == 0 and remote.exit_code == 0, remote.output
    assert "per-worker throughput" in remote.output
    assert sorted(core.TraceStore(tmp_path / "a").keys()) == sorted(core.TraceStore(tmp_path / "b").keys())
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({"id": i, "prompt": p.prompt, "response": "The answer is 4."}) + "\n"
                            for i, p in enumerate(problems[:2])))
    imported = [runner.invoke(main, ["import", str(path), "--store", str(tmp_path / s), *extra])
                for s, extra in (("c", []), ("d", ["--ray", "--workers", "1"]))]
    assert all(r.exit_code == 0 for r in imported), imported[1].output
    assert sorted(core.TraceStore(tmp_path / "c").keys()) == sorted(core.TraceStore(tmp_path / "d").keys())
    assert len(core.TraceStore(tmp_path / "d").keys()) == 2


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
