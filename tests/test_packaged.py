"""core.packaged: a wheel (`pip install .`, not editable) ships the demo pair, problem sets and lexicon.

Builds the wheel from a copy of the source (no network: --no-index, --no-build-isolation), installs it
with --no-deps into a fresh venv that reuses this venv's packages through a .pth line, and loads the
demo pair there, away from any checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from core.packaged import CHECKOUT_ASSETS, PACKAGED, STREAMLIT_CONFIG, assets_dir

ROOT = Path(__file__).resolve().parents[1]


def test_a_checkout_reads_the_top_level_assets():
    assert assets_dir() == ROOT / "assets" == CHECKOUT_ASSETS
    assert all((assets_dir() / name).exists() for name in PACKAGED)


def _run(*cmd: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_wheel_install_has_the_demo_pair_problems_and_lexicon(tmp_path):
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("core", "app"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", ".streamlit/config.toml"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    for name in PACKAGED:
        (shutil.copytree if (ROOT / "assets" / name).is_dir() else shutil.copy2)(ROOT / "assets" / name,
                                                                                src / "assets" / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    _run(sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), cwd=tmp_path, env=env)
    wheel = next((tmp_path / "dist").glob("forkpoint-*.whl"))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(_run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                     cwd=tmp_path, env=env).strip())
    (site / "_reuse_test_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch & co, not forkpoint
    _run(str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel), cwd=tmp_path, env=env)

    probe = (
        "import json, core\n"
        "from core.packaged import assets_dir, streamlit_config\n"
        "from core.annotate.planning import DEFAULT_LEXICON, load_lexicon\n"
        "pair = core.demo_pair()\n"
        "print(json.dumps({'core': core.__file__, 'assets': str(assets_dir()), 'problems': len(core.demo_problems()),\n"
        "                  'lexicon': str(DEFAULT_LEXICON), 'lexicon_ok': bool(load_lexicon()),\n"
        "                  'vocab': len(pair.tokenizer), 'streamlit_config': str(streamlit_config()),\n"
        "                  'streamlit_text': streamlit_config().read_text()}))\n"
    )
    seen = json.loads(_run(str(python), "-c", probe, cwd=tmp_path, env=env).strip().splitlines()[-1])
    assert seen["core"].startswith(str(site)) and seen["assets"] == str(site / "core" / "_assets")
    assert seen["lexicon"].startswith(str(site)) and seen["lexicon_ok"]
    assert seen["problems"] == 500 and seen["vocab"] > 0
    assert seen["streamlit_config"].startswith(str(site))  # `forkpoint app` passes it to Streamlit as flags
    assert seen["streamlit_text"] == (ROOT / ".streamlit" / "config.toml").read_text()


def test_setup_py_copies_exactly_what_packaged_names():
    import ast

    tree = ast.parse((ROOT / "setup.py").read_text())
    value = next(node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "PACKAGED" for t in node.targets))
    assert ast.literal_eval(value) == PACKAGED
    config_name = next(node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                       and any(getattr(t, "id", None) == "STREAMLIT_CONFIG" for t in node.targets))
    assert ast.literal_eval(config_name) == STREAMLIT_CONFIG
