"""Where the files forkpoint ships live: the demo pair, its problem sets, the planning lexicon and the app's
Streamlit settings.

In a checkout (and an editable install) they are the repository's top-level `assets/`. A wheel carries
them as package data under `core/_assets/` (setup.py's build step copies them there, and .streamlit/config.toml
as `STREAMLIT_CONFIG`), found through `importlib.resources`, so `pip install .` has the demo too.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

CHECKOUT_ASSETS = Path(__file__).resolve().parents[1] / "assets"
PACKAGED = ("demo", "problems", "planning_lexicon.json")  # what a wheel ships (not the README screenshot)
CHECKOUT_STREAMLIT_CONFIG = Path(__file__).resolve().parents[1] / ".streamlit" / "config.toml"
STREAMLIT_CONFIG = "streamlit_config.toml"  # the app's Streamlit settings, by this name in a wheel's core/_assets


def assets_dir() -> Path:
    """The folder holding demo/, problems/ and planning_lexicon.json: the checkout's, else the wheel's."""
    if CHECKOUT_ASSETS.is_dir():
        return CHECKOUT_ASSETS
    return Path(str(resources.files("core") / "_assets"))


def streamlit_config() -> Path:
    """The app's Streamlit settings (.streamlit/config.toml): the checkout's, else the wheel's copy."""
    if CHECKOUT_STREAMLIT_CONFIG.is_file():
        return CHECKOUT_STREAMLIT_CONFIG
    return Path(str(resources.files("core") / "_assets" / STREAMLIT_CONFIG))


def is_installed(path: str | Path) -> bool:
    """Whether `path` lies inside the installed package's shipped files (a wheel's core/_assets): forkpoint
    never writes there (a reinstall would replace it, and it may be shared or read-only)."""
    packaged = Path(str(resources.files("core") / "_assets")).resolve()
    try:
        Path(path).resolve().relative_to(packaged)
    except ValueError:
        return False
    return True
