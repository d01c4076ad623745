"""core.models: loading pairs, the shared-vocabulary check, devices and dtypes, prompt formats."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

import core
from core.demo.tiny import build_tiny_model, build_tiny_tokenizer
from core.pair import loading as load
from core.pair.forward import TRANSFORMERS_MIN, check_transformers, head
from core.pair.loading import (
    DEFAULT_BASE_FORMAT,
    PromptFormat,
    check_same_vocabulary,
    resolve_device,
    resolve_dtype,
)

PROBLEM = "What is 3 * 4?"
RESPONSE = "3 * 4 = 12. The answer is 12."
TINY = {"hidden": 64, "layers": 2}  # as in conftest
needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="'auto' picks CUDA on this machine")


# -- loading -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("pair_name", "arch"), [("qwen_pair", "qwen3"), ("llama_pair", "llama")])
def test_load_pair_from_local_dirs(request, tiny_dirs, tiny_tokenizer, pair_name: str, arch: str) -> None:
    pair = request.getfixturevalue(pair_name)
    prefix = pair_name.split("_")[0]
    assert isinstance(pair, core.ModelPair)
    assert pair.base.config.model_type == pair.reason.config.model_type == arch
    assert pair.base is not pair.reason
    assert pair.vocab_size == len(tiny_tokenizer) == len(pair.tokenizer)
    assert pair.device == torch.device("cpu") and pair.dtype == torch.float32
    assert not pair.base.training and not any(p.requires_grad for p in pair.reason.parameters())
    assert pair.specs["base"].id == str(tiny_dirs[f"{prefix}_base"])
    assert pair.specs["reason"].id == str(tiny_dirs[f"{prefix}_reason"])
    assert pair.formats["base"].spec == DEFAULT_BASE_FORMAT
    assert pair.formats["reason"].spec == "chat"  # the tokenizer has a chat template
    assert tiny_tokenizer.convert_tokens_to_ids("<|endoftext|>") in pair.eos_ids
    spec = pair.spec()
    assert spec["dtype"] == "float32" and spec["device"] == "cpu" and spec["vocab_size"] == pair.vocab_size
    json.dumps(spec)  # part of every trace's meta: must be plain JSON
    json.dumps(pair.fingerprint())
    assert pair.decode(pair.encode(RESPONSE)) == RESPONSE
    # different random weights: the two models really disagree
    assert not torch.equal(pair.base.get_output_embeddings().weight, pair.reason.get_output_embeddings().weight)


def test_missing_path_is_a_clear_error(tmp_path) -> None:
    missing = tmp_path / "no_such_model"
    with pytest.raises(core.ModelLoadError) as err:
        core.load_pair(str(missing), str(missing), device="cpu")
    message = str(err.value)
    assert str(missing) in message and "does not exist" in message
    assert "\n" not in message and "Traceback" not in message


def test_a_source_the_file_system_refuses_is_a_clear_error(tiny_dirs) -> None:
    """A 5,000-character line pasted as a reasoner (the app's Compare page) raised a bare OSError (name too long)."""
    with pytest.raises(core.ModelLoadError, match="5000 characters.*neither a hub id nor a usable path"):
        core.load_pair(str(tiny_dirs["qwen_base"]), "a" * 5000, device="cpu")


def test_an_older_transformers_is_refused_with_the_fix(monkeypatch, tiny_dirs) -> None:
    """transformers before 5.24 ignores the decoder's `cache` argument (a GPU run under 5.17 failed deep inside a
    forward): loading says which release is needed, and the bound is the one pyproject.toml declares."""
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    declared = next(Requirement(r) for r in project["project"]["dependencies"] if r.startswith("transformers"))
    assert [Version(s.version) for s in declared.specifier if s.operator == ">="] == [Version(TRANSFORMERS_MIN)]
    check_transformers(TRANSFORMERS_MIN)  # the bound itself passes
    with pytest.raises(core.ModelLoadError, match=r"transformers >= 5\.24 \(found 5\.17\.0\)"):
        check_transformers("5.17.0")
    monkeypatch.setattr("core.pair.forward.metadata", types.SimpleNamespace(version=lambda name: "5.23.0"))
    with pytest.raises(core.ModelLoadError, match="pip install 'transformers>=5.24,<6'"):
        core.load_pair(str(tiny_dirs["llama_base"]), str(tiny_dirs["llama_reason"]), device="cpu")


def test_directory_without_a_model_is_a_load_error(tmp_path, tiny_dirs) -> None:
    """The message says what the folder lacks, and transformers' reason whole (it was cut after its first line,
    "Couldn't instantiate the backend tokenizer from one of: ")."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(core.ModelLoadError) as err:
        core.load_pair(str(tmp_path / "empty"), str(tmp_path / "empty"), device="cpu")
    message = str(err.value)
    assert "as a local model directory: it has no config.json and no tokenizer file (tokenizer.json," in message
    assert message.rstrip(")").endswith("to convert a slow tokenizer to a fast one.") and "\n" not in message
    (tmp_path / "empty" / "config.json").write_text((tiny_dirs["qwen_base"] / "config.json").read_text())
    with pytest.raises(core.ModelLoadError, match=r"it has no tokenizer file \(") as err:
        core.load_pair(str(tmp_path / "empty"), str(tmp_path / "empty"), device="cpu")
    assert "no config.json" not in str(err.value)


def test_unknown_hub_id_offline(monkeypatch, tmp_path) -> None:
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once at import time
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    with pytest.raises(core.ModelLoadError) as err:
        core.load_pair("forkpoint-tests/no-such-model", "forkpoint-tests/no-such-model", device="cpu")
    message = str(err.value)
    assert "forkpoint-tests/no-such-model" in message
    assert "\n" not in message


def test_trust_remote_code_defaults_to_false(monkeypatch, tiny_dirs) -> None:
    import transformers

    seen: list[tuple[str, object]] = []
    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        original = cls.from_pretrained

        def spy(*args, _original=original, _name=cls.__name__, **kwargs):
            seen.append((_name, kwargs.get("trust_remote_code", "<missing>")))
            return _original(*args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", spy)
    core.load_pair(str(tiny_dirs["qwen_base"]), str(tiny_dirs["qwen_reason"]), device="cpu")
    assert len(seen) == 4
    assert all(value is False for _, value in seen), seen
    seen.clear()
    core.load_pair(str(tiny_dirs["qwen_base"]), str(tiny_dirs["qwen_reason"]), device="cpu", trust_remote_code=True)
    assert all(value is True for _, value in seen), seen


# -- the shared vocabulary ----------------------------------------------------------------------------


def test_mismatched_tokenizers_are_rejected(tmp_path, tiny_dirs) -> None:
    other = build_tiny_tokenizer(["Completely different words: zebra quantum xylophone jazz."] * 3, vocab_size=300)
    odd_dir = build_tiny_model(tmp_path / "odd", other, "qwen3", seed=5, **TINY)
    with pytest.raises(core.VocabularyMismatchError) as err:
        core.load_pair(str(tiny_dirs["qwen_base"]), str(odd_dir), device="cpu")
    message = str(err.value)
    assert "base" in message and "reason" in message
    assert "first differences" in message and "id " in message
    by_id_a = {i: s for s, i in build_tiny_tokenizer().get_vocab().items()}
    by_id_b = {i: s for s, i in other.get_vocab().items()}
    first = min(i for i in set(by_id_a) | set(by_id_b) if by_id_a.get(i) != by_id_b.get(i))
    assert f"id {first}: {by_id_a.get(first)!r} vs {by_id_b.get(first)!r}" in message


def test_same_size_different_vocabulary_is_caught(tiny_tokenizer) -> None:
    a = copy.deepcopy(tiny_tokenizer)
    b = copy.deepcopy(tiny_tokenizer)
    a.add_tokens(["<forkpoint_a>"])
    b.add_tokens(["<forkpoint_b>"])
    assert len(a) == len(b)
    with pytest.raises(core.VocabularyMismatchError) as err:
        check_same_vocabulary(a, b)
    message = str(err.value)
    assert "'<forkpoint_a>'" in message and "'<forkpoint_b>'" in message
    assert str(len(tiny_tokenizer)) in message  # the id where they differ


def test_swapped_ids_are_caught() -> None:
    """Same strings, same size, different ids: still a mismatch."""

    class Vocab:
        all_special_tokens: list[str] = []

        def __init__(self, vocab: dict[str, int]) -> None:
            self.vocab = vocab

        def get_vocab(self) -> dict[str, int]:
            return dict(self.vocab)

    with pytest.raises(core.VocabularyMismatchError, match="id 0: 'x' vs 'y'"):
        check_same_vocabulary(Vocab({"x": 0, "y": 1}), Vocab({"x": 1, "y": 0}))
    check_same_vocabulary(Vocab({"x": 0, "y": 1}), Vocab({"y": 1, "x": 0}))  # equal: no error


def test_identical_tokenizers_pass(tiny_tokenizer) -> None:
    check_same_vocabulary(tiny_tokenizer, copy.deepcopy(tiny_tokenizer))


def test_padded_embedding_logits_are_truncated(llama_pair) -> None:
    rows = llama_pair.base.get_output_embeddings().weight.shape[0]
    assert rows > llama_pair.vocab_size  # conftest pads the Llama embedding past the tokenizer
    # Make the padding rows win every softmax: if they leaked into the metrics, nothing below would hold.
    poisoned = {side: copy.deepcopy(llama_pair.model(side)) for side in ("base", "reason")}
    for model in poisoned.values():
        with torch.no_grad():
            model.get_output_embeddings().weight[llama_pair.vocab_size :] = 50.0
    pair = dataclasses.replace(llama_pair, base=poisoned["base"], reason=poisoned["reason"])
    clean = core.score(llama_pair, PROBLEM, RESPONSE)
    trace = core.score(pair, PROBLEM, RESPONSE)
    for side in ("base", "reason"):
        assert (trace.topk[side][0] < pair.vocab_size).all()
        np.testing.assert_allclose(trace.topk[side][1].sum(-1), clean.topk[side][1].sum(-1), atol=1e-6)
    for name in core.scoring.registry.METRICS:
        np.testing.assert_array_equal(trace.metrics[name], clean.metrics[name])
    hidden = torch.randn(3, pair.base.config.hidden_size)
    assert head(pair.base, hidden, pair.vocab_size).shape == (3, pair.vocab_size)


def test_output_layer_smaller_than_tokenizer_is_rejected(tmp_path, tiny_dirs, tiny_tokenizer) -> None:
    small = build_tiny_model(tmp_path / "small", tiny_tokenizer, "qwen3", seed=7, pad_vocab_to=len(tiny_tokenizer) - 10,
                             **TINY)
    with pytest.raises(core.VocabularyMismatchError, match=f"{len(tiny_tokenizer) - 10} rows"):
        core.load_pair(str(tiny_dirs["qwen_base"]), str(small), device="cpu")


# -- devices, dtypes, formats -------------------------------------------------------------------------------


@needs_no_cuda
def test_auto_device_is_cpu_float32_here(tiny_dirs) -> None:
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    pair = core.load_pair(str(tiny_dirs["qwen_base"]), str(tiny_dirs["qwen_reason"]))
    assert pair.device.type == "cpu" and pair.dtype == torch.float32
    assert next(pair.base.parameters()).dtype == torch.float32


def test_auto_dtype_is_bfloat16_on_cuda() -> None:
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16
    assert resolve_dtype(torch.float64, torch.device("cpu")) == torch.float64


def test_bad_dtype_lists_choices(tiny_dirs) -> None:
    with pytest.raises(core.InvalidInputError) as err:
        core.load_pair(str(tiny_dirs["qwen_base"]), str(tiny_dirs["qwen_reason"]), device="cpu", dtype="fp17")
    message = str(err.value)
    assert "'fp17'" in message
    for choice in ("auto", "float32", "bfloat16", "float16"):
        assert choice in message


@pytest.mark.parametrize("device", ["gpu", "tpu:0", "", "cuda:x"])
def test_bad_device_lists_choices(tiny_dirs, device: str) -> None:
    with pytest.raises(core.InvalidInputError) as err:
        core.load_pair(str(tiny_dirs["qwen_base"]), str(tiny_dirs["qwen_reason"]), device=device)
    message = str(err.value)
    assert repr(device) in message
    for choice in ("auto", "cpu", "cuda"):
        assert choice in message


@needs_no_cuda
def test_cuda_without_a_gpu_is_an_input_error() -> None:
    for device in ("cuda", "cuda:0"):
        with pytest.raises(core.InvalidInputError, match="not available"):
            resolve_device(device)


def test_prompt_format_needs_a_placeholder(tiny_dirs) -> None:
    with pytest.raises(core.InvalidInputError) as err:
        PromptFormat("Answer the question:")
    message = str(err.value)
    assert "{problem}" in message and "chat:nothink" in message
    with pytest.raises(core.InvalidInputError):
        core.load_pair(str(tiny_dirs["qwen_base"]), str(tiny_dirs["qwen_reason"]), device="cpu",
                       base_format="no placeholder")
    for ok in ("chat", "chat:think", "chat:nothink", "chat|You are careful.", "Q: {problem}\nA:"):
        assert PromptFormat(ok).spec == ok


def test_formats_passed_to_load_pair(tiny_dirs) -> None:
    pair = core.load_pair(str(tiny_dirs["qwen_base"]), str(tiny_dirs["qwen_reason"]), device="cpu",
                          base_format="Problem: {problem}\n", reason_format="chat:nothink")
    assert pair.formats["base"].spec == "Problem: {problem}\n"
    assert pair.formats["reason"].spec == "chat:nothink"
    prompts = pair.prompt_ids("2+2?")
    assert pair.decode(prompts["base"]) == "Problem: 2+2?\n"
    assert pair.decode(prompts["reason"]).endswith("<think>\n\n</think>\n\n")
    assert pair.fingerprint()["formats"] == {"base": "Problem: {problem}\n", "reason": "chat:nothink"}


# -- import hygiene -----------------------------------------------------------------------------------


def test_importing_core_pulls_in_no_ui_or_cli_framework() -> None:
    code = (
        "import json, sys; import core; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('streamlit', 'click', 'typer'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


# -- tolerated special-token differences ------------------------------------------------------------


def _with_specials(tok, rename: dict[str, str] | None = None, add: list[str] | None = None,
                   swap: tuple[str, str] | None = None):
    """A copy of `tok` whose special tokens are renamed in place (same ids) and/or extended, or whose two
    regular tokens `swap` ids."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    rename = rename or {}
    data = json.loads(tok.backend_tokenizer.to_str())
    for entry in data["added_tokens"]:
        entry["content"] = rename.get(entry["content"], entry["content"])
    vocab = data["model"]["vocab"]
    for old, new in rename.items():
        vocab[new] = vocab.pop(old)
    if swap:
        vocab[swap[0]], vocab[swap[1]] = vocab[swap[1]], vocab[swap[0]]
    specials = [rename.get(s, s) for s in ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]]
    eos = rename.get("<|endoftext|>", "<|endoftext|>")
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)), eos_token=eos,
                                   pad_token=eos, additional_special_tokens=specials + (add or []))
    fast.chat_template = tok.chat_template
    for old, new in rename.items():  # a renamed model's template writes its own token strings
        fast.chat_template = fast.chat_template.replace(old, new)
    return fast


def test_renamed_and_added_special_tokens_are_tolerated_and_reported(tiny_tokenizer) -> None:
    renamed = _with_specials(tiny_tokenizer, rename={"<|endoftext|>": "<｜end▁of▁sentence｜>"})
    eos_id = tiny_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert renamed.convert_tokens_to_ids("<｜end▁of▁sentence｜>") == eos_id
    notes = check_same_vocabulary(tiny_tokenizer, renamed)
    assert notes == [f"id {eos_id}: special token '<|endoftext|>' (base) vs '<｜end▁of▁sentence｜>' (reason)"]
    added = _with_specials(tiny_tokenizer, add=["<tool_call>"])
    new_id = added.convert_tokens_to_ids("<tool_call>")
    assert new_id == len(tiny_tokenizer)
    assert check_same_vocabulary(tiny_tokenizer, added) == [f"id {new_id}: special token '<tool_call>' only in the "
                                                             "reason tokenizer"]
    assert check_same_vocabulary(tiny_tokenizer, copy.deepcopy(tiny_tokenizer)) == []


def test_a_regular_token_renamed_still_refuses(tiny_tokenizer) -> None:
    vocab = tiny_tokenizer.get_vocab()
    a, b = [s for s, i in sorted(vocab.items(), key=lambda kv: -kv[1]) if s.isalpha() and len(s) > 2][:2]
    changed = _with_specials(tiny_tokenizer, swap=(a, b))  # two *regular* tokens trade ids
    with pytest.raises(core.VocabularyMismatchError) as err:
        check_same_vocabulary(tiny_tokenizer, changed)
    first, second = sorted([(vocab[a], a, b), (vocab[b], b, a)])
    assert f"id {first[0]}: {first[1]!r} vs {first[2]!r}; id {second[0]}: {second[1]!r} vs {second[2]!r}" in str(err.value)
    assert "special tokens are tolerated" in str(err.value)


def test_pair_with_renamed_specials_loads_and_records_it(tmp_path, tiny_dirs, tiny_tokenizer) -> None:
    import shutil

    odd = tmp_path / "renamed_reason"
    shutil.copytree(tiny_dirs["qwen_reason"], odd)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (odd / name).unlink(missing_ok=True)
    renamed = _with_specials(tiny_tokenizer, rename={"<|im_end|>": "<|end_of_turn|>"})
    renamed.save_pretrained(odd)
    pair = core.load_pair(str(tiny_dirs["qwen_base"]), str(odd), device="cpu", dtype="float32")
    assert len(pair.vocab_notes) == 1 and "'<|end_of_turn|>'" in pair.vocab_notes[0]
    # the reasoner's prompt is rendered by its own tokenizer: its template writes its own end-of-turn token
    end_id = renamed.convert_tokens_to_ids("<|end_of_turn|>")
    assert end_id in pair.prompt_ids("2+2?")["reason"]
    with_base_tokenizer = tiny_tokenizer(renamed.apply_chat_template([{"role": "user", "content": "2+2?"}],
                                         tokenize=False, add_generation_prompt=True), add_special_tokens=False)
    assert end_id not in with_base_tokenizer["input_ids"]  # the base tokenizer would have split it
    trace = core.score(pair, "2+2?", " 4")
    assert trace.meta["pair"]["vocabulary"] == pair.vocab_notes
    assert trace.meta["pair"]["formats"]["reason"]["kind"] == "chat"


def test_reasoner_prompt_uses_its_own_template_when_vocabularies_match(tmp_path, tiny_dirs, tiny_tokenizer) -> None:
    """Base/instruct pairs of one family share a vocabulary but not always a chat template: the reasoner's
    prompt is its own tokenizer's rendering, and a base tokenizer without a template does not stop it."""
    import shutil

    from transformers import AutoTokenizer

    base_dir, reason_dir = tmp_path / "plain_base", tmp_path / "own_reason"
    shutil.copytree(tiny_dirs["qwen_base"], base_dir)
    shutil.copytree(tiny_dirs["qwen_reason"], reason_dir)
    plain = copy.deepcopy(tiny_tokenizer)
    plain.chat_template = None  # a base checkpoint without any chat template
    plain.save_pretrained(base_dir)
    (base_dir / "chat_template.jinja").unlink(missing_ok=True)
    own = copy.deepcopy(tiny_tokenizer)
    own.chat_template = "{% for m in messages %}<|im_start|>{{ m['content'] }} reason template<|im_end|>{% endfor %}"
    own.save_pretrained(reason_dir)
    pair = core.load_pair(str(base_dir), str(reason_dir), device="cpu", dtype="float32")
    assert pair.vocab_notes == [] and pair.formats["reason"].spec == "chat"
    reloaded = AutoTokenizer.from_pretrained(reason_dir)
    expected = reloaded.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False,
                                            add_generation_prompt=True)
    ids = pair.prompt_ids("2+2?")
    assert "reason template" in expected
    assert ids["reason"] == reloaded(expected, add_special_tokens=False)["input_ids"]
    assert "reason template" in pair.decode(ids["reason"])


# -- prompt formats: instructions in the user turn, thinking prefill ---------------------------------


def test_chat_formats_with_user_template_and_prefill(tiny_tokenizer) -> None:
    def text(spec: str) -> str:
        return tiny_tokenizer.decode(PromptFormat(spec).render(tiny_tokenizer, "2+2?"))

    assert text("chat") == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert text("chat:think+think") == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert text("chat+answer").endswith("assistant\n<think>\n\n</think>\n\n")
    assert text("chat:nothink+answer").endswith("assistant\n<think>\n\n</think>\n\n")  # not written twice
    assert text("chat|Be brief.|{problem} Reason step by step.") == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2? Reason step by step.<|im_end|>\n"
        "<|im_start|>assistant\n")
    paper = PromptFormat(load.format_spec("paper-think"))
    assert paper.describe()["prefill"] == "think" and paper.describe()["response_read_as"] == "thinking"
    assert "\\boxed{}" in load.format_spec("paper-base") and "{problem}" in load.format_spec("paper-base")
    with pytest.raises(core.InvalidInputError, match="think, answer"):
        PromptFormat("chat+thinking")
    with pytest.raises(core.InvalidInputError, match="more than one"):
        PromptFormat("chat|{problem}|{problem} again")


def test_named_formats_through_load_pair(tiny_dirs) -> None:
    pair = core.load_pair(str(tiny_dirs["qwen_base"]), str(tiny_dirs["qwen_reason"]), device="cpu",
                          base_format="paper-base", reason_format="paper-think")
    assert pair.formats["base"].spec == load.NAMED_FORMATS["paper-base"]
    base_text = pair.decode(pair.prompt_ids("2+2?")["base"])
    assert base_text.startswith("Question: 2+2?\nPlease reason step by step") and base_text.endswith("Answer:")
    assert pair.decode(pair.prompt_ids("2+2?")["reason"]).endswith("<|im_start|>assistant\n<think>\n")
    assert pair.spec()["formats"]["reason"]["prefill"] == "think"


def test_same_source_twice_is_one_resident_model(tiny_dirs) -> None:
    pair = core.load_pair(str(tiny_dirs["qwen_base"]), str(tiny_dirs["qwen_base"]), device="cpu")
    assert pair.base is pair.reason and pair.vocab_notes == []


def test_thinking_reference_pair(qwen_pair, tiny_dirs, tmp_path) -> None:
    from core.evaluation.thinking import load_thinking

    thinking = load_thinking(qwen_pair, str(tiny_dirs["llama_base"]), "chat:think+think")
    assert thinking.reason is qwen_pair.reason and thinking.specs["base"].id == str(tiny_dirs["llama_base"])
    assert thinking.formats["base"].spec == "chat:think+think"
    assert thinking.fingerprint() != qwen_pair.fingerprint()
    other = build_tiny_tokenizer(["Completely different words: zebra quantum xylophone jazz."] * 3, vocab_size=300)
    odd_dir = build_tiny_model(tmp_path / "odd_thinking", other, "qwen3", seed=7, **TINY)
    with pytest.raises(core.VocabularyMismatchError, match="pair and thinking tokenizers differ"):
        load_thinking(qwen_pair, str(odd_dir))
