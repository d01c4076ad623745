"""Every exception forkpoint raises on purpose, in one place.

Layers (CLI, app) catch `ForkpointError` and show its message; anything else is a bug.
"""


class ForkpointError(Exception):
    """Base class: the message says what went wrong and what to do."""


class ModelLoadError(ForkpointError):
    """A model or tokenizer could not be loaded (missing path, unknown hub id, bad GGUF)."""


class VocabularyMismatchError(ForkpointError):
    """The two tokenizers do not map the same strings to the same ids."""


class InvalidInputError(ForkpointError, ValueError):
    """An argument is out of range or of the wrong kind (names the value and the valid choices)."""


class PairMismatchError(ForkpointError):
    """A trace was made with a different model pair than the one given."""


class StoreError(ForkpointError):
    """A trace store problem (unreadable file, newer schema, missing key)."""


class GenerationCancelled(ForkpointError):
    """The caller's `should_stop` asked to stop; nothing was stored."""
