"""Every exception forkpoint raises on purpose, in one place.

Layers (CLI, app) catch `ForkpointError` and show its message; anything else is a bug.
"""


class ForkpointError(Exception):
    """Base class: the message says what went wrong and what to do."""


class ModelLoadError(ForkpointError):
    """A model or tokenizer could not be loaded (missing path, unknown hub id, bad GGUF).

    `side` ("base" / "reason", set by `load_pair`) says which one, so an edge can name its flag."""

    side: str | None = None


class VocabularyMismatchError(ForkpointError):
    """The two tokenizers do not map the same strings to the same ids."""


class InvalidInputError(ForkpointError, ValueError):
    """An argument is out of range or of the wrong kind (names the value and the valid choices)."""


class PairMismatchError(ForkpointError):
    """A trace was made with a different model pair than the one given."""


class StoreError(ForkpointError):
    """A trace store problem (unreadable file, newer schema, missing key)."""


class WriteError(ForkpointError, OSError):
    """A file could not be written (disk full, file-size limit, no permission); names the file and what was kept."""


class OutputExistsError(ForkpointError, FileExistsError):
    """An output file already exists and replacing it was not asked for (names the file and the flag to pass)."""


class GradingError(ForkpointError):
    """The answer checker could not run (e.g. the math-verify worker process did not start)."""


class GenerationCancelled(ForkpointError):
    """The caller's `should_stop` asked to stop; nothing was stored."""


class ExecutorError(ForkpointError):
    """A scale-out back-end problem: Ray missing or unreachable, or a batch that failed on every retry."""
