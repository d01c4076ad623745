"""The bundled demo pair and its held-out problems: load them like any other pair, no hub needed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.errors import InvalidInputError, ModelLoadError
from core.evaluation.problems import load_problems
from core.packaged import assets_dir
from core.pair.loading import load_pair

DEMO_DIR = assets_dir() / "demo"  # the checkout's assets/, or the wheel's package data (core/packaged.py)
PROBLEMS_DIR = assets_dir() / "problems"
SPLITS = {"test": "demo_test.jsonl", "calib": "demo_calib.jsonl"}


def demo_formats(demo_dir: str | Path = DEMO_DIR) -> dict[str, str]:
    """The pair's prompt formats from pair.json: {"base_format": ..., "reason_format": ...}."""
    path = Path(demo_dir) / "pair.json"
    if not path.exists():
        raise ModelLoadError(f"No demo pair at {Path(demo_dir)} (missing pair.json); run `forkpoint demo train`")
    data = json.loads(path.read_text())
    return {"base_format": data["base_format"], "reason_format": data["reason_format"]}


def demo_pair(device: str = "cpu", dtype: str = "float32", demo_dir: str | Path = DEMO_DIR, *,
              base_format: str | None = None, reason_format: str | None = None) -> Any:
    """The demo base / reasoning pair as a `core.ModelPair`, loaded through `core.load_pair`; the formats
    default to the ones it was trained with (pair.json), and given ones are applied as for any pair."""

    demo_dir = Path(demo_dir)
    formats = demo_formats(demo_dir)
    formats.update({k: v for k, v in (("base_format", base_format), ("reason_format", reason_format)) if v is not None})
    return load_pair(demo_dir / "base", demo_dir / "reason", device=device, dtype=dtype, **formats)


def demo_problems(split: str = "test", limit: int | None = None) -> list[Any]:
    """The demo task's problems of `split` as `core.Problem` records (prompt, gold)."""

    if split not in SPLITS:
        raise InvalidInputError(f"Unknown demo split {split!r}; choose one of: {', '.join(SPLITS)}")
    return load_problems(PROBLEMS_DIR / SPLITS[split], limit=limit)


def write_problems(path: str | Path, problems: list[dict]) -> Path:
    """Write problems as JSONL with the public fields id, question, answer (one per line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for p in problems:
            fh.write(json.dumps({"id": p["id"], "question": p["question"], "answer": p["answer"]}) + "\n")
    return path
