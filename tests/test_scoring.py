"""core.scoring.teacher_forced: teacher-forced scores of the tiny pairs against a float64 brute force, and the trace they make."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from refmetrics import model_reference, reference_errors

import core
from core.annotate.rank_shift import NAME as RANK_SHIFT
from core.demo.tiny import CORPUS
from core.pair.loading import PromptFormat
from core.pair.tokens import REPLACEMENT, display_tokens
from core.scoring.registry import METRICS
from core.trace import request_key

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("base", "reason")
PROBLEM = "Tom has 3 boxes of 4 apples. How many apples?"
RESPONSE = "First, 3 * 4 = 12. Wait, let's check: 12. The answer is \\boxed{12}."
BASE_ONLY = ("entropy_base", "logp_base", "rank_base")
REASON_ONLY = ("entropy_reason", "logp_reason", "rank_reason")
FRAME_COLUMNS = ["pos", "token_id", "token", *METRICS, "topk_base", "topk_reason", "source", RANK_SHIFT]


def brute_force(pair: core.ModelPair, float64_models, prompt_ids: dict[str, list[int]], ids: list[int],
                k: int = 10) -> dict[str, np.ndarray]:
    """Each model's full float64 forward over prompt + response, then the numpy reference metrics."""
    return model_reference(pair, float64_models, prompt_ids, ids, k=k)


def assert_matches_reference(trace: core.Trace, ref: dict[str, np.ndarray], atol: float = 1e-5,
                             rtol: float = 0.0) -> None:
    """|score - reference| <= atol + rtol * |reference| for every metric and the top-k probabilities."""
    bad = reference_errors(trace, ref, atol, rtol)
    assert not bad, "; ".join(bad)


def assert_same_scores(a: core.Trace, b: core.Trace, tol: float = 1e-5) -> None:
    assert a.tokens == b.tokens and a.prompt_ids == b.prompt_ids
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    for name in METRICS:
        np.testing.assert_allclose(a.metrics[name], b.metrics[name], atol=tol, rtol=0, err_msg=name)
    for side in SIDES:
        np.testing.assert_array_equal(a.topk[side][0], b.topk[side][0])
        np.testing.assert_allclose(a.topk[side][1], b.topk[side][1], atol=tol, rtol=0)


# -- exactness ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("pair_name", ["qwen_pair", "llama_pair"])
def test_score_matches_float64_brute_force(request, pair_name: str, float64_models) -> None:
    pair = request.getfixturevalue(pair_name)
    trace = core.score(pair, PROBLEM, RESPONSE)
    assert len(trace) == len(pair.encode(RESPONSE)) > 10
    assert trace.prompt_ids == pair.prompt_ids(PROBLEM)
    assert_matches_reference(trace, brute_force(pair, float64_models, trace.prompt_ids, trace.token_ids.tolist()))
    assert (trace.source == "base").all()


def test_float64_pair_scores_exactly(tiny_dirs, float64_models) -> None:
    """In float64 end to end, scoring equals the brute force to rounding: alignment, prompts, truncation and
    chunking add no error of their own (all error in float32 runs is float32 arithmetic)."""
    pair = core.load_pair(str(tiny_dirs["llama_base"]), str(tiny_dirs["llama_reason"]), device="cpu",
                          dtype=torch.float64)
    trace = core.score(pair, PROBLEM, RESPONSE + " " + CORPUS[4], chunk=5)
    assert trace.metrics["cross_entropy"].dtype == np.float64
    ref = brute_force(pair, float64_models, trace.prompt_ids, trace.token_ids.tolist())
    assert_matches_reference(trace, ref, atol=1e-9)


def test_same_model_twice_has_zero_divergence(self_pair) -> None:
    trace = core.score(self_pair, PROBLEM, RESPONSE)
    m = trace.metrics
    for name in ("kl_base_reason", "kl_reason_base", "jsd", "delta_logp"):
        np.testing.assert_allclose(m[name], 0.0, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(m["cross_entropy"], m["entropy_base"], atol=1e-6)
    np.testing.assert_array_equal(m["rank_base"], m["rank_reason"])
    assert (m["reason_top_rank_in_base"] == 0).all()
    np.testing.assert_array_equal(trace.topk["base"][0], trace.topk["reason"][0])
    assert (m["entropy_base"] > 0.01).any()  # the distributions are not degenerate


def test_batch_equals_one_at_a_time(qwen_pair) -> None:
    items = [
        ("What is 2+3?", "2 + 3 = 5. The answer is 5."),
        ({"id": "p2", "prompt": "A long one: " + CORPUS[3], "gold": "12"}, CORPUS[1] + " " + CORPUS[2]),
        ("Short?", "Hmm"),
        ("Ids instead of text", qwen_pair.encode("Wait, 12 - 2 = 10.")),
        ("What is 2+3?", "5"),
    ]
    batched = core.score_batch(qwen_pair, items, batch_size=3)
    assert len(batched) == len(items)
    for (prompt, response), got in zip(items, batched):
        alone = core.score(qwen_pair, prompt, response)
        assert got.key == alone.key
        assert_same_scores(got, alone)
    assert batched[1].meta["problem"] == {"id": "p2", "prompt": "A long one: " + CORPUS[3], "gold": "12"}


@pytest.mark.parametrize("pair_name", ["qwen_pair", "llama_pair"])
def test_chunk_size_does_not_change_scores(request, pair_name: str) -> None:
    pair = request.getfixturevalue(pair_name)
    ids = pair.encode(RESPONSE + " " + CORPUS[0])
    traces = [core.score(pair, PROBLEM, ids, chunk=chunk) for chunk in (1, 7, 256)]
    assert len(ids) > 7 * 3
    for other in traces[1:]:
        assert_same_scores(traces[0], other)


def test_long_response_on_cpu(qwen_pair, float64_models) -> None:
    ids = qwen_pair.encode(" ".join(CORPUS * 40))[:4100]
    assert len(ids) == 4100
    trace = core.score(qwen_pair, PROBLEM, ids, chunk=1000)  # chunk boundaries in the middle of the text
    assert len(trace) == 4100
    for name in METRICS:
        assert np.isfinite(trace.metrics[name].astype(np.float64)).all(), name
    # A float32 forward over 4k positions alone moves KL (values up to ~15) by ~1.2e-5 (measured): the
    # tolerance grows with the value there. The metric maths alone is held to 1e-5 in test_metrics.
    ref = brute_force(qwen_pair, float64_models, trace.prompt_ids, ids)
    assert_matches_reference(trace, ref, atol=1e-5, rtol=1e-6)
    assert "".join(trace.tokens) == qwen_pair.decode(ids)


def test_ids_and_text_give_the_same_trace(qwen_pair) -> None:
    by_text = core.score(qwen_pair, PROBLEM, RESPONSE)
    by_ids = core.score(qwen_pair, PROBLEM, qwen_pair.encode(RESPONSE))
    by_array = core.score(qwen_pair, PROBLEM, np.asarray(qwen_pair.encode(RESPONSE)))
    assert by_text.key == by_ids.key == by_array.key
    assert_same_scores(by_text, by_ids, tol=0)
    assert_same_scores(by_text, by_array, tol=0)
    assert by_text.text == RESPONSE


def test_k_sets_topk_width(qwen_pair) -> None:
    trace = core.score(qwen_pair, PROBLEM, RESPONSE, k=3)
    assert trace.topk["base"][0].shape == (len(trace), 3) == trace.topk["reason"][1].shape
    assert trace.k == 3
    for bad in (0, 2.5):  # one rule for scoring and decoding (the "k" setting): a clear message, not an IndexError
        with pytest.raises(core.InvalidInputError, match="k must be a whole number ≥ 1|k must be ≥ 1"):
            core.score(qwen_pair, PROBLEM, RESPONSE, k=bad)
        with pytest.raises(core.InvalidInputError, match="k must be a whole number ≥ 1|k must be ≥ 1"):
            core.generate(qwen_pair, PROBLEM, core.Guided(tau=0.1), k=bad, max_new_tokens=4)


# -- edge inputs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("response", ["", []])
def test_empty_response_gives_empty_frame_with_all_columns(qwen_pair, response) -> None:
    trace = core.score(qwen_pair, PROBLEM, response)
    assert len(trace) == 0 and trace.text == "" and trace.tokens == []
    frame = trace.frame()
    assert list(frame.columns) == FRAME_COLUMNS
    assert len(frame) == 0
    assert set(trace.metrics) == set(METRICS)
    assert trace.prompt_ids == qwen_pair.prompt_ids(PROBLEM)


def test_token_id_outside_the_vocabulary(qwen_pair, llama_pair) -> None:
    n = qwen_pair.vocab_size
    for bad in (n, -1, 10**9):
        with pytest.raises(core.InvalidInputError, match=rf"Token id {bad} .*0\.\.{n - 1}"):
            core.score(qwen_pair, PROBLEM, [5, bad, 6])
    # An id inside the padded embedding but past the tokenizer is not a token either.
    rows = llama_pair.base.get_output_embeddings().weight.shape[0]
    assert rows > llama_pair.vocab_size
    with pytest.raises(core.InvalidInputError, match=str(llama_pair.vocab_size + 3)):
        core.score(llama_pair, PROBLEM, [llama_pair.vocab_size + 3])


def test_too_long_input_names_the_numbers(qwen_pair) -> None:
    limit = qwen_pair.base.config.max_position_embeddings
    prompt_len = len(qwen_pair.prompt_ids(PROBLEM)["base"])
    n = limit - prompt_len + 1
    with pytest.raises(core.InvalidInputError) as err:
        core.score(qwen_pair, PROBLEM, [5] * n)
    message = str(err.value)
    for number in (prompt_len, n, prompt_len + n, limit):
        assert str(number) in message, message


def test_unicode_split_mid_character(qwen_pair) -> None:
    text = "東京 🙂 café"
    ids = qwen_pair.encode(text)
    pieces = [qwen_pair.decode([i]) for i in ids]
    assert any(REPLACEMENT in piece for piece in pieces), "the tokenizer should split a character here"
    trace = core.score(qwen_pair, PROBLEM, text)
    assert "".join(trace.tokens) == text == trace.text
    assert all(REPLACEMENT not in token for token in trace.tokens)
    assert "" in trace.tokens  # the leading bytes of a split character show nothing
    assert list(trace.frame()["token"]) == trace.tokens


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=40))
def test_display_tokens_rebuild_any_text(tiny_tokenizer, text: str) -> None:
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    shown = display_tokens(tiny_tokenizer, ids)
    assert len(shown) == len(ids)
    assert "".join(shown) == text
    if REPLACEMENT not in text:
        assert all(REPLACEMENT not in piece for piece in shown)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(0, 399), max_size=30))
def test_display_tokens_of_arbitrary_ids_join_to_the_decoded_text(tiny_tokenizer, ids: list[int]) -> None:
    """Sampled tokens need not form valid UTF-8; the display strings still rebuild the decoded text."""
    shown = display_tokens(tiny_tokenizer, ids)
    assert len(shown) == len(ids)
    assert "".join(shown) == tiny_tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(0, 399), max_size=12))
def test_display_tokens_fast_decoder_is_the_tokenizers_decode(tiny_tokenizer, ids: list[int]) -> None:
    """display_tokens calls a fast tokenizer's Rust decoder directly: the very strings of `decode`."""
    from core.pair.tokens import _decoder

    dec = _decoder(tiny_tokenizer)
    assert "backend" in dec.__code__.co_freevars  # the direct path, not the fallback
    assert dec(ids) == tiny_tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(0, 399), min_size=1, max_size=30), data=st.data())
def test_display_tokens_reuse_a_longer_responses_prefix(tiny_tokenizer, ids: list[int], data) -> None:
    """A branch reuses its parent's display strings for the shared prefix (all but a finished parent's
    last one): the result equals decoding the child from scratch, split characters included."""
    keep = data.draw(st.integers(0, len(ids)))
    parent = ids[:keep] + data.draw(st.lists(st.integers(0, 399), max_size=8))
    known = display_tokens(tiny_tokenizer, parent)[: max(0, min(keep, len(parent) - 1))]
    assert display_tokens(tiny_tokenizer, ids, known=known) == display_tokens(tiny_tokenizer, ids)


def test_assemble_reuses_the_parents_prefix_rows(qwen_pair, monkeypatch) -> None:
    """assemble(parent=, keep=) takes the prefix's rows from the parent (new rows only, or all rows) and
    decodes only the new tokens; a prefix that is not the parent's is refused."""
    from core.scoring import teacher_forced as scoring

    parent = core.score(qwen_pair, PROBLEM, RESPONSE)
    child_ids = parent.token_ids.tolist()[:-3] + qwen_pair.encode(" 東京 🙂")
    full = core.score(qwen_pair, PROBLEM, child_ids)
    keep = len(parent) - 3
    arrays = {**{name: full.metrics[name] for name in METRICS},
              **{f"topk_{side}_{part}": full.topk[side][j] for side in SIDES for j, part in enumerate(("ids", "probs"))}}
    decoded: list[int] = []
    from core.record import assembly

    real = assembly.display_tokens
    monkeypatch.setattr(assembly, "display_tokens", lambda tok, ids, known=(): decoded.append(len(ids) - len(known))
                        or real(tok, ids, known))
    for rows in ({n: v[keep:] for n, v in arrays.items()}, arrays):
        child = scoring.assemble(qwen_pair, child_ids, full.prompt_ids, rows, full.source, dict(full.meta),
                                 parent=parent, keep=keep)
        assert_same_scores(child, full, tol=0)
        assert child.tokens == full.tokens and "".join(child.tokens) == qwen_pair.decode(child_ids)
    assert decoded == [len(child_ids) - keep] * 2  # only the new tokens were decoded
    with pytest.raises(core.InvalidInputError, match="not the parent"):
        scoring.assemble(qwen_pair, [1] + child_ids[1:], full.prompt_ids, arrays, full.source, {}, parent=parent,
                         keep=keep)


# -- the trace record ------------------------------------------------------------------------------------


def test_frame_columns_and_meta(qwen_pair) -> None:
    trace = core.score(qwen_pair, {"id": "q1", "prompt": PROBLEM, "gold": "12"}, RESPONSE)
    frame = trace.frame()
    assert list(frame.columns) == FRAME_COLUMNS
    assert len(frame) == len(trace)
    np.testing.assert_array_equal(frame["pos"], np.arange(len(trace)))
    first = frame["topk_base"].iloc[0]
    assert len(first) == 10 and first[0][0] == trace.topk["base"][0][0, 0]
    meta = trace.meta
    assert meta["formats"] == {"base": qwen_pair.formats["base"].spec, "reason": qwen_pair.formats["reason"].spec}
    assert meta["pair"] == qwen_pair.spec()
    assert meta["pair"]["base"]["id"] != meta["pair"]["reason"]["id"]
    assert meta["kind"] == "score"
    assert meta["problem"] == {"id": "q1", "prompt": PROBLEM, "gold": "12"}
    assert meta["key"] == trace.key == request_key(meta["request"])
    assert meta["schema"] == core.trace.SCHEMA_VERSION
    for name in ("policy", "sampling", "parent", "branch_pos", "answer", "correct", "timings", "versions", "created"):
        assert name in meta, name


# -- prompt formats ----------------------------------------------------------------------------------------


def _decoded_prompt(pair: core.ModelPair, spec: str, problem: str = "What is 2+3?") -> str:
    return pair.decode(PromptFormat(spec).render(pair.tokenizer, problem))


def test_prompt_formats_render_expected_text(qwen_pair) -> None:
    user = "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    assert _decoded_prompt(qwen_pair, "Q: {problem}\nA:") == "Q: What is 2+3?\nA:"
    assert _decoded_prompt(qwen_pair, "chat") == user
    assert _decoded_prompt(qwen_pair, "chat:think") == user
    assert _decoded_prompt(qwen_pair, "chat:nothink") == user + "<think>\n\n</think>\n\n"
    assert _decoded_prompt(qwen_pair, "chat|Be brief.") == "<|im_start|>system\nBe brief.<|im_end|>\n" + user
    # special tokens are single ids, not spelled out in bytes
    start = qwen_pair.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert PromptFormat("chat").render(qwen_pair.tokenizer, "x")[0] == start


def test_chat_format_needs_a_chat_template(qwen_pair) -> None:
    import copy

    plain = copy.deepcopy(qwen_pair.tokenizer)
    plain.chat_template = None
    with pytest.raises(core.InvalidInputError, match="chat template"):
        PromptFormat("chat").render(plain, "x")


def test_each_model_conditions_on_its_own_prompt(qwen_pair) -> None:
    def with_formats(base: str, reason: str) -> core.ModelPair:
        return dataclasses.replace(qwen_pair, formats={"base": PromptFormat(base), "reason": PromptFormat(reason)})

    raw = "Question: {problem}\nAnswer:"
    reference = core.score(with_formats(raw, "chat"), PROBLEM, RESPONSE)
    new_reason = core.score(with_formats(raw, "chat:nothink"), PROBLEM, RESPONSE)
    new_base = core.score(with_formats("Problem: {problem}\nSolution:", "chat"), PROBLEM, RESPONSE)
    assert new_reason.prompt_ids["base"] == reference.prompt_ids["base"]
    assert new_reason.prompt_ids["reason"] != reference.prompt_ids["reason"]
    assert new_reason.key != reference.key and new_base.key != reference.key
    assert new_reason.meta["formats"] == {"base": raw, "reason": "chat:nothink"}
    for name in BASE_ONLY:
        np.testing.assert_array_equal(new_reason.metrics[name], reference.metrics[name])
        assert not np.array_equal(new_base.metrics[name], reference.metrics[name]) or name == "rank_base"
    for name in REASON_ONLY:
        np.testing.assert_array_equal(new_base.metrics[name], reference.metrics[name])
    assert not np.allclose(new_reason.metrics["entropy_reason"], reference.metrics["entropy_reason"])
    assert not np.allclose(new_reason.metrics["logp_reason"], reference.metrics["logp_reason"])
    np.testing.assert_array_equal(new_reason.topk["base"][0], reference.topk["base"][0])


@pytest.mark.slow
def test_scoring_benchmark_runs() -> None:
    """benchmarks/bench_scoring.py still runs against the scoring API (tiny shape, seconds)."""
    cmd = [sys.executable, "benchmarks/bench_scoring.py", "--shape", "tiny-qwen3", "--T", "64", "--repeats", "1",
           "--related", "--base-targets"]
    out = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ratio b/a" in out.stdout and "b/a from the parts" in out.stdout
