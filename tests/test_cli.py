"""The CLI through click's runner: exit codes, parsed output, and what lands in the store."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from click.testing import CliRunner

from core.cli import main
from core.io.store import TraceStore
from core.views.exports import read_jsonl

PROBLEMS = [
    {"id": "p1", "question": "Tom has 3 boxes of 4 apples. He gives away 2. How many are left?", "answer": "10"},
    {"id": "p2", "question": "What is 5 + 7?", "answer": "12"},
    {"id": "p3", "question": "Ann has 9 pens and finds 3 more. How many pens?", "answer": "12"},
    {"id": "p4", "question": "What is 6 * 2?", "answer": "12"},
]


@pytest.fixture()
def env(tmp_path, tiny_dirs):
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    pair = ["--base", str(tiny_dirs["qwen_base"]), "--reason", str(tiny_dirs["qwen_reason"]), "--device", "cpu"]
    return {"pair": pair, "store": str(tmp_path / "store"), "problems": str(problems), "tmp": tmp_path}


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_score_prints_the_top_tokens_and_stores(env):
    out = run("score", *env["pair"], "--store", env["store"], "--prompt", "What is 2+3?",
              "--response", "2+3 = 5. The answer is 5.", "--top", "3")
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["pos", "token", "cross_entropy"]
    ce = [float(line.split()[-4]) for line in lines[1:4]]
    assert ce == sorted(ce, reverse=True)
    assert len(TraceStore(env["store"]).keys()) == 1
    trace = TraceStore(env["store"]).get(TraceStore(env["store"]).keys()[0])
    out = run("score", *env["pair"], "--prompt", "What is 2+3?", "--response", "2+3 = 5. The answer is 5.",
              "--top", str(len(trace)))
    for token in trace.tokens:  # quoted as lens and takeover quote them: ' The' is not 'The', a space not blank
        assert repr(token) in out, (token, out)


def test_generate_ls_export_analyze(env):
    run("generate", *env["pair"], "--store", env["store"], "--problems", env["problems"], "--policy", "early_only",
        "--rate", "0.25", "--max-new-tokens", "8")
    store = TraceStore(env["store"])
    assert len(store.keys()) == len(PROBLEMS)
    traces = [store.get(k) for k in store.keys()]
    assert all(t.meta["policy"]["name"] == "early_only" for t in traces)
    assert all(list(t.source[:2]) == ["reason", "reason"] for t in traces)  # ceil(0.25 * 8) = 2 early takeovers
    assert all(t.meta["correct"] is not None for t in traces)  # graded against the problems' answers

    table = pd.read_csv(__import__("io").StringIO(run("ls", "--store", env["store"], "--csv")))
    assert len(table) == len(PROBLEMS) and set(table["policy"]) == {"early_only"}

    out = env["tmp"] / "all.jsonl"
    run("export", "--store", env["store"], "--format", "jsonl", "--out", str(out))
    assert sorted(t.key for t in read_jsonl(out)) == sorted(store.keys())
    # without --format the suffix decides (a .csv is a CSV, not JSONL); no suffix is a message
    run("export", "--store", env["store"], "--out", str(env["tmp"] / "all.csv"))
    assert pd.read_csv(env["tmp"] / "all.csv")["trace_key"].nunique() == len(PROBLEMS)
    bare = CliRunner().invoke(main, ["export", "--store", env["store"], "--out", str(env["tmp"] / "all")])
    assert bare.exit_code != 0 and "Cannot tell the export format" in bare.output and "--format" in bare.output
    assert "format=" not in bare.output  # the CLI's own word for it (issue 22: "give format= (CLI: --format)")
    again = CliRunner().invoke(main, ["export", "--store", env["store"], "--out", str(out)])
    assert again.exit_code != 0 and "--overwrite" in again.output and "Traceback" not in again.output

    html = env["tmp"] / "report"
    run("analyze", "--store", env["store"], "--out", str(html))
    text = (html / "report.html").read_text()
    assert "<script src=" not in text and "Plotly" in text


def test_calibrate_prints_a_gate_and_generate_guided_uses_it(env):
    gate = json.loads(run("calibrate", *env["pair"], "--store", env["store"], "--problems", env["problems"],
                          "--ratio", "0.2", "--max-new-tokens", "8").strip().splitlines()[-1])
    assert gate["lam"] > 0 and gate["window"] == 16
    run("generate", *env["pair"], "--store", env["store"], "--prompt", "What is 5 + 7?", "--policy", "guided",
        "--tau", str(gate["tau"]), "--lam", str(gate["lam"]), "--budget", "0.2", "--max-new-tokens", "8")
    store = TraceStore(env["store"])
    guided = [store.get(k) for k in store.keys() if store.get(k).meta["policy"]["name"] == "guided"]
    assert len(guided) == 1 and guided[0].meta["policy"]["params"]["tau"] == pytest.approx(gate["tau"])


def test_import_reports_bad_lines_and_scores_the_rest(env):
    src = env["tmp"] / "foreign.jsonl"
    src.write_text(json.dumps({"id": "a", "prompt": "What is 2+3?", "response": "5"}) + "\n" + "{not json\n")
    out = json.loads(run("import", *env["pair"], "--store", env["store"], str(src)).strip().splitlines()[-1])
    assert out["stored"] == 1 and out["errors"][0]["line"] == 2


def test_eval_table_has_every_policy(env):
    out = env["tmp"] / "eval.csv"
    text = run("eval", *env["pair"], "--store", env["store"], "--problems", env["problems"], "--ratios", "0.2",
               "--max-new-tokens", "6", "--out", str(out))
    table = pd.read_csv(out)
    assert {"base", "reason", "guided (r=0.2)"} <= set(table["policy"])
    assert "| policy |" in text and out.with_suffix(".html").exists()


def test_eval_out_refuses_a_file_it_did_not_write_and_a_rerun_into_its_own_output_resumes(env):
    """eval --out follows the --overwrite convention of export, tokens and analyze: an existing file that eval
    did not write (the CSV, or the .md / .html beside it) is refused untouched, before any trace is made; a
    rerun into eval's own output is a resume and rewrites it; --overwrite replaces a foreign file."""
    args = ["eval", *env["pair"], "--store", env["store"], "--problems", env["problems"], "--ratios", "0.2",
            "--max-new-tokens", "6", "--no-entropy-gated"]
    foreign = env["tmp"] / "notes.csv"
    foreign.write_text("my notes\n")
    refused = CliRunner().invoke(main, [*args, "--out", str(foreign)])
    assert refused.exit_code == 1 and "Traceback" not in refused.output, refused.output
    assert f"{foreign} exists and is not `forkpoint eval` output; pass --overwrite" in refused.output
    assert foreign.read_text() == "my notes\n" and TraceStore(env["store"]).keys() == []
    plot = env["tmp"] / "mine.html"  # the recovery plot of --out mine.csv would replace it
    plot.write_text("<p>mine</p>")
    refused = CliRunner().invoke(main, [*args, "--out", str(env["tmp"] / "mine.csv")])
    assert refused.exit_code == 1 and f"{plot} exists" in refused.output and "--overwrite" in refused.output
    assert plot.read_text() == "<p>mine</p>" and not (env["tmp"] / "mine.csv").exists()

    out = env["tmp"] / "eval.csv"
    run(*args, "--out", str(out))
    first = pd.read_csv(out)
    (out.with_suffix(".md")).write_text("stale")
    run(*args, "--out", str(out))  # a resumed run: every trace read back from the store, its own files rewritten
    pd.testing.assert_frame_equal(pd.read_csv(out), first)
    assert out.with_suffix(".md").read_text().startswith("| policy |")
    run(*args, "--out", str(foreign), "--overwrite")
    pd.testing.assert_frame_equal(pd.read_csv(foreign), first)


def test_generate_eval_and_gates_calibrate_on_the_first_calibration_problems_of_a_source(env):
    """One count of calibration problems, the setting (--calibration-problems): generate, eval and gates take the
    first N of --calibration SOURCE (eval and gates used every problem of it, and a quarter of --problems)."""
    calib = env["tmp"] / "calib.jsonl"
    calib.write_text("".join(json.dumps({"id": f"c{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)})
                             + "\n" for i in range(1, 6)))
    asked = {f"What is {i} + {i}?" for i in range(1, 6)}
    common = [*env["pair"], "--problems", env["problems"], "--calibration", str(calib), "--calibration-problems", "2",
              "--max-new-tokens", "6"]
    runs = {"generate": ["--policy", "guided"], "eval": ["--ratios", "0.2", "--no-entropy-gated"],
            "gates": ["--gates", "guided", "--gate-rhos", "0.2", "--out", str(env["tmp"] / "gates")]}
    for command, args in runs.items():
        store = env["tmp"] / f"store-{command}"
        run(command, "--store", str(store), *common, *args)
        made = TraceStore(store)  # the calibration's rollouts sit in its calibration store
        prompts = [t.meta["problem"]["prompt"] for t in made.calibration_store().load_all()[0]]
        calibrated = {p for p in prompts if p in asked}
        assert not asked & {t.meta["problem"]["prompt"] for t in made.load_all()[0]}
        assert calibrated == {"What is 1 + 1?", "What is 2 + 2?"}, (command, calibrated)
    held = CliRunner().invoke(main, ["eval", *env["pair"], "--store", str(env["tmp"] / "held"), "--problems",
                                     env["problems"], "--calibration-problems", "1", "--ratios", "0.2",
                                     "--max-new-tokens", "6", "--no-entropy-gated"], catch_exceptions=False)
    assert held.exit_code == 0 and "holding out 1 problems for calibration; evaluating the other 3" in held.output


def test_generate_on_the_demo_pair_asks_by_default_for_what_fits_its_context(tmp_path, caplog):
    """`forkpoint generate` on the demo pair (context 192 tokens) asked for 256 new tokens by default and warned
    for both models that they exceed the context; its default is now half the context (96), without a warning,
    while an explicit --max-new-tokens past the context is still warned about."""
    import logging

    store = tmp_path / "store"
    with caplog.at_level(logging.WARNING, logger="core.pair.loading"):
        run("generate", "--store", str(store), "--limit", "1")
    assert [r.getMessage() for r in caplog.records if "exceeds" in r.getMessage()] == []
    (trace,), _ = TraceStore(store).load_all()
    assert trace.meta["sampling"]["max_new_tokens"] == 96 and trace.meta["correct"] is not None
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="core.pair.loading"):
        run("generate", "--store", str(store), "--limit", "1", "--max-new-tokens", "256")
    said = [r for r in caplog.records if "exceeds" in r.getMessage()]
    assert sorted(r.args[2] for r in said) == ["base", "reason"] and {r.args[1] for r in said} == {256}


def test_user_errors_are_messages_not_tracebacks(env, tmp_path):
    result = CliRunner().invoke(main, ["score", "--base", str(tmp_path / "nope"), "--reason", str(tmp_path / "nope"),
                                       "--prompt", "x", "--response", "y"])
    assert result.exit_code != 0 and "does not exist" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(main, ["score", "--base", "x", "--prompt", "x", "--response", "y"])
    assert result.exit_code == 2 and "both --base and --reason" in result.output
    (tmp_path / "folder").mkdir()  # a folder that is not a model: the whole reason, not its first line
    folder = str(tmp_path / "folder")
    result = CliRunner().invoke(main, ["score", "--base", folder, "--reason", folder, "--prompt", "x", "--response", "y"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "--base: Could not load" in result.output and "it has no config.json and no tokenizer file" in result.output


# -- policies from the registry (H1) ------------------------------------------------------------------


def test_generate_guided_honours_score_budget_and_calibration(env):
    """--score reaches both the calibration and the policy; without --tau the gate is calibrated on held-out
    problems (the first of --problems, not generated)."""
    out = run("generate", *env["pair"], "--store", env["store"], "--problems", env["problems"], "--policy", "guided",
              "--score", "jsd", "--ratio", "0.3", "--calibration-problems", "2", "--budget", "0.25",
              "--max-new-tokens", "8")
    assert "holding out" in out
    store = TraceStore(env["store"])
    guided = [store.get(k) for k in store.keys()]  # the calibration's rollouts are kept apart from them
    rollouts = store.calibration_store()
    base = [rollouts.get(k) for k in rollouts.keys()]
    held = min(2, len(PROBLEMS) // 4 or 1)  # split_calibration: at most a quarter, at least one
    assert {t.meta["policy"]["name"] for t in guided} == {"guided"}
    assert {t.meta["policy"]["name"] for t in base} == {"base_only"}
    assert len(base) == held and len(guided) == len(PROBLEMS) - held  # held out: calibrated on, not generated
    assert not {t.meta["problem"]["prompt"] for t in base} & {t.meta["problem"]["prompt"] for t in guided}
    params = guided[0].meta["policy"]["params"]
    assert params["score"] == "jsd" and params["budget"] == 0.25 and params["max_takeovers"] is None
    from core.annotate.spikes import calibrate_gate
    from core.scoring.registry import score_values

    expect = calibrate_gate([score_values(t.metrics, "jsd") for t in base], 0.3, 16)
    assert params["tau"] == pytest.approx(expect.tau) and params["lam"] == pytest.approx(expect.lam)
    assert all(t.n_takeovers <= 2 for t in guided)  # ceil(0.25 · 8)


def test_generate_says_when_a_policy_did_nothing(env):
    result = CliRunner().invoke(main, ["generate", *env["pair"], "--store", env["store"], "--prompt", "What is 5 + 7?",
                                       "--policy", "entropy_gated", "--threshold", "50", "--max-new-tokens", "4"])
    assert result.exit_code == 0, result.output
    assert "EntropyGated made 0 takeovers" in result.output and "threshold=50" in result.output
    assert "(0 takeovers)" in result.output


def test_score_ranks_delta_logp_by_its_sign(env):
    """As a score delta_logp is used negated: the top rows are the most negative log-prob gains."""
    out = run("score", *env["pair"], "--prompt", "What is 2+3?", "--response", "2+3 = 5. The answer is 5.",
              "--top", "4", "--score", "delta_logp")
    lines = out.strip().splitlines()
    assert lines[0].split()[2] == "delta_logp"
    values = [float(line.split()[-4]) for line in lines[1:5]]  # columns from the right: tokens may hold spaces
    assert len(values) == 4 and values == sorted(values)  # ascending raw value = descending score


# -- every option checked before any model loads (issue 24.4-7, 24.12; issue 20) ------------------------


@pytest.fixture()
def no_models(monkeypatch):
    """Fail loudly if a command loads a model pair (the checks must come first)."""
    import core.cli.common as common
    import core.cli.evaluation as evaluation
    import core.cli.gates as gates_cli
    import core.cli.store as store_cli
    import core.cli.traces as traces

    def loaded(*args, **kwargs):
        raise AssertionError("a model pair was loaded before the options were checked")

    for mod in (common, traces, store_cli, evaluation, gates_cli):
        for name in ("pair_from_options", "pair_or_spec"):
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, loaded)


def _bad_inputs(tmp):
    src = tmp / "f.jsonl"
    src.write_text('{"id": "a", "prompt": "p", "response": "r"}\n')
    rep = ["reproduce", "--problems", str(src), "--out", str(tmp / "rep")]
    return [
        (["generate", "--prompt", ""], "--prompt"), (["generate", "--prompt", "  \n"], "--prompt"),
        (["generate", "--limit", "-3"], "--limit"), (["generate", "--top-p", "0"], "--top-p"),
        (["generate", "--top-p", "5"], "--top-p"), (["generate", "--dtype", "float8"], "--dtype"),
        (["generate", "--store", "/proc/x"], "--store"), (["generate", "--ratio", "1"], "--ratio"),
        (["generate", "--device", "gpu7"], "--device"),
        (["generate", "--policy", "guided", "--tau", "0.1"], "--lam"), (["generate", "--policy", "guided", "--lam", "2"], "--tau"), (["score", "--prompt", "x", "--response", "y", "--device", "cuda:x"], "--device"),
        (["score", "--prompt", "x", "--response", ""], "--response"), (["score", "--prompt", " ", "--response", "y"], "--prompt"),
        (["score", "--prompt", "x", "--response", "y", "--dtype", "float8"], "--dtype"),
        (["calibrate", "--ratio", "0"], "--ratio"), (["calibrate", "--window", "0"], "--window"),
        (["eval", "--limit", "-3"], "--limit"), (["eval", "--limit", "0"], "--limit"),
        (["eval", "--ratios="], "--ratios"), (["eval", "--ratios", "5"], "--ratios"),
        (["eval", "--ratios", "0.1,x"], "--ratios"), (["eval", "--ratios", "1"], "--ratios"),
        (["eval", "--window", "0"], "--window"), (["eval", "--samples", "0"], "--samples"),
        (["eval", "--temperature", "-1"], "--temperature"), (["eval", "--top-p", "1.5"], "--top-p"),
        (["eval", "--max-new-tokens", "0"], "--max-new-tokens"), (["eval", "--shard", "4/4"], "--shard"),
        (["eval", "--shard", "x"], "--shard"), (["eval", "--budgets", "2"], "--budgets"),
        (["eval", "--out", "/proc/x/t.csv"], "--out"), (["eval", "--dtype", "int4"], "--dtype"),
        (["eval", "--out", str(tmp / "missing_dir" / "t.csv")], "--out"),
        (["eval", "--out", str(tmp / "t.md")], "--out"), (["eval", "--out", str(tmp / "t.html")], "--out"),
        ([*rep, "--top-p", "5"], "--top-p"), ([*rep, "--ratios", "1"], "--ratios"), ([*rep, "--limit", "0"], "--limit"),
        ([*rep, "--samples", "0"], "--samples"), ([*rep, "--window", "0"], "--window"),
        (["reproduce", "--problems", str(src), "--out", "/proc/x"], "--out"),
        (["analyze", "--out", "/proc/x"], "--out"),
        (["export", "--out", str(tmp / "missing_dir" / "x.jsonl")], "--out"),
        (["export", "--out", "/proc/x.jsonl"], "--out"),
        (["import", str(src), "--report", "/proc/x"], "--report"),
        (["import", str(src), "--store", "/proc/x"], "--store"),
        (["demo", "measure", "--limit", "0"], "--limit"),
        (["demo", "measure", "--n", "0"], "--limit"),  # an old spelling still checked, named as the new one
        (["gates", "--ratios", "5", "--out", str(tmp / "g")], "--gate-rhos"), (["app", "--max-new-tokens", "0"], "--max-new-tokens"),
    ]  # fmt: skip


def test_bad_options_are_refused_before_any_model_loads_naming_the_flag(tmp_path, no_models):
    store = tmp_path / "store"
    store.mkdir()
    cases = _bad_inputs(tmp_path)
    for args, flag in cases:
        if args[0] not in ("demo", "app", "reproduce") and "--store" not in args:
            args = [*args, "--store", str(store)]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (args, result.output, result.exception)
        assert flag in result.output and "Traceback" not in result.output, (args, result.output)
    assert list(store.iterdir()) == [] and not (tmp_path / "missing_dir").exists()
    assert len(cases) >= 40


def _commands(group, prefix=""):
    import click

    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, prefix + name + " ")
        else:
            yield prefix + name, cmd


def test_every_float_option_refuses_nan_and_infinities_before_any_model_loads(tmp_path, no_models):
    """Issue 33.3: NaN passes every range comparison and ±inf every one-sided range; every float option of
    every command (settings, policy parameters, --sample-temperature, ...) refuses them, exit 2, naming it."""
    import click

    store = tmp_path / "store"
    store.mkdir()
    checked = []
    for name, cmd in _commands(main):
        for opt in cmd.params:
            if not isinstance(opt, click.Option) or not isinstance(opt.type, click.FloatRange | type(click.FLOAT)):
                continue
            flag = max(opt.opts, key=len)
            for bad in ("nan", "inf", "-inf", "NaN"):
                args = [*name.split(), flag, bad] + (["--store", str(store)] if any(
                    "--store" in o.opts for o in cmd.params if isinstance(o, click.Option)) else [])
                result = CliRunner().invoke(main, args)
                assert result.exit_code == 2, (args, result.output, result.exception)
                assert flag in result.output and "finite" in result.output, (args, result.output)
            checked.append(f"{name} {flag}")
    assert {"generate --temperature", "generate --ratio", "generate --tau", "generate --lam", "eval --temperature",
            "effects --sample-temperature", "curve --sample-temperature", "takeover --sample-temperature"} <= set(checked), checked
    for listed in ("--ratios", "--budgets"):  # comma-separated float lists go through the settings table's check
        result = CliRunner().invoke(main, ["eval", listed, "0.1,nan", "--store", str(store)])
        assert result.exit_code == 2 and listed in result.output, result.output
        result = CliRunner().invoke(main, ["eval", listed, "inf", "--store", str(store)])
        assert result.exit_code == 2 and listed in result.output, result.output
    assert list(store.iterdir()) == []


# one spelling per concept in every command that has it (dest -> flag), and the older spellings still read
SPELLINGS = {"sample_temperature": "--sample-temperature", "calibration": "--calibration", "gate_rhos": "--gate-rhos",
             "router_path": "--router", "path": "--router"}
OLD_SPELLINGS = [  # (command, arguments with an old spelling, dest, value read, the old flag)
    ("takeover", ["KEY", "--at", "1=reason", "--temperature", "0.9"], "sample_temperature", 0.9, "--temperature"),
    ("generate", ["--calibrate-on", "in-sample"], "calibration", "in-sample", "--calibrate-on"),
    ("gates", ["--ratios", "0.1", "--out", "OUT"], "gate_rhos", "0.1", "--ratios"),
    ("generate", ["--path", "DIR"], "path", "DIR", "--path"),
    ("effects", ["--path", "DIR"], "path", "DIR", "--path"),
    ("demo measure", ["--n", "3"], "n", 3, "--n"),
]


def test_one_spelling_per_concept_with_the_old_spellings_hidden_but_working():
    """The audit's duplicates (--temperature / --sample-temperature for a stored trace's children, --calibrate-on /
    --calibration, gates --ratios / reproduce --gate-rhos, --path / --router, demo measure --n / --limit): one
    spelling in every command, the old one still parsed into the same value and shown nowhere in --help."""
    import click

    found = {}
    for name, cmd in _commands(main):
        for opt in cmd.params:
            if isinstance(opt, click.Option) and opt.name in SPELLINGS:
                assert opt.opts[0] == SPELLINGS[opt.name], (name, opt.opts)
                found.setdefault(SPELLINGS[opt.name], set()).add(name)
    assert found == {"--sample-temperature": {"takeover", "curve", "effects"},
                     "--calibration": {"generate", "eval", "gates", "reproduce"},
                     "--gate-rhos": {"gates", "reproduce"}, "--router": {"generate", "effects", "gates", "reproduce"}}
    commands = dict(_commands(main))
    assert [o.opts for o in commands["demo measure"].params if o.name == "n"] == [["--limit", "--n"]]
    for name, args, dest, value, old in OLD_SPELLINGS:
        cmd = commands[name]
        ctx = cmd.make_context(name, list(args))
        assert ctx.params[dest] == value, (name, args, ctx.params[dest])
        shown = cmd.get_help(ctx)
        assert not re.search(rf"(?<![\w-]){re.escape(old)}(?![\w-])", shown), (name, old)


def test_every_command_takes_its_defaults_and_ranges_from_the_settings_table():
    """Issue 20: an option named like a setting has the setting's default (or None, for preset-filled
    options) and exactly its range, in every command."""
    import click

    from core import settings

    def commands(group, prefix=""):
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                yield from commands(cmd, prefix + name + " ")
            else:
                yield prefix + name, cmd

    checked = set()
    for name, cmd in commands(main):
        for opt in cmd.params:
            row = settings.SETTINGS.get(opt.name or "")
            if name in ("demo measure", "effects", "curve"):  # their --n / --samples are rows of their own
                own = {"demo measure": "demo_measure_", "effects": "effect_", "curve": "effect_"}[name]
                row = settings.SETTINGS.get(own + {"n": "problems"}.get(opt.name, opt.name))
                if row is None:
                    continue
            elif row is None or opt.opts != [row.flag] or isinstance(row.value, tuple):
                continue
            assert opt.default in (row.value, None), (name, opt.name)
            if row.choices:
                assert list(opt.type.choices) == list(row.choices), (name, opt.name)
            elif row.low is not None and opt.name not in ("seed", "score"):
                t = opt.type
                assert (t.min, t.max, t.min_open, t.max_open) == (row.low, row.high, row.open_low, row.open_high), \
                    (name, opt.name)
            checked.add((name, opt.name))
    for must in [("eval", "top_p"), ("eval", "window"), ("reproduce", "top_p"), ("reproduce", "batch_size"),
                 ("generate", "top_p"), ("app", "max_new_tokens"), ("score", "dtype"), ("demo train", "seed"),
                 ("demo measure", "n")]:
        assert must in checked, must
    def defaults(dest):
        return {name: next(o.default for o in cmd.params if o.name == dest) for name, cmd in commands(main)
                if any(o.name == dest for o in cmd.params)}

    assert defaults("ratios") == {"eval": str(settings.RATIO), "reproduce": ",".join(map(str, settings.RATIOS))}
    assert defaults("gate_rhos") == {"gates": ",".join(map(str, settings.GATE_RHOS)), "reproduce": None}
    top_p = settings.SETTINGS["top_p"]
    assert top_p.range_text() == "in (0, 1]" and top_p.check(1.0) == 1.0
    for bad in (0.0, 1.5, float("nan"), "x", True):
        with pytest.raises(ValueError, match="--top-p must be"):
            top_p.check(bad)


def test_export_into_a_missing_folder_needs_parents(env, tmp_path):
    store = TraceStore(env["store"])
    from fakes import make_trace

    store.put(make_trace(10, seed=1))
    out = tmp_path / "new" / "deeper" / "x.jsonl"
    refused = CliRunner().invoke(main, ["export", "--store", env["store"], "--out", str(out)])
    assert refused.exit_code == 2 and "does not exist" in refused.output and "--parents" in refused.output
    run("export", "--store", env["store"], "--out", str(out), "--parents")
    assert len(read_jsonl(out)) == 1


def test_errors_start_on_a_clean_line_and_the_generate_bar_counts_traces(env, monkeypatch):
    import re

    import core.cli.traces as traces
    import core.decoding
    from core.errors import StoreError

    monkeypatch.setattr(traces, "pair_or_spec", lambda opts, executor: "PAIR")

    def fails_midway(pair, problems, policy, progress=None, **kwargs):
        progress(1, len(problems))
        raise StoreError("the store went away")

    monkeypatch.setattr(core.decoding, "generate_many", fails_midway)
    result = CliRunner().invoke(main, ["generate", "--store", env["store"], "--problems", env["problems"]])
    assert result.exit_code == 1 and "trace" in result.stderr and "tok" not in result.stderr
    assert re.search(r"(^|[\r\n])Error: the store went away", result.stderr), repr(result.stderr)


def test_ls_counts_the_spikes_the_app_marks(tmp_path):
    """Issue 22.4: `ls` n_spikes is the app's default spike rule applied to the trace (one computation)."""
    import io

    from fakes import make_trace

    from app.view import SpikeRule, annotate_view

    store = TraceStore(tmp_path / "s")
    traces = [make_trace(n, seed=s) for s, n in enumerate((40, 150, 333))]
    for t in traces:
        store.put(t)
    table = pd.read_csv(io.StringIO(run("ls", "--store", str(tmp_path / "s"), "--csv"))).set_index("key")
    shown = {t.key: len(annotate_view(t, rule=SpikeRule()).annotations["spikes"]["positions"]) for t in traces}
    assert {k: int(table.loc[k, "n_spikes"]) for k in shown} == shown and all(v > 0 for v in shown.values())
    assert SpikeRule().top == __import__("core").settings.SPIKE_TOP


def test_takeover_refuses_two_switches_at_one_position(tmp_path):
    """`--at 12=reason,12=base` contradicts itself: a usage error naming --at and 12 (it was "no change", rc 0)."""
    result = CliRunner().invoke(main, ["takeover", "0" * 16, "--store", str(tmp_path), "--at", "12=reason,12=base"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "Invalid value for --at: position 12 is given twice ('12=reason' and '12=base')" in result.output


def test_takeover_switches_a_stored_trace_and_prints_the_child(env):
    """`forkpoint takeover KEY --at 3=reason,5=base`: the child is stored, graded and printed."""
    import re

    import click

    from core.cli.traces import parse_switches

    assert parse_switches("3=reason, 5=base,7=42,9='x y'") == {3: "reason", 5: "base", 7: 42, 9: "x y"}
    for bad in ("3", "x=reason", "3=maybe", "", "3=", "3=reason,3=base", "3=reason,3=reason"):
        with pytest.raises(click.BadParameter) as err:
            parse_switches(bad)
        assert err.value.param_hint == "--at"
    run("generate", *env["pair"], "--store", env["store"], "--problems", env["problems"], "--limit", "1",
        "--max-new-tokens", "10")
    store = TraceStore(env["store"])
    key = store.keys()[0]
    out = run("takeover", key, "--store", env["store"], "--at", "3=reason,5=base", *env["pair"])
    child = store.get(re.search(r"key ([0-9a-f]+)", out).group(1))
    assert child.meta["switches"] == {"3": "reason", "5": "base"} and child.meta["parent"] == key
    assert child.source[3] == "reason" and child.source[5] == "base"
    assert child.meta["correct"] is not None and "#3 reasoner" in out
    bad = CliRunner().invoke(main, ["takeover", key, "--store", env["store"], "--at", "3=perhaps", *env["pair"]])
    assert bad.exit_code == 2 and "--at" in bad.output
    # typed text: forced tokens, no takeover; a fan of sampled children, each graded and stored
    out = run("takeover", key, "--store", env["store"], "--at", "2=' and so'", "--then", "base", *env["pair"])
    typed = store.get(re.search(r"key ([0-9a-f]+)", out).group(1))
    assert {str(s) for s in typed.source[2:]} <= {"forced", "base"} and str(typed.source[2]) == "forced"
    assert typed.n_takeovers == 0 and "0 takeovers" in out and "forced" in out
    out = run("takeover", key, "--store", env["store"], "--at", "4=reason", "--samples", "3", "--sample-temperature", "0.9",
              *env["pair"])
    keys = re.findall(r"key ([0-9a-f]+)  parent", out)
    assert len(keys) + out.count("no change") == 3 and len(set(keys)) == len(keys)
    assert all(store.get(k).meta["sampling"]["temperature"] == 0.9 and store.get(k).meta["correct"] is not None
               for k in keys)
    bad = CliRunner().invoke(main, ["takeover", key, "--store", env["store"], "--at", "4=reason", "--samples", "0",
                                    *env["pair"]])
    assert bad.exit_code == 2 and "--samples" in bad.output


_MODULES_AFTER = ("import json, sys; from core.cli import main\n"
                  "try:\n    main(sys.argv[1:], standalone_mode=False)\nfinally:\n"
                  "    print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers'})))")


def test_file_only_commands_start_without_the_model_stack(env):
    """`ls` and `export` read files: neither torch nor transformers may load (issue 22: 2-4 s of imports)."""
    import subprocess
    import sys

    run("score", *env["pair"], "--store", env["store"], "--prompt", "What is 2+3?", "--response", "2+3 = 5.")
    for args in (["ls", "--store", env["store"]],
                 ["export", "--store", env["store"], "--out", str(env["tmp"] / "one.jsonl")],
                 ["export", "--store", env["store"], "--out", str(env["tmp"] / "one.html")]):
        out = subprocess.run([sys.executable, "-c", _MODULES_AFTER, *args], capture_output=True, text=True,
                             timeout=300, check=True)
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [], (args, out.stdout[-500:])
    assert len(read_jsonl(env["tmp"] / "one.jsonl")) == 1


def test_exporting_a_generated_trace_loads_no_tagger(env):
    """A generated trace is stored with its planning tags (graded and tagged), so `export` to HTML or JSONL
    reads them back: spaCy (≈0.5 s of a one-trace export) never loads, and the tags are the tagger's."""
    import subprocess
    import sys

    from core.annotate.planning import tag_planning

    run("generate", *env["pair"], "--store", env["store"], "--problems", env["problems"], "--limit", "1",
        "--max-new-tokens", "12")
    store = TraceStore(env["store"])
    trace = store.get(store.keys()[0])
    assert trace.annotations["tags"] == tag_planning(trace) and trace.annotations["tags_by"]
    snippet = _MODULES_AFTER.replace("{'torch', 'transformers'}", "{'spacy', 'torch', 'thinc'}")
    for name in ("one.html", "one.jsonl"):
        out = subprocess.run([sys.executable, "-c", snippet, "export", "--store", env["store"], "--out",
                              str(env["tmp"] / name)], capture_output=True, text=True, timeout=300, check=True)
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [], (name, out.stdout[-500:])
    assert read_jsonl(env["tmp"] / "one.jsonl")[0].annotations["tags"] == trace.annotations["tags"]


def test_export_token_strings_match_the_tokenizer(env, tiny_dirs):
    """Without transformers the export decodes top-k ids exactly as AutoTokenizer does."""
    from transformers import AutoTokenizer

    from core.views.exports import token_decoder

    run("score", *env["pair"], "--store", env["store"], "--prompt", "What is 2+3?", "--response", "2+3 = 5. ✓ é")
    store = TraceStore(env["store"])
    trace = store.get(store.keys()[0])
    decode = token_decoder([trace])
    tok = AutoTokenizer.from_pretrained(str(tiny_dirs["qwen_base"]))
    ids = sorted(set(trace.token_ids.tolist()) | set(range(0, min(tok.vocab_size, 300))))
    assert [decode(i) for i in ids] == [tok.decode([i], skip_special_tokens=False,
                                                   clean_up_tokenization_spaces=False) for i in ids]


def test_search_finds_a_string_in_every_trace(env):
    run("score", *env["pair"], "--store", env["store"], "--prompt", "What is 2+3?", "--response", "2+3 = 5. So 5.")
    run("score", *env["pair"], "--store", env["store"], "--prompt", "What is 1+4?", "--response", "It is 5.")
    table = pd.read_csv(__import__("io").StringIO(run("search", "5", "--store", env["store"], "--csv")))
    assert table["key"].nunique() == 2 and len(table) == 3
    assert {"pos", "score", "spike", "correct"} <= set(table.columns)
    out = run("search", r"\d\.", "--regex", "--store", env["store"])
    assert "3 matches in 2 of 2 traces" in out
    bad = CliRunner().invoke(main, ["search", "(", "--regex", "--store", env["store"]])
    assert bad.exit_code != 0 and "not a valid regular expression" in bad.output and "Traceback" not in bad.output


def test_export_of_given_keys_skips_the_unreadable_names_each_and_exits_1(tmp_path):
    """As the full export: the readable traces are written and every damaged or unknown key is named; the exit
    code is 1 so scripts notice (it stopped at the first damaged key, with nothing written)."""
    from tests.fakes import make_trace

    store = TraceStore(tmp_path / "store")
    keys = [store.put(make_trace(n_tokens=6, seed=s)) for s in range(3)]
    damaged = store.traces_dir / f"{keys[1]}.parquet"
    damaged.write_bytes(damaged.read_bytes()[:100])
    out = tmp_path / "some.jsonl"
    result = CliRunner().invoke(main, ["export", "--store", str(store.path), "--out", str(out), keys[0], keys[1],
                                       "feedfacefeedface", keys[2]])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert sorted(t.key for t in read_jsonl(out)) == sorted([keys[0], keys[2]])
    assert f"{keys[1]}.parquet:" in result.output and "feedfacefeedface.parquet: No trace with key" in result.output
    assert "2 traces ->" in result.output and "2 unreadable skipped" in result.output
    none = CliRunner().invoke(main, ["export", "--store", str(store.path), "--out", str(tmp_path / "none.jsonl"),
                                     keys[1]])
    assert none.exit_code == 1 and "nothing written" in none.output and not (tmp_path / "none.jsonl").exists()


def _help(*names: str) -> str:
    return CliRunner().invoke(main, [*names, "--help"], terminal_width=2000).output


def test_help_texts_say_true_things():
    """Every option has a help text; no bogus range (x<=None) for an unbounded number; a setting-backed policy
    option is not claimed by those policies alone; numbers come from the settings table, not literals."""
    import click

    from core import settings

    for name, cmd in _commands(main):
        text = _help(*name.split())
        assert "None]" not in text and "None;" not in text, name
        for opt in cmd.params:
            assert not isinstance(opt, click.Option) or opt.help, (name, opt.opts)
    generate = _help("generate")
    assert "Gate absolute threshold τ (set by calibration). (default: calibrated on the problems) [Guided]\n" \
        in generate  # no [x<=None]
    assert "Seed of the sampling streams (draws keyed by seed, sample and position). [also read by: RandomPositions, " \
           "EarlyOnly]" in generate
    assert "quantile of base-rollout scores. [also read by: Guided, Router]" in generate  # Guided's calibration
    assert f"else its top {settings.SPIKE_TOP:.0%} by --score" in _help("search") and "5%" not in _help("search")
    router = _help("router", "train")
    assert "sampling streams" not in router and "Seed of the held-out split" in router
    overwrite = {name: next(o.help for o in cmd.params if o.name == "overwrite")
                 for name, cmd in _commands(main) if any(o.name == "overwrite" for o in cmd.params)}
    assert set(overwrite) >= {"export", "tokens", "effects", "router train", "analyze"}
    assert overwrite["export"] == "Replace --out when it exists." and all(h.startswith("Replace ") for h in overwrite.values())


def test_progress_bars_do_not_flood_a_log(env):
    """stderr that is not a terminal (CliRunner's, a redirected log): a bar prints when it starts and when it ends
    (and at most every LOG_INTERVAL_S between), not on every update as it did (303 of 431 lines of one log)."""
    import re

    result = CliRunner().invoke(main, ["generate", *env["pair"], "--store", env["store"], "--problems",
                                       env["problems"], "--policy", "early_only", "--max-new-tokens", "4",
                                       "--batch-size", "1"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    shown = [part for part in re.split(r"[\r\n]", result.stderr) if "trace/s" in part]
    assert len(shown) <= 2, shown  # a start and an end line, not one per trace
    assert shown[-1].startswith("generate early_only: 100%") and f"{len(PROBLEMS)}/{len(PROBLEMS)}" in shown[-1]
    import click

    from core.cli.common import StageBars

    @click.command()
    def staged() -> None:
        bars = StageBars()
        for stage in ("calibrate", "guided"):
            for done in range(51):
                bars(stage, done, 50)
        bars.close()

    shown = [p for p in re.split(r"[\r\n]", CliRunner().invoke(staged, []).stderr) if "problem" in p]
    assert len(shown) <= 4 and [p.split(":")[0] for p in shown[1::2]] == ["calibrate", "guided"], shown
