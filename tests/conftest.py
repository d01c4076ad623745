"""Shared fixtures: tiny random model pairs, built once per session and loaded through `core.load_pair`.

Building writes HF-format directories (safetensors + tokenizer) into a session tmp dir, so the pairs
take exactly the path users' models take. Each pair is a `core.ModelPair` on CPU in float32.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import core

# Tiny models: one thread is much faster than two (and than two under a busy machine's contention).
torch.set_num_threads(1)
from core.demo.tiny import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(autouse=True)
def _torch_stays_on_one_thread():
    """Every test leaves torch on the one thread set above: a leaked count makes every later test of the worker
    contend with the other worker for both cores (core.demo.train once left 2 behind)."""
    yield
    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)
        pytest.fail(f"the test left torch on {threads} threads (something set it and did not restore it)")


# Cheap on purpose: hidden 64, 2 layers; the tokenizer has 400 entries.
TINY = {"hidden": 64, "layers": 2}
LLAMA_PAD = 37  # rows of embedding padding past the tokenizer (real checkpoints pad to a multiple of 64/128)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The byte-level BPE tokenizer (with chat template) every tiny model is saved with."""
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, tiny_tokenizer) -> dict[str, Path]:
    """Saved model directories: qwen_base, qwen_reason (Qwen3), llama_base, llama_reason (Llama, padded vocab)."""
    root = tmp_path_factory.mktemp("tiny_models")
    tok = tiny_tokenizer
    pad = len(tok) + LLAMA_PAD
    return {
        "qwen_base": build_tiny_model(root / "qwen_base", tok, "qwen3", seed=0, **TINY),
        "qwen_reason": build_tiny_model(root / "qwen_reason", tok, "qwen3", seed=1, **TINY),
        "llama_base": build_tiny_model(root / "llama_base", tok, "llama", seed=2, pad_vocab_to=pad, **TINY),
        "llama_reason": build_tiny_model(root / "llama_reason", tok, "llama", seed=3, pad_vocab_to=pad, **TINY),
    }


def _load(base: Path, reason: Path, **kwargs) -> core.ModelPair:
    return core.load_pair(str(base), str(reason), device="cpu", dtype="float32", **kwargs)


@pytest.fixture(scope="session")
def qwen_pair(tiny_dirs) -> core.ModelPair:
    """Tiny Qwen3 base + reasoner (different random weights); base format raw, reasoner 'chat'."""
    return _load(tiny_dirs["qwen_base"], tiny_dirs["qwen_reason"])


@pytest.fixture(scope="session")
def llama_pair(tiny_dirs) -> core.ModelPair:
    """Tiny Llama pair whose embedding has LLAMA_PAD rows past the tokenizer (must be truncated)."""
    return _load(tiny_dirs["llama_base"], tiny_dirs["llama_reason"])


@pytest.fixture(scope="session")
def self_pair(tiny_dirs) -> core.ModelPair:
    """The Qwen3 base model paired with itself under one prompt format: KL = 0 at every position."""
    fmt = "Question: {problem}\nAnswer:"
    return _load(tiny_dirs["qwen_base"], tiny_dirs["qwen_base"], base_format=fmt, reason_format=fmt)


@pytest.fixture(scope="session")
def float64_models():
    """Cache of float64 deep copies of models (keyed by id), for brute-force references."""
    cache: dict[int, tuple[object, object]] = {}  # id -> (the model, kept alive so ids are not reused; its copy)

    def get(model):
        if id(model) not in cache:
            cache[id(model)] = (model, copy.deepcopy(model).double())
        return cache[id(model)][1]

    return get


# The heaviest test files, heaviest first (`pytest --durations=60` on 2 cores). With `--dist loadfile` each file
# runs on one worker, in the order collected, so a heavy file collected late holds the whole run up at its end
# while the other worker idles; collecting these first lets the light files fill in around them.
HEAVY_FIRST = ("test_scale_ray.py", "test_journeys.py", "test_long_cot.py", "test_switchboard.py", "test_gguf.py",
               "test_reproduce.py", "test_scale.py", "test_notebook.py", "test_browser.py", "test_demo.py",
               "test_packaged.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Collect the heavy files first (stable within a file); see HEAVY_FIRST."""
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# JS: what a failing browser test's page holds, for the report (a blank page: is Streamlit's app there, empty, or gone?)
PAGE_STATE_JS = """() => {
  const n = (sel) => document.querySelectorAll(sel).length, body = document.body;
  const flat = (el) => el ? el.innerText.replace(/\\s+/g, " ").trim() : "";
  const text = flat(body), main = flat(document.querySelector('[data-testid="stMain"]'));
  return [`url ${location.href}`, `readyState ${document.readyState}, title ${JSON.stringify(document.title)}`,
    `#root children ${n("#root > *")}, stApp ${n('[data-testid="stApp"]')}, stMain ${n('[data-testid="stMain"]')}, `
      + `stSidebar ${n('[data-testid="stSidebar"]')}, elements ${n("*")}, stale ${n('[data-stale="true"]')}`,
    `body text (${text.length} chars): ${text.slice(0, 300)}`,
    `main text: ${main.slice(0, 2500)}`,
    `runs (s: ask, start, end <status>): ${window.__fpRuns ? window.__fpRuns.log.join(" · ") : "not watched"}`].join("\\n");
}"""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A browser test that fails leaves a screenshot of its page and its console in test-output/failures/, and the
    console's end and the page's state (PAGE_STATE_JS) in the report, which a CI log keeps: a flake in CI can then be
    read from what the page showed, not guessed."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    args = getattr(item, "funcargs", {}).values()
    pages = [v for arg in args for v in (arg if isinstance(arg, tuple) else (arg,)) if type(v).__name__ == "Page"]
    for i, page in enumerate(pages):
        out = Path(__file__).resolve().parents[1] / "test-output" / "failures"
        out.mkdir(parents=True, exist_ok=True)
        try:
            said = getattr(page, "console_log", [])  # tests/browser.py: the page's console and uncaught errors
            (out / f"{item.name[:100]}-{i}.console.txt").write_text("\n".join(said[-200:]) + "\n", encoding="utf-8")
            report.sections.append(("page console (last 40)", "\n".join(said[-40:]) or "(nothing)"))
            page.wait_for_function("() => true", timeout=5_000)  # a hung page raises here instead of hanging below
            report.sections.append(("page state", page.evaluate(PAGE_STATE_JS)))
            page.screenshot(path=str(out / f"{item.name[:100]}-{i}.png"), full_page=True, timeout=10_000)
        except Exception as exc:  # noqa: BLE001  a closed or hung page: the test's own failure is what counts
            report.sections.append(("failure screenshot", f"not taken: {exc}"))
