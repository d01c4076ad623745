"""The registries drive the edges: the CLI's choices and options equal the policy and metric registries,
every declaration is complete and in range, and `make_policy` is the one constructor (records round-trip)."""

from __future__ import annotations

import functools

import json
import math
import re
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import core
from core import settings
from core.annotate.spikes import Gate
from core.cli import main
from core.cli.options import PARAM_FLAGS, param_flag
from core.decoding.policies import (
    POLICIES,
    Param,
    Policy,
    list_policies,
    make_policy,
    policy_from_record,
    policy_spec,
    register_policy,
)
from core.scoring.registry import (
    GATE_SCORES,
    INT_METRICS,
    METRICS,
    SCORES,
    list_metrics,
    score_values,
)

ROOT = Path(__file__).resolve().parents[1]


def _option(command: str, dest: str) -> click.Option:
    params = {p.name: p for p in main.commands[command].params}
    assert dest in params, f"`forkpoint {command}` has no option for {dest!r}"
    return params[dest]


# -- policies ---------------------------------------------------------------------------------------


def test_cli_policy_choices_are_the_registry() -> None:
    assert list(_option("generate", "policy_name").type.choices) == [s.name for s in list_policies()]
    assert "forced" not in [s.name for s in list_policies()]  # internal: built by branch/force actions
    assert [s.name for s in list_policies(include_internal=True)] == list(POLICIES)


def test_cli_has_one_option_per_declared_parameter_with_its_range() -> None:
    for spec in list_policies():
        for p in spec.params:
            opt = _option("generate", p.name)
            own = "--" + p.name.replace("_", "-")  # the parameter's name; PARAM_FLAGS gives a concept's one spelling
            assert opt.opts == ([param_flag(p.name), own] if p.name in PARAM_FLAGS else [own])
            if p.choices:
                assert list(opt.type.choices) == list(p.choices)
            elif p.kind in (int, float) and (p.low is not None or p.high is not None):
                assert (opt.type.min, opt.type.max) == (p.low, p.high), p.name
            if p.name in settings.SETTINGS:
                assert opt.default == settings.SETTINGS[p.name].value  # one option, the setting's default
            elif p.optional or p.from_gate:
                assert opt.default is None
            else:
                assert opt.default == p.default


def test_cli_defaults_come_from_settings() -> None:
    checked = 0
    for name, command in main.commands.items():
        for opt in command.params:
            row = settings.SETTINGS.get(opt.name or "")
            if name in ("generate", "calibrate", "score") and row is not None and opt.opts == [row.flag]:
                assert opt.default == row.value, (name, opt.name)
                checked += 1
    assert checked >= 10


def test_every_parameter_is_declared_completely() -> None:
    for spec in list_policies(include_internal=True):
        assert spec.label and spec.help and spec.help.strip() == spec.help and "\n" not in spec.help, spec.name
        assert spec.cls.name == spec.name and POLICIES[spec.name] is spec.cls
        for p in spec.params:
            assert p.help.strip(), (spec.name, p.name)
            assert p.kind in (int, float, str, dict)
            if p.low is not None and p.high is not None:
                assert p.low <= p.high
            if p.default is None:
                assert p.optional, (spec.name, p.name)
            else:
                assert p.check(p.default, spec.name) == p.default  # the default is within the declared range
            assert getattr(spec.cls(**({"tau": 0.0} if spec.needs_gate else {})), p.name) == p.default or p.from_gate
    assert policy_spec("guided").needs_gate and policy_spec("guided").calibration == ("ratio", "window")
    assert all(name in settings.SETTINGS for s in list_policies() for name in s.calibration)
    assert {p.name for p in policy_spec("guided").user_params} == {"budget", "score", "max_takeovers", "skip_first"}


@functools.lru_cache(maxsize=1)
def _router_folder() -> tuple[str, str]:
    """(folder, weights hash) of a small router written once (the router policy's free-text `path` needs one)."""
    import tempfile

    import numpy as np

    from core.decoding.router import RouterNet, save_router

    folder = tempfile.mkdtemp(prefix="router-")
    net = RouterNet({"mean": np.zeros(3), "scale": np.ones(3), "w0": np.ones((1, 3)), "b0": np.zeros(1)})
    card = save_router(folder, net, {"n_features": 3, "hidden": 0, "pair": "x", "thresholds": {"0.05": 0.5}})
    return folder, card["weights_sha256"]


def _value_in(p: Param, u: float) -> object:
    """A valid, non-default value of `p` picked by u in [0, 1)."""
    if p.kind is str and not p.choices:  # free text: the router's folder and its weights' hash
        return _router_folder()[0 if p.name == "path" else 1]
    if p.kind is str:
        return p.choices[int(u * len(p.choices))]
    if p.kind is dict:
        return {int(u * 50): 7, int(u * 50) + 1: "reason"}
    low = p.low if p.low is not None else -5.0
    high = p.high if p.high is not None else low + 100.0
    value = low + u * (high - low)
    if p.open_range:  # the bounds themselves excluded
        value = min(max(value, low + 1e-3), high - 1e-3)
    return int(value) if p.kind is int else round(value, 6)


@hsettings(max_examples=60, deadline=None)
@given(st.sampled_from([s.name for s in list_policies(include_internal=True)]), st.floats(0, 0.999))
def test_make_policy_round_trips_its_record(name: str, u: float) -> None:
    spec = policy_spec(name)
    params = {p.name: _value_in(p, u) for p in spec.params}
    policy = make_policy(name, **params)
    assert isinstance(policy, Policy) and type(policy) is spec.cls
    for key, value in params.items():
        got = getattr(policy, key)
        assert got == value or (isinstance(value, dict) and {int(k): v for k, v in value.items()} == got)
    record = json.loads(json.dumps(policy.record()))  # as stored in a trace's meta
    rebuilt = policy_from_record(record)
    assert rebuilt == policy and rebuilt.record() == policy.record()


def test_make_policy_takes_a_calibrated_gate() -> None:
    gate = Gate(tau=1.25, lam=1.5, window=8)
    guided = make_policy("guided", gate=gate, budget=0.2, score="jsd")
    assert (guided.tau, guided.lam, guided.window, guided.budget, guided.score) == (1.25, 1.5, 8, 0.2, "jsd")
    assert guided.gate == gate
    assert make_policy("guided", gate=gate).budget is None  # no cap unless asked (the paper's gate)


@pytest.mark.parametrize("call, words", [
    (lambda: make_policy("nope"), ["'nope'", *POLICIES]),
    (lambda: make_policy("early_only", budget=0.1), ["'budget'", "rate"]),
    (lambda: make_policy("early_only", rate=1.5), ["rate", "[0, 1]", "1.5"]),
    (lambda: make_policy("random_positions", seed=-1), ["seed", "≥ 0", "-1"]),
    (lambda: make_policy("random_positions", seed=2.5), ["seed", "integer"]),
    (lambda: make_policy("entropy_gated", threshold=float("nan")), ["threshold", "nan"]),
    (lambda: make_policy("guided"), ["gate=", "calibrate"]),
    (lambda: make_policy("guided", gate=Gate(1, 1, 4), tau=2.0), ["either gate= or tau/lam/window"]),
    (lambda: make_policy("base_only", gate=Gate(1, 1, 4)), ["takes no gate", "guided"]),
    (lambda: make_policy("guided", tau=1.0, lam=1.0, score="delta_logp"), ["delta_logp", *GATE_SCORES]),
    (lambda: make_policy("guided", tau=1.0, lam=1.0, budget=True), ["budget", "True"]),
    (lambda: make_policy("guided", tau=1.0), ["go together", "only tau"]),  # lam would silently be 1.0
    (lambda: make_policy("guided", lam=2.0, window=8), ["go together", "only lam"]),
    (lambda: policy_from_record({"params": {}}), ["None", "guided"]),
])
def test_bad_input_names_the_value_and_the_choices(call, words) -> None:
    with pytest.raises(core.InvalidInputError) as err:
        call()
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_a_registered_custom_policy_is_reachable_by_name() -> None:
    from dataclasses import dataclass
    from typing import ClassVar

    from core.decoding.policies import param

    @dataclass
    class EveryOther(Policy):
        name: ClassVar[str] = "every_other_test"
        label: ClassVar[str] = "EveryOther"
        help: ClassVar[str] = "Take over at every other position."
        phase: int = param(0, "0: even positions, 1: odd.", low=0, high=1)

        def takeover(self, step):
            return np.full(len(step.taken), step.t % 2 == self.phase)

    register_policy(EveryOther)
    try:
        policy = make_policy("every_other_test", phase=1)
        assert policy_from_record(policy.record()) == policy and policy.record()["params"] == {"phase": 1}
        with pytest.raises(core.InvalidInputError, match="phase"):
            make_policy("every_other_test", phase=2)
    finally:
        POLICIES.pop("every_other_test")


# -- metrics ----------------------------------------------------------------------------------------


def test_every_metric_has_a_complete_spec() -> None:
    assert [m.name for m in list_metrics()] == list(METRICS)
    for m in list_metrics():
        assert m.label.strip() and m.doc.strip() and m.unit in ("nats", "rank", ""), m.name
        assert m.integer == (m.unit == "rank") and m.integer == (m.name in INT_METRICS)
        assert m.sign in (1, -1) and (not m.can_gate or m.is_score)
    assert set(GATE_SCORES) < set(SCORES) and "entropy_reason" in SCORES and "entropy_reason" in GATE_SCORES
    assert "delta_logp" in SCORES and "delta_logp" not in GATE_SCORES  # depends on the emitted token
    assert settings.SCORE in GATE_SCORES
    assert len({m.label for m in list_metrics()}) == len(METRICS)  # labels tell metrics apart


def test_score_values_apply_the_sign() -> None:
    values = {name: np.array([0.5, -2.0]) for name in METRICS}
    for name in SCORES:
        expect = [-0.5, 2.0] if name == "delta_logp" else [0.5, -2.0]
        np.testing.assert_array_equal(score_values(values, name), expect)
    assert METRICS["delta_logp"].score_label == "Log-prob loss (base − reasoner) [nats]"  # never "−(… gain …)"


def test_cli_score_choices_are_the_metric_registry() -> None:
    assert list(_option("score", "score_name").type.choices) == list(SCORES)
    assert list(_option("generate", "score").type.choices) == list(GATE_SCORES)
    assert list(_option("calibrate", "score_name").type.choices) == list(GATE_SCORES)
    for command in ("analyze", "ls"):
        if command in main.commands:
            opts = [p for p in main.commands[command].params if "--score" in getattr(p, "opts", [])]
            for opt in opts:
                assert list(opt.type.choices) == list(SCORES), command


def test_every_metric_is_in_the_architecture_metric_table() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    table = text[text.index("## The metric table"):]
    table = table[: table.index("\n## ", 4)] if "\n## " in table[4:] else table
    named = set(re.findall(r"`([a-z_]+)`", table))
    assert set(METRICS) <= named, sorted(set(METRICS) - named)


# -- validation at the CLI edge names the flag -------------------------------------------------------


@pytest.mark.parametrize("args, flag", [
    (["--batch-size", "0"], "--batch-size"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--top-p", "1.5"], "--top-p"),
    (["--policy", "early_only", "--rate", "2"], "--rate"),
    (["--policy", "guided", "--score", "delta_logp"], "--score"),
    (["--policy", "nope"], "--policy"),
    (["--policy", "early_only", "--budget", "0.2"], "--budget"),  # --budget is not --rate any more
    (["--policy", "base_only", "--threshold", "2"], "--threshold"),
    (["--policy", "guided", "--lam", "1.5"], "--tau"),
])
def test_bad_cli_values_name_the_flag(args, flag) -> None:
    result = CliRunner().invoke(main, ["generate", *args])
    assert result.exit_code == 2, result.output
    assert flag in result.output and "Traceback" not in result.output
    assert not re.search(r"\b(max_new_tokens|batch_size|top_p)\b", result.output)


def test_cli_budget_rate_and_threshold_are_separate() -> None:
    assert _option("generate", "budget").default is None and not math.isnan(_option("generate", "rate").default)
    assert _option("generate", "rate").default == policy_spec("early_only").param("rate").default


def test_core_messages_name_cli_flags_at_the_edge() -> None:
    from core.cli.common import cli_words, fail_cleanly

    assert cli_words("position 9 is past max_new_tokens=8; max_takeovers must be ≥ 0") == \
        "position 9 is past --max-new-tokens=8; --max-takeovers must be ≥ 0"
    assert cli_words("meta.top_p and score stay") == "meta.top_p and score stay"

    @click.command()
    @fail_cleanly
    def boom() -> None:
        raise core.InvalidInputError("batch_size must be ≥ 1, got 0")

    result = CliRunner().invoke(boom, [])
    assert result.exit_code == 1 and "--batch-size must be ≥ 1, got 0" in result.output
    assert "Traceback" not in result.output
