"""Problem sources by name: a local JSONL / JSON / CSV file, a hub dataset `hf:<id>[:config][:split]` read
through the `datasets` library, or a benchmark short name (gsm8k, math500, aime24, aime25, amc23, olympiadbench:
the paper's six).

Rows become `Problem`s by the same field detection as local files (`core.evaluation.problems`):
GSM8K's answer after "####", MATH-500's `answer` (or the last \\boxed{} of `solution`), AIME's `answer`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from core.errors import InvalidInputError
from core.evaluation.problems import Problem, load_problems, problems_from_rows

log = logging.getLogger(__name__)

HF_PREFIX = "hf:"
# The paper's benchmarks by short name (hub ids as published; override with an explicit hf: source).
BENCHMARKS: dict[str, str] = {
    "gsm8k": "hf:openai/gsm8k:main:test",
    "math500": "hf:HuggingFaceH4/MATH-500::test",
    "aime24": "hf:HuggingFaceH4/aime_2024::train",
    "aime25": "hf:math-ai/aime25::test",
    "amc23": "hf:math-ai/amc23::test",
    "olympiadbench": "hf:math-ai/olympiadbench::test",
}
PREFERRED_SPLITS = ("test", "validation", "train")


def parse_hf(source: str) -> tuple[str, str | None, str | None]:
    """'hf:openai/gsm8k:main:test' -> ('openai/gsm8k', 'main', 'test'); empty parts are None."""
    if not source.startswith(HF_PREFIX):
        raise InvalidInputError(f"not a hub dataset source (needs the {HF_PREFIX} prefix): {source!r}")
    parts = source[len(HF_PREFIX):].split(":")
    if not parts[0] or len(parts) > 3:
        raise InvalidInputError(f"hub dataset source must look like hf:<dataset id>[:config][:split], got {source!r}")
    parts += [""] * (3 - len(parts))
    return parts[0], parts[1] or None, parts[2] or None


def load_source(source: str | Path, *, limit: int | None = None, question_field: str | None = None,
                answer_field: str | None = None, id_field: str | None = None, skip_bad: bool = False) -> list[Problem]:
    """Problems from a benchmark short name (BENCHMARKS), an `hf:` hub dataset, or a local file."""
    text = str(source)
    text = BENCHMARKS.get(text.lower(), text)
    fields = dict(question_field=question_field, answer_field=answer_field, id_field=id_field, limit=limit,
                  skip_bad=skip_bad)
    if text.startswith(HF_PREFIX):
        return load_hf(text, **fields)
    if not Path(text).suffix and not Path(text).exists():
        raise InvalidInputError(f"unknown problem source {text!r}: give a .jsonl/.json/.csv file, "
                                f"hf:<dataset id>[:config][:split], or one of: {', '.join(BENCHMARKS)}")
    return load_problems(text, **fields)


def load_hf(source: str, *, limit: int | None = None, **fields: Any) -> list[Problem]:
    """Problems from a hub dataset (or a local dataset directory) through `datasets.load_dataset`."""
    try:
        import datasets
    except ImportError as err:
        raise InvalidInputError(f"reading {source!r} needs the 'datasets' package: pip install 'forkpoint[hf]'") from err
    dataset_id, config, split = parse_hf(source)
    where = f"{dataset_id!r}" + (f" (config {config!r})" if config else "") + (f", split {split!r}" if split else "")
    try:
        if (Path(dataset_id) / "dataset_dict.json").exists() or (Path(dataset_id) / "state.json").exists():
            data = datasets.load_from_disk(dataset_id)  # a directory written by save_to_disk
        else:
            data = datasets.load_dataset(dataset_id, config, split=split)
    except (ConnectionError, OSError, ValueError, TimeoutError) as err:  # DatasetNotFoundError is a FileNotFoundError
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        offline = bool(getattr(datasets.config, "HF_HUB_OFFLINE", False))
        hint = ("the hub is switched off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) and it is not in the cache"
                if offline else "is the network reachable and the id, config and split right?")
        raise InvalidInputError(f"Could not load hub dataset {where}: {first}. {hint}. Offline, download it once "
                                "with network or pass a local .jsonl/.csv file instead.") from err
    data = _one_split(data, split, source)
    stem = dataset_id.rstrip("/").rsplit("/", 1)[-1]
    return problems_from_rows(((i + 1, dict(row)) for i, row in enumerate(data)), stem, where=source,
                              limit=limit, **fields)


def _one_split(data: Any, split: str | None, source: str) -> Any:
    """A single split: the named one, else test / validation / train, else the only one."""
    if not isinstance(data, Mapping):
        return data
    names = list(data.keys())
    if split is not None:
        if split not in data:
            raise InvalidInputError(f"{source!r} has no split {split!r}; choose one of: {', '.join(names)}")
        return data[split]
    chosen = next((s for s in PREFERRED_SPLITS if s in data), names[0] if len(names) == 1 else None)
    if chosen is None:
        raise InvalidInputError(f"{source!r} has splits {', '.join(names)}; name one: {source}:<split>")
    log.info("reading split %r of %s", chosen, source)
    return data[chosen]


def load_benchmarks(sources: Sequence[str] | Mapping[str, Any], limit: int | None = None,
                    **fields: Any) -> dict[str, list[Problem]]:
    """{benchmark name: problems} from "name=source" strings, bare sources (named by their short name or
    file stem) or a mapping; values that are already lists of problems are kept."""
    items = sources.items() if isinstance(sources, Mapping) else [_split_named(s) for s in sources]
    out: dict[str, list[Problem]] = {}
    for name, src in items:
        if name in out:
            raise InvalidInputError(f"benchmark {name!r} given twice; name them: --problems NAME=SOURCE")
        out[name] = list(src)[:limit] if not isinstance(src, (str, Path)) else load_source(src, limit=limit, **fields)
    return out


def _split_named(spec: str) -> tuple[str, str]:
    """"gsm=hf:openai/gsm8k:main:test" -> ("gsm", ...); "gsm8k" -> ("gsm8k", "gsm8k"); a file -> its stem."""
    name, eq, src = str(spec).partition("=")
    if eq and name and "/" not in name and ":" not in name:
        return name, src
    spec = str(spec)
    if spec.lower() in BENCHMARKS:
        return spec.lower(), spec
    if spec.startswith(HF_PREFIX):
        dataset_id, config, split = parse_hf(spec)
        return dataset_id.rstrip("/").rsplit("/", 1)[-1] + (f"-{config}" if config else ""), spec
    return Path(spec).stem, spec
