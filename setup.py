"""Package data that lives outside the packages: the top-level assets/ (demo pair, problem sets, planning
lexicon) go into the wheel as core/_assets/, where core/packaged.py finds them. Metadata: pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PACKAGED = ("demo", "problems", "planning_lexicon.json")  # = core.packaged.PACKAGED


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


setup(cmdclass={"build_py": BuildWithAssets})
