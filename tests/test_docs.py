"""The docs tell the truth about the tree: every module is named with its job, no file cites one outside the repo,
and the README's commands are the ones CI runs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in out.splitlines() if line and (ROOT / line).exists()]


def _modules() -> list[str]:
    files = [p for p in _tracked("core", "app") if p.suffix in (".py", ".js", ".css")]
    return sorted(str(p.relative_to(ROOT)) for p in files if p.name not in ("__init__.py", "__main__.py"))


@pytest.mark.parametrize("module", _modules())
def test_architecture_names_every_module(module: str) -> None:
    # a table row names the module by its path below core/ or app/, e.g. `decoding/engine.py`
    short = module.split("/", 1)[1]
    assert f"`{module}`" in ARCHITECTURE or f"`{short}`" in ARCHITECTURE, (
        f"docs/ARCHITECTURE.md does not name {module}; add a row with its one job")


def test_architecture_names_no_missing_module() -> None:
    named = set(re.findall(r"`((?:core|app)/[\w/]+\.(?:py|js|css))`", ARCHITECTURE))
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/ARCHITECTURE.md names modules that do not exist: {missing}"


OUTSIDE = re.compile(r"\b(DESIGN\.md|REFERENCE\.md|STYLE\.md|DEVELOPERS\.md)\b|\.\./shared\b")


def test_no_file_cites_a_file_outside_the_repository() -> None:
    files = [p for p in _tracked() if p.suffix in (".py", ".md", ".js", ".toml", ".cfg", ".txt") and p.is_file()]
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in files
            for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), start=1)
            if OUTSIDE.search(line) and p.name != "test_docs.py"]
    assert not hits, f"these lines cite files that are not in the repository: {hits}"


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = re.findall(r"```bash\n(.+?)\n```", readme, flags=re.S)
    test_commands = [c for c in commands if "pytest" in c]
    assert len(test_commands) == 1, "the README has exactly one test command"
    assert test_commands[0].strip() in ci, ".ci/run must run the README's test command word for word"


def test_reliability_names_only_tests_that_exist() -> None:
    """docs/RELIABILITY.md says how each promise is tested: every test it names must exist."""
    text = (ROOT / "docs" / "RELIABILITY.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(test_\w+)`", text))
    defined = {m for p in (ROOT / "tests").glob("test_*.py") for m in re.findall(r"^def (test_\w+)", p.read_text(
        encoding="utf-8"), re.M)}  # fmt: skip
    assert len(named) >= 40 and not named - defined, sorted(named - defined)


# -- issue 33.10: the README's code and the example notebook run as written ------------------------------------

SKIP_MARK = "<!-- readme-test: skip"  # the one way a README block is left out; only for real hub downloads


def readme_blocks() -> list[tuple[bool, str]]:
    """(skipped, code) of every ```python block of the README, in order."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return [(bool(mark), code) for mark, code in
            re.findall(r"(" + re.escape(SKIP_MARK) + r"[^>]*-->\n)?```python\n(.+?)\n```", readme, flags=re.S)]


def _loads_hub_models(code: str) -> bool:
    return bool(re.search(r"load_pair\(\s*\"[\w.-]+/[\w.-]+\"", code))


def test_readme_skips_only_blocks_that_download_hub_models() -> None:
    blocks = readme_blocks()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(blocks) == readme.count("```python") >= 3  # every python block is seen
    assert [skipped for skipped, _ in blocks] == [_loads_hub_models(code) for _, code in blocks]
    assert readme.count(SKIP_MARK) == sum(skipped for skipped, _ in blocks)  # no stray marker


@pytest.mark.slow
def test_every_readme_python_block_runs_in_order() -> None:
    """As a reader runs them, one after another in one session (the hub block skipped: the demo pair stays)."""
    import core

    namespace: dict = {}
    for i, (skipped, code) in enumerate(readme_blocks()):
        if not skipped:
            exec(compile(code, f"README.md python block {i + 1}", "exec"), namespace)  # noqa: S102
    assert isinstance(namespace["trace"], core.Trace) and len(namespace["problems"]) >= 1
    guided, child, trace = namespace["guided"], namespace["child"], namespace["trace"]
    # the examples show what their comments say on the demo pair (a switch where the models agree would give the
    # parent back and show nothing): Guided's takeover at 15 switched off, four distinct sampled children
    assert guided.source[15] == "reason" and child.meta["parent"] == guided.key and child.source[15] == "base"
    fan = namespace["fan"]
    assert len({c.key for c in fan}) == 4 and all(c.meta["parent"] == trace.key for c in fan)
    edited = namespace["edited"]
    assert edited.meta["parent"] == guided.key and "forced" in {str(s) for s in edited.source}
    assert len(namespace["table"])


@pytest.mark.slow
def test_the_example_notebook_runs_top_to_bottom_and_says_it_needs_the_notebook_extra() -> None:
    import json

    notebook = json.loads((ROOT / "docs" / "example.ipynb").read_text(encoding="utf-8"))
    cells = notebook["cells"]
    assert "forkpoint[notebook]" in "".join(cells[0]["source"])
    namespace: dict = {}
    for i, cell in enumerate(c for c in cells if c["cell_type"] == "code"):
        code = "".join(cell["source"])
        assert not re.search(r"^\s*[%!]", code, re.M), "a magic would not run outside Jupyter"
        exec(compile(code, f"docs/example.ipynb code cell {i + 1}", "exec"), namespace)  # noqa: S102
    assert namespace["flip_changes"](namespace["trace"])  # the example's problem has a token where they differ
    assert len(namespace["w"].branches) == 2 and namespace["comp"] is not None  # the reasoner's branch and a forced one
