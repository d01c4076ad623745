"""`forkpoint ...`: the command line. Each module turns flags into core arguments, calls core and shows
the result; core exceptions become clean CLI errors at this edge (no tracebacks for user mistakes)."""

from core.cli import app, evaluation, gates, instruments, search, store, traces  # noqa: F401  (each registers its commands on `main`)
from core.cli.common import main

__all__ = ["main"]
