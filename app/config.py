"""What the app was started with: `forkpoint app --base X --reason Y --store DIR` (which runs
`streamlit run app/serve.py -- --base X ...`; `streamlit run app/main.py -- ...` takes the same arguments).

Everything after `--` reaches the script as `sys.argv[1:]`. No arguments: the bundled demo pair and
$FORKPOINT_STORE (else ./forkpoint-store). Plain values only; no streamlit here.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from core import settings
from core.errors import InvalidInputError
from core.pair.options import PAIR_OPTIONS, load_pair_arguments


@dataclass(frozen=True)
class PairChoice:
    """Which model pair to load: `demo=True`, or a base and a reasoner (hub id, local dir or .gguf). The fields
    after `demo` are core/pair/options.py PAIR_OPTIONS (a test checks it), defaults from there."""

    demo: bool = True
    base: str = ""  # hub id, local directory or .gguf file
    reason: str = ""
    base_format: str = ""  # "" = core's default ("Question: {problem}\nAnswer:")
    reason_format: str = ""  # "" = the reasoner's chat template when it has one
    base_revision: str = ""  # a hub revision to pin ("" = the default branch)
    reason_revision: str = ""
    device: str = settings.DEVICE  # auto, cpu, cuda, cuda:N
    dtype: str = settings.DTYPE  # auto, float32, bfloat16, float16
    trust_remote_code: bool = False  # only when the user passed --trust-remote-code

    def label(self) -> str:
        """A short human name for the pair."""
        if self.demo:
            return "demo pair"
        return f"{self.base.rstrip('/').rsplit('/', 1)[-1]} | {self.reason.rstrip('/').rsplit('/', 1)[-1]}"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def load_arguments(self) -> dict[str, object]:
        """`core.load_pair`'s keyword arguments for this choice (not the demo pair)."""
        return load_pair_arguments(asdict(self))


@dataclass(frozen=True)
class AppConfig:
    """Start-up settings: the model pair, the trace store and an optional problem file."""

    pair: PairChoice
    store: str | None = None  # None: core.store.default_store_path()
    problems: str | None = None  # None: the demo problems
    max_new_tokens: int | None = None  # generation length (first view, Generate page); None: what the pair allows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamlit run app/main.py --", add_help=False, allow_abbrev=False)
    for o in PAIR_OPTIONS:  # the pair flags, as the CLI's (core/pair/options.py)
        if o.switch:
            p.add_argument(o.flag, action="store_true", help=o.describe())
        else:
            p.add_argument(o.flag, default=o.default, help=o.describe())
    p.add_argument("--store", default=None, help="Trace store directory (default: $FORKPOINT_STORE or ./forkpoint-store).")
    p.add_argument("--problems", default=None, help="Problem file (.jsonl/.json/.csv); default: the demo problems.")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=settings.SETTINGS["max_new_tokens"].help + f" Default: {settings.MAX_NEW_TOKENS}.")
    return p


APP_DIR = Path(__file__).resolve().parent


def script_args(argv: Sequence[str]) -> list[str]:
    """The app's own arguments in a process's command line: what follows app/main.py or app/serve.py (`streamlit
    run` puts the script first); none when another ASGI server serves `app.serve:streamlit_app` (its own flags)."""
    return list(argv[1:]) if argv and Path(argv[0]).resolve().parent == APP_DIR else []


def parse_args(argv: Sequence[str]) -> AppConfig:
    """Parse the script arguments; InvalidInputError (with the usage) on anything unknown or incomplete."""
    parser = _parser()
    args, unknown = parser.parse_known_args(list(argv))
    if unknown:
        valid = [o.flag for o in PAIR_OPTIONS] + ["--store", "--problems", "--max-new-tokens"]
        raise InvalidInputError(f"Unknown app arguments: {' '.join(unknown)}; valid: {' '.join(valid)}")
    if bool(args.base) != bool(args.reason):
        raise InvalidInputError("Give both --base and --reason (or neither, for the demo pair)")
    pair = PairChoice(demo=not args.base, **{o.name: getattr(args, o.name) for o in PAIR_OPTIONS})
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise InvalidInputError(f"--max-new-tokens must be ≥ 1, got {args.max_new_tokens}")
    return AppConfig(pair=pair, store=args.store, problems=args.problems, max_new_tokens=args.max_new_tokens)
