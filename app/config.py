"""What the app was started with: `forkpoint app --base X --reason Y --store DIR` (which runs
`streamlit run app/main.py -- --base X ...`).

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


@dataclass(frozen=True)
class PairChoice:
    """Which model pair to load: `demo=True`, or a base and a reasoner (hub id, local dir or .gguf)."""

    demo: bool = True
    base: str = ""  # hub id, local directory or .gguf file
    reason: str = ""
    base_format: str = ""  # "" = core's default ("Question: {problem}\nAnswer:")
    reason_format: str = ""  # "" = the reasoner's chat template when it has one
    device: str = "auto"  # auto, cpu, cuda, cuda:N
    dtype: str = "auto"  # auto, float32, bfloat16, float16
    base_revision: str = ""  # a hub revision to pin ("" = the default branch)
    reason_revision: str = ""
    trust_remote_code: bool = False  # only when the user passed --trust-remote-code

    def label(self) -> str:
        """A short human name for the pair."""
        if self.demo:
            return "demo pair"
        return f"{self.base.rstrip('/').rsplit('/', 1)[-1]} | {self.reason.rstrip('/').rsplit('/', 1)[-1]}"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class AppConfig:
    """Start-up settings: the model pair, the trace store and an optional problem file."""

    pair: PairChoice
    store: str | None = None  # None: core.store.default_store_path()
    problems: str | None = None  # None: the demo problems
    max_new_tokens: int | None = None  # generation length (first view, Generate page); None: what the pair allows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamlit run app/main.py --", add_help=False, allow_abbrev=False)
    p.add_argument("--base", default="", help="Base model: hub id, local directory or .gguf file.")
    p.add_argument("--reason", default="", help="Reasoning model: hub id, local directory or .gguf file.")
    p.add_argument("--base-format", default="", help="Base prompt format (a template with {problem}, or chat).")
    p.add_argument("--reason-format", default="", help="Reasoning prompt format (default: its chat template).")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N.")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16.")
    p.add_argument("--base-revision", default="", help="Pin the base model to a hub revision.")
    p.add_argument("--reason-revision", default="", help="Pin the reasoning model to a hub revision.")
    p.add_argument("--trust-remote-code", action="store_true", help="Run model code from the hub (only if you trust it).")
    p.add_argument("--store", default=None, help="Trace store directory (default: $FORKPOINT_STORE or ./forkpoint-store).")
    p.add_argument("--problems", default=None, help="Problem file (.jsonl/.json/.csv); default: the demo problems.")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=settings.SETTINGS["max_new_tokens"].help + " Default: that setting, capped to the pair's context.")
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
        raise InvalidInputError(
            f"Unknown app arguments: {' '.join(unknown)}; valid: --base --reason --base-format --reason-format "
            "--base-revision --reason-revision --trust-remote-code --device --dtype --store --problems --max-new-tokens"
        )
    if bool(args.base) != bool(args.reason):
        raise InvalidInputError("Give both --base and --reason (or neither, for the demo pair)")
    pair = PairChoice(
        demo=not args.base, base=args.base, reason=args.reason, base_format=args.base_format,
        reason_format=args.reason_format, device=args.device, dtype=args.dtype, base_revision=args.base_revision,
        reason_revision=args.reason_revision, trust_remote_code=args.trust_remote_code,
    )
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise InvalidInputError(f"--max-new-tokens must be ≥ 1, got {args.max_new_tokens}")
    return AppConfig(pair=pair, store=args.store, problems=args.problems, max_new_tokens=args.max_new_tokens)
