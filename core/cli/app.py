"""forkpoint app | demo: the Streamlit app and the bundled demo pair."""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path
from typing import Any

import click

from core.cli.common import (
    StageBars,
    fail_cleanly,
    main,
    pair_options,
    setting_option,
    store_option,
)
from core.packaged import streamlit_config
from core.pair.options import PAIR_OPTIONS

ROOT = Path(__file__).resolve().parents[2]  # holds app/ (a checkout, or site-packages for a wheel)


@main.group()
def demo() -> None:
    """The bundled demo model pair."""


@demo.command(name="train")
@click.option("--out", type=click.Path(file_okay=False), help="Output directory (default: assets/demo).")
@click.option("--size", type=click.Choice(["full", "tiny"]), default="full", show_default=True,
              help="full: the bundled demo pair (minutes); tiny: a toy network in a few steps (seconds, for tests).")
@setting_option("seed", help="Seed of the training: initial weights and the synthetic training corpora.")
@fail_cleanly
def demo_train(out: str | None, size: str, seed: int) -> None:
    """Train the demo base / reasoning pair on the synthetic task (CPU, minutes)."""
    from core.demo.pair import DEMO_DIR
    from core.demo.train import train_demo_pair

    bars = StageBars(unit="step", prefix="train ")
    try:
        train_demo_pair(out or DEMO_DIR, size=size, seed=seed, progress=bars)
    finally:
        bars.close()


# The flags the app forwards to app/main.py (app/config.py parses them on the Streamlit side): the pair's
# (core/pair/options.py, the switch --trust-remote-code apart), the store and the problems.
_FORWARDED = (*(o.name for o in PAIR_OPTIONS if not o.switch), "store_path", "problems")


@main.command(context_settings={"ignore_unknown_options": False})
@pair_options
@store_option
@click.option("--problems", default=None, help="Problem file (.jsonl/.json/.csv); default: the demo problems.")
@setting_option("max_new_tokens", default=None,
                help="Most response tokens to generate [default: 256, or half the pair's context when less: 96 on "
                     "the demo pair].")
@click.option("--port", type=click.IntRange(1, 65535), default=8501, show_default=True, help="TCP port, 1-65535.")
@click.option("--address", default="127.0.0.1", show_default=True, callback=lambda ctx, param, value: _check_address(
    value, ctx, param), help="Bind address (localhost by default).")
def app(max_new_tokens: int, port: int, address: str, trust_remote_code: bool, **opts: Any) -> None:
    """Start the Streamlit app: `forkpoint app --base X --reason Y` (the demo pair without them)."""
    import signal
    import subprocess

    if bool(opts.get("base")) != bool(opts.get("reason")):
        raise click.UsageError("Give both --base and --reason (or neither, for the demo pair)")
    app_args: list[str] = []
    for name in _FORWARDED:
        if opts.get(name):
            app_args += ["--" + name.removesuffix("_path").replace("_", "-"), str(opts[name])]
    app_args += (["--max-new-tokens", str(max_new_tokens)] if max_new_tokens is not None else []) + (
        ["--trust-remote-code"] if trust_remote_code else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen(streamlit_command(address, port, app_args), env=env)

    def stop(signum: int, _frame: object) -> None:  # SIGTERM/SIGINT to us stops Streamlit too
        child.send_signal(signal.SIGTERM)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        code = child.wait()
    except KeyboardInterrupt:
        child.send_signal(signal.SIGTERM)
        code = child.wait()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    raise SystemExit(code)


# Streamlit options `forkpoint app` sets from its own flags, not from the config file
_FROM_FLAGS = ("server.address", "server.port", "server.allowedHosts")


def streamlit_command(address: str, port: int, app_args: list[str]) -> list[str]:
    """`streamlit run app/serve.py` as `forkpoint app` runs it (app/serve.py is an st.App around app/main.py: the
    live route, and a Host check on plain HTTP). Every option of the app's Streamlit settings
    (`core.packaged.streamlit_config()`, .streamlit/config.toml) goes as a flag, since Streamlit reads that file
    only from the working directory: started anywhere else, or from a wheel, the app would show tracebacks in the
    browser, watch its source files and lose its theme. Then the bind address, the port and the Hosts allowed."""
    flags: list[str] = []
    for name, value in _config_options().items():
        if name not in _FROM_FLAGS:
            for one in value if isinstance(value, list) else [value]:
                flags += [f"--{name}", str(one).lower() if isinstance(one, bool) else str(one)]
    return [sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "serve.py"), *flags, "--server.address", address,
            "--server.port", str(port), *_allowed_hosts(address), "--", *app_args]


def _config_options() -> dict[str, Any]:
    """The app's Streamlit settings as {"section.option": value} (a nested table, e.g. [theme.sidebar], as
    "theme.sidebar.option")."""

    def flat(table: dict[str, Any], prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in table.items():
            out.update(flat(value, f"{prefix}{name}.") if isinstance(value, dict) else {prefix + name: value})
        return out

    with open(streamlit_config(), "rb") as fh:
        return flat(tomllib.load(fh), "")


def _check_address(address: str, ctx: click.Context | None = None, param: click.Parameter | None = None) -> str:
    """--address checked before Streamlit starts: it must resolve and be an address of this machine (a bind
    probe on a free port), else a usage error naming the flag instead of the server's traceback."""
    import socket

    if address in ("", "0.0.0.0", "::"):
        return address
    try:
        family, kind, _, _, where = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise click.BadParameter(f"{address!r} is not an address or host name this machine can resolve ({why}); "
                                 "use 127.0.0.1 (the default), localhost, or one of this machine's addresses",
                                 ctx, param) from None
    try:
        with socket.socket(family, kind) as probe:
            probe.bind((where[0], 0))
    except OSError as exc:
        raise click.BadParameter(f"cannot listen on {address!r}: {exc.strerror or exc} (it is not an address of "
                                 "this machine); use 127.0.0.1 (the default) or one of this machine's addresses",
                                 ctx, param) from None
    return address


def _allowed_hosts(address: str) -> list[str]:
    """`--server.allowedHosts` flags: the WebSocket (Streamlit) and every plain HTTP request (app/host_guard.py's
    HostGuard) refuse any Host header but the bound address (and the loopback names when bound to
    loopback), which stops DNS rebinding (a page at attacker.example whose name re-resolves to 127.0.0.1).
    Binding 0.0.0.0 / :: accepts any Host ("*"): then the network must protect."""
    if address in ("0.0.0.0", "::", ""):
        return ["--server.allowedHosts", "*"]
    hosts = [address]
    if address in ("127.0.0.1", "localhost", "::1"):
        hosts += ["localhost", "127.0.0.1", "::1"]
    out: list[str] = []
    for host in dict.fromkeys(hosts):
        out += ["--server.allowedHosts", host]
    return out
