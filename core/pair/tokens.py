"""Token display strings: what each response token shows, so that joining them gives the decoded text.

Byte-level BPE can split one character over several tokens; such a character is shown on the token
that completes it (the earlier pieces show nothing), as streaming decoders do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.errors import InvalidInputError

REPLACEMENT = "\ufffd"
_WINDOW = 6  # tokens of left context; enough for any UTF-8 character (at most 4 bytes)


def _context_start(shown: Sequence[str]) -> tuple[int, int]:
    """The streaming state (context start, tokens read) after `shown`, replayed without decoding:
    `read` moves past a token exactly when it shows text, and the context start follows it."""
    prefix, read = 0, 0
    for i, piece in enumerate(shown):
        if piece:
            read = i + 1
            prefix = max(0, read - _WINDOW) if read - prefix > _WINDOW else prefix
    return prefix, read


def display_tokens(tokenizer: Any, ids: Sequence[int], known: Sequence[str] = ()) -> list[str]:
    """(T,) ids -> T strings whose concatenation equals the decoded text. O(T) decodes of short spans.

    `known`: display strings already computed for ids[:len(known)] as part of a longer response (a
    branch's shared prefix): they are reused, and only the rest is decoded. The last string of a
    finished response may hold an unfinished character's tail, so it is never passed as known."""
    ids = [int(i) for i in ids]
    if len(known) > len(ids):
        raise InvalidInputError(f"{len(known)} known display strings for {len(ids)} tokens")

    dec = _decoder(tokenizer)

    out: list[str] = list(known)
    prefix, read = _context_start(out)  # text up to `read` is already emitted; `prefix` is the decode context start
    for i in range(len(out), len(ids)):
        before = dec(ids[prefix:read])
        after = dec(ids[prefix : i + 1])
        if len(after) > len(before) and not after.endswith(REPLACEMENT) and after.startswith(before):
            out.append(after[len(before) :])
            read = i + 1
            prefix = max(0, read - _WINDOW) if read - prefix > _WINDOW else prefix
        else:
            out.append("")
    if read < len(ids):  # an unfinished character at the very end: show what the decoder shows
        tail = dec(ids[prefix:])[len(dec(ids[prefix:read])) :]
        out[-1] = out[-1] + tail
    return out


def _decoder(tokenizer: Any) -> Any:
    """`span -> text` as `tokenizer.decode(span, skip_special_tokens=False, clean_up_tokenization_spaces=False)`;
    for a fast tokenizer whose decode is exactly its Rust decoder's, that decoder called directly (a third of
    the time: most of a short span's decode is transformers' Python around it)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: the public call
        TokenizersBackend = None
    if (TokenizersBackend is not None and isinstance(tokenizer, TokenizersBackend) and hasattr(backend, "decode")
            and type(tokenizer)._decode is TokenizersBackend._decode and type(tokenizer).decode is TokenizersBackend.decode):
        return lambda span: backend.decode(span, skip_special_tokens=False)
    return lambda span: tokenizer.decode(span, skip_special_tokens=False, clean_up_tokenization_spaces=False)
