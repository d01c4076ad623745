"""Token display strings: what each response token shows, so that joining them gives the decoded text.

Byte-level BPE can split one character over several tokens; such a character is shown on the token
that completes it (the earlier pieces show nothing), as streaming decoders do.
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"
_WINDOW = 6  # tokens of left context; enough for any UTF-8 character (at most 4 bytes)


def display_tokens(tokenizer: Any, ids: list[int]) -> list[str]:
    """(T,) ids -> T strings whose concatenation equals the decoded text. O(T) decodes of short spans."""
    ids = [int(i) for i in ids]

    def dec(span: list[int]) -> str:
        return tokenizer.decode(span, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    out: list[str] = []
    prefix, read = 0, 0  # text up to `read` is already emitted; `prefix` is the decode context start
    for i in range(len(ids)):
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
