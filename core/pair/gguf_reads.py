"""One parse of a GGUF file per pair load.

transformers parses a .gguf anew for its tokenizer, its config and its weights (`load_gguf_checkpoint` builds
a `gguf.GGUFReader` each time), and a parse reads every metadata field, the vocabulary's tens of thousands of
strings among them: seconds each, three times over. Mapping the weights' names then builds gguf's name table
(`get_tensor_name_map`, every block's names) again for each of the model's few hundred modules. Inside
`one_parse()` both are shared: the first call for a file (or an architecture) builds it, later ones get the
same read-only object (a memory-mapped reader; a lookup table).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Iterator
from typing import Any

# what the `one_parse()` block this context is in has built (key -> reader or name table); None outside one, so
# another thread's loads, which run in their own context, parse as transformers always does
_BUILT: contextvars.ContextVar[dict[tuple, Any] | None] = contextvars.ContextVar("forkpoint_gguf_built", default=None)
_LOCK = threading.Lock()
_ACTIVE: dict[str, Any] = {"depth": 0, "originals": None}  # the open blocks over all threads; gguf's own functions


def _shared_reader(path: Any, *args: Any, **kwargs: Any) -> Any:
    """`gguf.GGUFReader(path)`, reusing this block's reader of the same unchanged file."""
    original = _ACTIVE["originals"]["GGUFReader"]
    built = _BUILT.get()
    if built is None or args or kwargs:  # outside a block, or another mode than transformers' read-only one
        return original(path, *args, **kwargs)
    stat = os.stat(path)
    key = ("reader", os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    if key not in built:
        built[key] = original(path)
    return built[key]


def _shared_name_map(arch: Any, n_blocks: int) -> Any:
    """`gguf.get_tensor_name_map(arch, n_blocks)` (a pure function of its arguments), built once per block."""
    original = _ACTIVE["originals"]["get_tensor_name_map"]
    built = _BUILT.get()
    if built is None:
        return original(arch, n_blocks)
    key = ("name_map", arch, int(n_blocks))
    if key not in built:
        built[key] = original(arch, n_blocks)
    return built[key]


_SHARED = {"GGUFReader": _shared_reader, "get_tensor_name_map": _shared_name_map}


@contextlib.contextmanager
def one_parse() -> Iterator[None]:
    """Within the block, the GGUFReaders of one file are one parse and gguf's name table of one architecture is
    built once (transformers imports both names from `gguf` at each call); outside it `gguf` has its own
    functions back. Nested and concurrent blocks are fine."""
    try:
        import gguf  # heavy and optional (forkpoint[gguf]): only a pair with a .gguf enters this block
    except ImportError:  # the loader names the missing package itself (`_check_gguf_deps`)
        yield
        return
    with _LOCK:
        if _ACTIVE["depth"] == 0:
            _ACTIVE["originals"] = {name: getattr(gguf, name) for name in _SHARED}
            for name, shared in _SHARED.items():
                setattr(gguf, name, shared)
        _ACTIVE["depth"] += 1
    token = _BUILT.set({} if _BUILT.get() is None else _BUILT.get())
    try:
        yield
    finally:
        _BUILT.reset(token)
        with _LOCK:
            _ACTIVE["depth"] -= 1
            if _ACTIVE["depth"] == 0:
                for name, original in _ACTIVE["originals"].items():
                    setattr(gguf, name, original)
                _ACTIVE["originals"] = None
