"""forkpoint app | demo: the Streamlit app and the bundled demo pair."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from core.cli.common import _fail_cleanly, main


@main.group()
def demo() -> None:
    """The bundled demo model pair."""


@demo.command(name="train")
@click.option("--out", type=click.Path(file_okay=False), help="Output directory (default: assets/demo).")
@click.option("--size", type=click.Choice(["full", "tiny"]), default="full", show_default=True)
@click.option("--seed", default=0, show_default=True)
@_fail_cleanly
def demo_train(out: str | None, size: str, seed: int) -> None:
    """Train the demo base / reasoning pair on the synthetic task (CPU, minutes)."""
    from core.demo.pair import DEMO_DIR
    from core.demo.train import train_demo_pair

    train_demo_pair(out or DEMO_DIR, size=size, seed=seed, progress=True)


@main.command()
@click.option("--port", default=8501, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True, help="Bind address (localhost by default).")
@click.argument("app_args", nargs=-1, type=click.UNPROCESSED)
def app(port: int, address: str, app_args: tuple[str, ...]) -> None:
    """Start the Streamlit app (demo pair unless --base/--reason follow after --)."""
    import subprocess

    main_py = Path(__file__).resolve().parents[2] / "app" / "main.py"
    cmd = [sys.executable, "-m", "streamlit", "run", str(main_py), "--server.address", address,
           "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
           "--", *app_args]
    raise SystemExit(subprocess.call(cmd))


