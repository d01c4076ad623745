"""core.instruments.lens: the logit lens equals the trace at the last layer, a float64 hand computation
at every layer of a two-layer model, reads only its window, and knows where each architecture keeps its
final norm."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import core
from core.errors import InvalidInputError
from core.instruments import lens as lens_mod
from core.instruments.lens import ARCHITECTURES, lens, residuals
from core.pair.forward import head

RESPONSE = "First, we multiply, then we subtract. 3 * 4 = 12. 12 - 2 = 10. The answer is 10."


@pytest.fixture(scope="module")
def demo_trace():
    pair = core.demo_pair()
    return pair, core.generate(pair, core.demo_problems(limit=2)[1], max_new_tokens=80)


def _last_layer_matches(pair, trace, frame, k: int) -> None:
    last = frame[frame["layer"] == frame["layer"].max()]
    assert len(last) == 2 * frame["pos"].nunique()
    for row in last.itertuples():
        ids, probs = trace.topk[row.side]
        assert row.top_ids == ids[row.pos, :k].tolist()
        np.testing.assert_allclose(row.top_probs, probs[row.pos, :k], atol=1e-5)
        assert row.entropy == pytest.approx(trace.metrics[f"entropy_{row.side}"][row.pos], abs=1e-5)
        assert row.rank_emitted == trace.metrics[f"rank_{row.side}"][row.pos]
        assert np.log(row.p_emitted) == pytest.approx(trace.metrics[f"logp_{row.side}"][row.pos], abs=1e-4)
        assert row.kl_to_final == pytest.approx(0.0, abs=1e-6)
    base = last[last["side"] == "base"].set_index("pos")
    np.testing.assert_array_equal(base["rank_other"].to_numpy(),
                                  trace.metrics["reason_top_rank_in_base"][base.index.to_numpy()])


def test_last_layer_is_the_stored_distribution_demo(demo_trace) -> None:
    pair, trace = demo_trace
    decision = int(np.argmax(trace.metrics["cross_entropy"]))
    frame = lens(pair, trace, decision, window=2, k=5)
    assert sorted(frame["pos"].unique()) == list(range(decision - 2, decision + 3))
    assert frame["layer"].max() == pair.model("base").config.num_hidden_layers
    _last_layer_matches(pair, trace, frame, 5)
    # the organism: the reasoner puts ' divide' on top at some layer; the base never does
    at = frame[frame["pos"] == decision]
    assert (at[at["side"] == "reason"]["rank_other"] > 0).all()  # the base's ' add' is never the reasoner's top
    assert lens_mod.commit_layer(frame, "base", decision) <= frame["layer"].max()


def test_last_layer_is_the_stored_distribution_two_prompt_formats(qwen_pair) -> None:
    trace = core.score(qwen_pair, "Tom has 3 boxes of 4 apples.", RESPONSE)  # raw base prompt, chat reasoner
    for pos in (0, 7, len(trace) - 1):
        _last_layer_matches(qwen_pair, trace, lens(qwen_pair, trace, pos, window=1, k=3), 3)


def test_every_layer_equals_a_float64_hand_computation(llama_pair, float64_models) -> None:
    """Two layers, a padded vocabulary: residuals from HF's own hidden_states, RMSNorm and the head by hand."""
    trace = core.score(llama_pair, "Tom has 3 boxes of 4 apples.", RESPONSE)
    pos, window = 5, 1
    frame = lens(llama_pair, trace, pos, window=window, k=4)
    v = llama_pair.vocab_size
    for side in ("base", "reason"):
        model = float64_models(llama_pair.model(side))
        prompt = trace.prompt_ids[side]
        ids = torch.tensor([prompt + trace.token_ids[: pos + window].tolist()])
        hs = model(ids, output_hidden_states=True).hidden_states  # emb, after block 1, normed after block 2
        weight, eps = model.model.norm.weight.detach(), model.config.rms_norm_eps
        w_head = model.lm_head.weight.detach()[:v]
        for layer in range(3):
            for t in range(pos - window, pos + window + 1):
                h = hs[layer][0, len(prompt) - 1 + t].detach()
                normed = h if layer == 2 else h / torch.sqrt((h * h).mean() + eps) * weight
                logp = torch.log_softmax(w_head @ normed, -1)
                p = logp.exp()
                final_h = hs[2][0, len(prompt) - 1 + t].detach()
                final = torch.log_softmax(w_head @ final_h, -1)
                row = frame[(frame["side"] == side) & (frame["layer"] == layer) & (frame["pos"] == t)].iloc[0]
                top = torch.topk(p, 4)
                assert row.top_ids == top.indices.tolist()
                np.testing.assert_allclose(row.top_probs, top.values.numpy(), atol=1e-5)
                assert row.entropy == pytest.approx(float(-(p * logp).sum()), abs=1e-4)
                target = int(trace.token_ids[t])
                assert row.p_emitted == pytest.approx(float(p[target]), abs=1e-6)
                assert row.rank_emitted == int((p > p[target]).sum())
                assert row.kl_to_final == pytest.approx(float((final.exp() * (final - logp)).sum()), abs=1e-4)


def test_only_the_window_is_read_into_residuals(llama_pair, monkeypatch) -> None:
    short = core.score(llama_pair, "Tom has 3 boxes.", RESPONSE)
    long = core.score(llama_pair, "Tom has 3 boxes.", " ".join([RESPONSE] * 6))
    shapes = []
    real = lens_mod.residuals

    def spy(model, ids, first):
        out = real(model, ids, first)
        shapes.append(tuple(out.shape))
        return out

    monkeypatch.setattr(lens_mod, "residuals", spy)
    lens(llama_pair, short, 10, window=2)
    lens(llama_pair, long, len(long) - 10, window=2)
    assert len(set(shapes)) == 1 and shapes[0][:2] == (3, 5)  # (L + 1, 2w + 1), whatever the trace's length
    edge = lens(llama_pair, short, 0, window=3)  # clipped at the start
    assert sorted(edge["pos"].unique()) == [0, 1, 2, 3] and len(edge) == 2 * 3 * 4


def _tiny(kind: str):
    from transformers import (
        AutoModelForCausalLM,
        Gemma2Config,
        GPT2Config,
        MistralConfig,
        Qwen2Config,
    )

    common = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}
    config = {
        "gpt2": lambda: GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=128),
        "qwen2": lambda: Qwen2Config(**common),
        "mistral": lambda: MistralConfig(**common),
        "gemma2": lambda: Gemma2Config(head_dim=8, final_logit_softcapping=5.0, **common),
    }[kind]()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("kind", ["gpt2", "qwen2", "mistral", "gemma2"])
def test_the_registry_finds_each_architectures_norm_and_head(kind: str) -> None:
    model = _tiny(kind)
    assert model.config.model_type in ARCHITECTURES
    ids = torch.randint(0, 96, (12,)).tolist()
    hidden = residuals(model, ids, 4)
    assert hidden.shape == (3, 8, 32)
    spec = ARCHITECTURES[model.config.model_type]
    norm = lens_mod._attr(model, spec.norm)
    with torch.no_grad():
        mine = head(model, norm(hidden[-1]), 96)
        theirs = model(torch.tensor([ids])).logits[0, 4:].float()
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)


def test_unknown_architectures_and_bad_arguments_are_refused(demo_trace) -> None:
    pair, trace = demo_trace

    class Other:
        class config:
            model_type = "bert"

    with pytest.raises(InvalidInputError, match="'bert'.*supported: gemma"):
        lens_mod.lens_spec(Other())
    with pytest.raises(InvalidInputError, match="outside the trace"):
        lens(pair, trace, len(trace))
    with pytest.raises(InvalidInputError, match="window"):
        lens(pair, trace, 3, window=-1)
    with pytest.raises(InvalidInputError, match="k must"):
        lens(pair, trace, 3, k=0)


def test_cli_lens_prints_every_layer_of_both_models(tmp_path, demo_trace) -> None:
    from click.testing import CliRunner

    from core.cli import main

    pair, trace = demo_trace
    store = core.TraceStore(tmp_path / "store")
    store.put(trace)
    result = CliRunner().invoke(main, ["lens", "--store", str(store.path), trace.key, "--pos", "15", "--csv"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    import io

    import pandas as pd

    table = pd.read_csv(io.StringIO(result.output))
    assert len(table) == 2 * (pair.model("base").config.num_hidden_layers + 1)
    bad = CliRunner().invoke(main, ["lens", "--store", str(store.path), "nope", "--pos", "1"])
    assert bad.exit_code == 2 and "Invalid value for KEY: no readable trace 'nope'" in bad.output  # lens has no --key
    assert "--key" not in bad.output
