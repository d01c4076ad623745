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
