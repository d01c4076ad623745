"""Package data that lives outside the packages: the top-level assets/ (demo pair, problem sets, planning
lexicon) and the app's .streamlit/config.toml go into the wheel as core/_assets/, where core/packaged.py finds
them. Metadata: pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PACKAGED = ("demo", "problems", "planning_lexicon.json")  # = core.packaged.PACKAGED
STREAMLIT_CONFIG = "streamlit_config.toml"  # = core.packaged.STREAMLIT_CONFIG: .streamlit/config.toml in the wheel


class BuildWithAssets(build_py):
    """build_py, then a copy of the shipped assets into the built core package."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "core" / "_assets"
        for name in PACKAGED:
            source = ROOT / "assets" / name
            if source.is_dir():
                shutil.copytree(source, target / name, dirs_exist_ok=True)
            elif source.is_file():
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / name)
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / ".streamlit" / "config.toml", target / STREAMLIT_CONFIG)


setup(cmdclass={"build_py": BuildWithAssets})
