"""A seeded fuzz run of forkpoint's reliability promises, as an outsider would try them; numbers for docs/RELIABILITY.md.

    PYTHONPATH=. python benchmarks/fuzz_reliability.py [--seed 0] [--rounds 5]

Each section damages inputs in many ways and checks what must hold: every record has exactly one outcome,
what the result calls stored is what the store holds, nothing raises, damaged files are found and never
block the rest, and every bad CLI input is refused (exit 2, naming its flag) before any model loads.
No model is loaded: records are scored by a fake scorer (tests/fakes.py). Prints one line per section.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from core.io.foreign import ForeignRecord, iter_foreign  # noqa: E402
from core.evaluation.graded_import import import_file  # noqa: E402
from core.io.maintenance import repair, verify  # noqa: E402
from core.io.store import TraceStore  # noqa: E402


def fake_score(pair, problem, response):
    from fakes import make_trace

    text = response if isinstance(response, str) else " ".join(f"t{i}" for i in response)
    trace = make_trace(text=text[:200], seed=len(text), meta={"problem": problem, "kind": "score"})
    del trace.meta["answer"], trace.meta["correct"]
    return trace


def good(i: int) -> dict:
    return {"id": f"r{i}", "prompt": f"What is {i} + 1?", "response": f"so \\boxed{{{i + 1}}}", "answer": str(i + 1)}


JSONL_DAMAGE = [  # 37 kinds of damage to one JSONL line
    lambda r, s: s[: r.randrange(1, len(s))], lambda r, s: s + "}", lambda r, s: "{" + s, lambda r, s: "",
    lambda r, s: "   ", lambda r, s: "null", lambda r, s: "[]", lambda r, s: "42", lambda r, s: '"text"',
    lambda r, s: s.replace('"id"', '"ID"'), lambda r, s: s.replace('"prompt"', '"p"'),
    lambda r, s: s.replace('"response"', '"r"'), lambda r, s: s.replace(': "r', ': ""', 1),
    lambda r, s: '{"id": true, "prompt": "p", "response": "r"}', lambda r, s: '{"id": "", "prompt": "p", "response": "r"}',
    lambda r, s: '{"id": "x", "prompt": "  ", "response": "r"}', lambda r, s: '{"id": "x", "prompt": "p", "response": []}',
    lambda r, s: '{"id": "x", "prompt": "p", "response": [1, -1]}', lambda r, s: '{"id": "x", "prompt": "p", "response": [1.5]}',
    lambda r, s: '{"id": "x", "prompt": "p", "response": "r", "answer": [1]}', lambda r, s: '{"id": NaN}',
    lambda r, s: '{"id": "x", "prompt": "p", "response": Infinity}', lambda r, s: '{"id": "\\ud800", "prompt": "p", "response": "r"}',
    lambda r, s: "[" * 5000 + "]" * 5000, lambda r, s: '{"a":' * 100 + "1" + "}" * 100,
    lambda r, s: s.replace("{", "{\x00", 1), lambda r, s: s + s, lambda r, s: s[::-1],
    lambda r, s: s.replace('"', "'"), lambda r, s: "\ufeff" + s, lambda r, s: s.replace(",", ",\n", 1),
    lambda r, s: s + "\r", lambda r, s: "x" * 70_000, lambda r, s: s.replace("What", "Wh\udcffat"),
    lambda r, s: '{"id": "x", "prompt": "p", "response": "r", "id": 5}', lambda r, s: s.replace("1", "١"),
    lambda r, s: json.dumps({"id": "dup", "prompt": "p", "response": "r"}),
]


def fuzz_jsonl(rng: random.Random, tmp: Path, rounds: int) -> str:
    lines_total = broken = 0
    for n in range(rounds):
        lines = []
        for i in range(200):
            line = json.dumps(good(i))
            if rng.random() < 0.5:
                line = rng.choice(JSONL_DAMAGE)(rng, line)
                broken += 1
            lines.append(line)
        path = tmp / f"f{n}.jsonl"
        path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass"))
        store = TraceStore(tmp / f"sj{n}")
        result = import_file("PAIR", path, store, score_fn=fake_score, format="jsonl")
        assert result.stopped is None
        outcomes = [x for x, _ in result.stored] + [x for x, _, _ in result.skipped] + [x for x, _ in result.errors]
        assert len(outcomes) == len(set(outcomes)), "a line with two outcomes"
        read = {item.line if isinstance(item, ForeignRecord) else item[0] for item in iter_foreign(path, "jsonl")}
        assert set(outcomes) == read, "a line without an outcome"
        assert sorted(store.keys()) == sorted(k for _, k in result.stored) and store.unreadable() == []
        lines_total += len(lines)
    return f"JSONL: {rounds} files x 200 lines, {broken} damaged lines of {len(JSONL_DAMAGE)} kinds: every line one outcome, store == report"


def fuzz_csv(rng: random.Random, tmp: Path, rounds: int) -> str:
    import csv
    import io

    kept = 0
    kinds = {"stray quote": 0, "open quote": 0, "extra cell": 0, "huge cell": 0, "blank": 0, "bad utf-8": 0}
    for n in range(rounds):
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\r\n")
        writer.writerow(["id", "prompt", "response", "answer"])
        rows = [good(i) for i in range(200)]
        for row in rows:
            writer.writerow([row["id"], row["prompt"], row["response"], row["answer"]])
        text = buf.getvalue().split("\r\n")
        for i in rng.sample(range(1, 200), 30):
            kind = rng.choice(list(kinds))
            kinds[kind] += 1
            text[i] = {"stray quote": lambda s: s.replace("What", 'Wh"at', 1), "open quote": lambda s: s.replace(",", ',"', 1),
                       "extra cell": lambda s: s + ",x", "huge cell": lambda s: s.replace("What", '"' + "W" * (9 << 20) + '"', 1),
                       "blank": lambda s: "", "bad utf-8": lambda s: s.replace("What", "W\x00FF\x00at", 1)}[kind](text[i])
        path = tmp / f"f{n}.csv"
        data = "\r\n".join(text).encode()
        path.write_bytes(data.replace(b"\x00FF\x00", b"\xff"))  # a byte that is not UTF-8
        store = TraceStore(tmp / f"sc{n}")
        result = import_file("PAIR", path, store, score_fn=fake_score)
        assert result.stopped is None
        outcomes = [x for x, _ in result.stored] + [x for x, _, _ in result.skipped] + [x for x, _ in result.errors]
        assert len(outcomes) == len(set(outcomes)), "a row with two outcomes"
        read = {item.line if isinstance(item, ForeignRecord) else item[0] for item in iter_foreign(path, "csv")}
        assert set(outcomes) == read and sorted(store.keys()) == sorted(k for _, k in result.stored)
        kept += len(result.stored)
    return (f"CSV: {rounds} files x 200 rows, {sum(kinds.values())} damaged rows ({', '.join(f'{v} {k}' for k, v in kinds.items())}): "
            f"never raised, {kept} rows stored, every row one outcome, store == report")


def fuzz_parquet(rng: random.Random, tmp: Path, rounds: int) -> str:
    damaged_groups = rows_lost = rows_kept = 0
    for n in range(rounds):
        path = tmp / f"f{n}.parquet"
        pq.write_table(pa.Table.from_pylist([good(i) for i in range(100)]), path, row_group_size=20)
        meta = pq.read_metadata(path)
        hit = sorted(rng.sample(range(meta.num_row_groups), rng.randint(1, 2)))
        raw = bytearray(path.read_bytes())
        for g in hit:
            col = meta.row_group(g).column(rng.randrange(meta.num_columns))
            at = (col.dictionary_page_offset or col.data_page_offset) + rng.randrange(0, 8)
            for j in range(at, at + 10):
                raw[j] ^= 0xFF
        path.write_bytes(bytes(raw))
        store = TraceStore(tmp / f"sp{n}")
        result = import_file("PAIR", path, store, score_fn=fake_score)
        healthy = set()
        for g in range(meta.num_row_groups):
            try:
                pq.ParquetFile(path).read_row_group(g)
                healthy |= set(range(20 * g + 1, 20 * g + 21))
            except Exception:  # noqa: BLE001  (the reference: what pyarrow can read per group)
                damaged_groups += 1
        assert {x for x, _ in result.stored} == healthy, (hit, len(healthy))
        rows_lost += 100 - len(healthy)
        rows_kept += len(healthy)
    return (f"Parquet: {rounds} files x 5 row groups, {damaged_groups} groups damaged: {rows_kept} rows of healthy groups "
            f"all stored, {rows_lost} reported with their group's range")


def fuzz_store(rng: random.Random, tmp: Path, n_files: int) -> str:
    from fakes import make_trace

    store = TraceStore(tmp / "store")
    keys = [store.put(make_trace(30, seed=s)) for s in range(n_files)]
    kinds = ["truncate", "zeros", "tail", "page", "header", "bitflip", "empty", "append", "swap"]
    damaged: dict[str, str] = {}
    for key in rng.sample(keys, n_files * 2 // 3):
        path = store.traces_dir / f"{key}.parquet"
        data = bytearray(path.read_bytes())
        kind = rng.choice(kinds)
        if kind == "truncate":
            data = data[: rng.randrange(1, len(data))]
        elif kind == "zeros":
            data = bytearray(len(data))
        elif kind == "tail":
            data[-rng.randrange(1, 40)] ^= 0xFF
        elif kind == "page":
            for j in range(200, 260):
                data[j] ^= 0xFF
        elif kind == "header":
            col = pq.read_metadata(path).row_group(0).column(1)
            at = col.dictionary_page_offset or col.data_page_offset
            for j in range(at, at + 12):
                data[j] ^= 0xFF
        elif kind == "bitflip":
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == "empty":
            data = bytearray()
        elif kind == "append":
            data += b"garbage"
        else:
            other = store.traces_dir / f"{rng.choice(keys)}.parquet"
            data = bytearray(other.read_bytes()) if other != path else bytearray(b"x")
        path.write_bytes(bytes(data))
        damaged[key] = kind
    fresh = TraceStore(store.path)
    bad = {p.name[:-8] for p, _ in fresh.unreadable()}
    traces, skipped = fresh.load_all()
    silent = [k for k in damaged if k not in bad and fresh.get(k) != make_trace(30, seed=keys.index(k))]
    assert not silent, f"damage read back as a different trace: {silent}"
    assert {t.key for t in traces} == set(keys) - bad and len(skipped) == len(bad)
    report = repair(fresh)
    assert {k for k, _, _ in report.set_aside} == bad and verify(TraceStore(store.path)).ok
    harmless = len(damaged) - len(bad)
    return (f"Store: {n_files} traces, {len(damaged)} damaged in {len(kinds)} ways: {len(bad)} detected and set aside by repair, "
            f"{harmless} harmless (read back identical), 0 silent changes; the rest always loaded")


def fuzz_report_full(rng: random.Random, tmp: Path, rounds: int) -> str:
    import builtins
    import errno

    import core.io.imports as imports

    stops = 0
    for n in range(rounds):
        room = rng.randrange(0, 51)  # 50 outcome lines and the closing one: the disk fills before the end

        class Filling:
            def __init__(self, fh):
                self.fh, self.left = fh, room

            def write(self, text):
                self.left -= 1
                return self.fh.write(text) if self.left >= 0 else len(text)

            def flush(self):
                if self.left < 0:
                    raise OSError(errno.ENOSPC, "No space left on device")
                self.fh.flush()

            def close(self):
                self.fh.close()

        path = tmp / f"r{n}.jsonl"
        path.write_text("\n".join(json.dumps(good(i)) for i in range(50)))
        store = TraceStore(tmp / f"sr{n}")
        imports.open = lambda *a, **k: Filling(builtins.open(*a, **k))  # noqa: B023
        try:
            result = import_file("PAIR", path, store, score_fn=fake_score, report_path=tmp / f"rep{n}.jsonl")
        finally:
            del imports.open
        stops += result.stopped is not None
        assert sorted(store.keys()) == sorted(k for _, k in result.stored)
    return f"Report on a full disk: {rounds} imports, the disk full at a random report line: {stops} stopped with the message, store == result every time"


def fuzz_cli(tmp: Path) -> str:
    from click.testing import CliRunner
    from test_cli import _bad_inputs

    import core.cli.common as common
    import core.cli.evaluation as evaluation
    import core.cli.store as store_cli
    import core.cli.traces as traces
    from core.cli import main

    def loaded(*a, **k):
        raise AssertionError("model loaded")

    for mod in (common, traces, store_cli, evaluation):
        for name in ("pair_from_options", "pair_or_spec"):
            if hasattr(mod, name):
                setattr(mod, name, loaded)
    (tmp / "cli_store").mkdir()
    cases = _bad_inputs(tmp) + _more_bad_inputs()
    refused = 0
    for args, flag in cases:
        if args[0] not in ("demo", "app", "reproduce") and "--store" not in args:
            args = [*args, "--store", str(tmp / "cli_store")]
        out = CliRunner().invoke(main, args)
        refused += out.exit_code == 2 and flag in out.output and "Traceback" not in out.output
    commands = len({args[0] for args, _ in cases})
    return f"CLI: {len(cases)} bad inputs over {commands} commands: {refused} refused with exit 2, naming the flag, before any model loaded"


def _more_bad_inputs() -> list[tuple[list[str], str]]:
    """Issue 33: non-finite numbers in every kind of float option, and text that cannot be tokenized."""
    bad_bytes = "x \udced\udca0\udc80 y"  # $'x \xed\xa0\x80 y' as Python decodes argv
    cases = [([cmd, flag, value], flag) for cmd, flag in (("generate", "--temperature"), ("generate", "--ratio"),
                                                           ("generate", "--tau"), ("generate", "--lam"),
                                                           ("eval", "--top-p"), ("calibrate", "--ratio"),
                                                           ("effects", "--sample-temperature"))
             for value in ("nan", "inf", "-inf")]
    cases += [(["score", "--prompt", bad_bytes, "--response", "r"], "--prompt"),
              (["score", "--prompt", "p", "--response", "a\x00b"], "--response"),
              (["generate", "--prompt", bad_bytes], "--prompt"), (["generate", "--base-format", "no placeholder"],
                                                                  "--base-format"),
              (["eval", "--ratios", "0.1,nan"], "--ratios"), (["remove", "../../x"], "KEYS"),
              (["app", "--address", "999.1.1.1"], "--address")]
    return cases


def fuzz_side_files(rng: random.Random, tmp: Path, n: int) -> str:
    """Notes files damaged in 5 ways: every export still writes every trace and names the damaged ones; verify
    lists exactly them; repair sets them all aside."""
    from click.testing import CliRunner
    from fakes import make_trace

    from core.cli import main
    from core.io import notes as nt

    store = TraceStore(tmp / "side_store")
    keys = [store.put(make_trace(12, seed=i)) for i in range(n)]
    for i, key in enumerate(keys):
        nt.add_note(store, key, 0, 1, f"note {i}")
    kinds = {"truncated": lambda b: b[: rng.randrange(1, len(b) - 1)], "empty": lambda b: b"",
             "not utf-8": lambda b: b.replace(b"note", b"\xffnote", 1), "deep": lambda b: b"[" * 3000 + b"]" * 3000,
             "wrong version": lambda b: b.replace(b'"forkpoint_notes": 1', b'"forkpoint_notes": 9')}
    damaged = {}
    for key in rng.sample(keys, n // 3):
        kind = rng.choice(sorted(kinds))
        path = nt.notes_path(store, key)
        path.write_bytes(kinds[kind](path.read_bytes()))
        damaged[key] = kind
    exported = named = 0
    for fmt in ("jsonl", "csv", "html"):
        out = CliRunner().invoke(main, ["export", "--store", str(store.path), "--out", str(tmp / f"side.{fmt}")])
        exported += out.exit_code == 0 and f"{n} traces ->" in out.output
        named += all(f"{k}.json" in out.output for k in damaged)
    found = {p.stem for p, _ in verify(TraceStore(store.path)).damaged_side_files}
    report = repair(TraceStore(store.path))
    after = verify(TraceStore(store.path))
    by_kind = ", ".join(f"{sum(v == k for v in damaged.values())} {k}" for k in sorted(kinds))
    return (f"Side files: {n} traces with notes, {len(damaged)} notes files damaged ({by_kind}): {exported}/3 exports "
            f"wrote all {n} traces, {named}/3 named every damaged file; verify found {len(found & set(damaged))}/"
            f"{len(damaged)} (false alarms {len(found - set(damaged))}); repair set {len(report.set_aside)} aside, "
            f"verify ok after: {after.ok}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    logging.getLogger("core").setLevel(logging.ERROR)  # the damage is on purpose: its warnings are noise here
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name, run in [("jsonl", lambda: fuzz_jsonl(rng, tmp, args.rounds)), ("csv", lambda: fuzz_csv(rng, tmp, args.rounds)),
                          ("parquet", lambda: fuzz_parquet(rng, tmp, 4 * args.rounds)),
                          ("store", lambda: fuzz_store(rng, tmp, 200)),
                          ("report", lambda: fuzz_report_full(rng, tmp, 4 * args.rounds)),
                          ("side files", lambda: fuzz_side_files(rng, tmp, 12 * args.rounds)), ("cli", lambda: fuzz_cli(tmp))]:
            start = time.perf_counter()
            print(f"{run()}  [{time.perf_counter() - start:.1f} s]", flush=True)


if __name__ == "__main__":
    main()
