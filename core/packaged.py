"""Where the files forkpoint ships live: the demo pair, its problem sets and the planning lexicon.

In a checkout (and an editable install) they are the repository's top-level `assets/`. A wheel carries
them as package data under `core/_assets/` (setup.py's build step copies them there), found through
`importlib.resources`, so `pip install .` has the demo too.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

CHECKOUT_ASSETS = Path(__file__).resolve().parents[1] / "assets"
PACKAGED = ("demo", "problems", "planning_lexicon.json")  # what a wheel ships (not the README screenshot)


def assets_dir() -> Path:
    """The folder holding demo/, problems/ and planning_lexicon.json: the checkout's, else the wheel's."""
    if CHECKOUT_ASSETS.is_dir():
        return CHECKOUT_ASSETS
    return Path(str(resources.files("core") / "_assets"))


def is_installed(path: str | Path) -> bool:
    """Whether `path` lies inside the installed package's shipped files (a wheel's core/_assets): forkpoint
    never writes there (a reinstall would replace it, and it may be shared or read-only)."""
    packaged = Path(str(resources.files("core") / "_assets")).resolve()
    try:
        Path(path).resolve().relative_to(packaged)
    except ValueError:
        return False
    return True
