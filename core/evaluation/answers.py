"""Reading a response's final answer as a careful grader would, and saying which rule found it.

Special-token markup is stripped and only the part after a closing think tag is read. Then, in order:
1. "boxed": the last complete \\boxed{} / \\fbox{};
2. "phrase": an explicit answer phrase ("####", "the answer is", "Answer:", "final answer"), the last one
   first, taking the first complete math expression after it (units, currency signs, thousands
   separators and trailing words dropped: "2, because 2 + 2 = 4" -> "2", "12 km/h" -> "12");
3. "last_number" (a labelled fallback, which callers may switch off): the last number of the final
   sentence ("So she pays 45 dollars in total." -> "45").
Nothing found: no answer (rule None), which tables count as *ungraded*, apart from *wrong*.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RULES = ("boxed", "phrase", "last_number")  # in the order they are tried
THINK_CLOSE_TAGS = ("</think>", "</thinking>", "</reasoning>")
# Special-token markup of the common families (Qwen/ChatML, Llama 3, DeepSeek's full-width bars, Gemma,
# SentencePiece); answers never contain these strings.
_SPECIAL = re.compile(
    r"<\|[A-Za-z0-9_.:\-]{1,40}\|>|<｜[^｜<>\n]{1,40}｜>|</?s>|<(?:eos|bos|pad|unk)>|<(?:start|end)_of_turn>"
)
_BOXED = re.compile(r"\\(?:boxed|fbox)\b")
# "####" (GSM8K) is read before the other phrases, as a dataset's own marker.
_HASHES = re.compile(r"####")
_PHRASE = re.compile(
    r"(?i)\b(?:final\s+answer(?:\s*\*\*)?(?:\s*(?:is|would\s+be|will\s+be|should\s+be)\b)?\s*[:：=]?"
    r"|answer(?:\s*\*\*)?\s*(?:(?:is|would\s+be|will\s+be|should\s+be)\b\s*[:：=]?|[:：=]))"
)
_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d|,\d)|\d+(?:\.\d+)?|\.\d+")
_LAST_NUMBER = re.compile(
    r"(?<![\w)\]}.])(?P<sign>[-−]?)\$?\s?(?P<n>\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|\d+(?:\.\d+)?)"
    r"(?:\s?/\s?(?P<d>\d+))?(?P<pct>\s?%)?"
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_FUNCTIONS = {"sin", "cos", "tan", "log", "ln", "exp", "sqrt", "pi", "mod"}
_OPERATORS = "+-*/^=×÷·<>≤≥"
_UNARY = "+-−±"
# LaTeX commands by role in an expression
_TEX_GROUPS = {"frac": 2, "dfrac": 2, "tfrac": 2, "cfrac": 2, "binom": 2, "dbinom": 2, "sqrt": 1, "overline": 1,
               "hat": 1, "vec": 1, "bar": 1, "mathbf": 1, "operatorname": 1}
_TEX_OPERATORS = {"cdot", "times", "div", "pm", "mp", "le", "leq", "ge", "geq", "ne", "neq", "approx", "in", "cup",
                  "cap", "to", "setminus"}
_TEX_SPACES = {",", ";", "!", ":", " ", "quad", "qquad", "left", "right", "big", "Big", "displaystyle"}
_TEX_UNITS = {"text", "textbf", "mathrm", "mbox", "textit", "unit", "textrm", "emph"}
_DELIMITERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))


@dataclass(frozen=True)
class Extraction:
    """A response's final answer (None when nothing was found) and the rule that found it (RULES, or None)."""

    answer: str | None
    rule: str | None


def strip_special(text: str) -> str:
    """`text` without special-token markup ("<|im_end|>", "<｜end▁of▁sentence｜>", "</s>", "<eos>", ...);
    the think tags stay (see `answer_part`)."""
    return _SPECIAL.sub("", text or "")


def answer_part(text: str) -> str:
    """The answer part of a chain of thought: the text after the last closing think tag when there is
    one, else the whole text (a response that never closes its thought is graded on all of it)."""
    ends = [text.rfind(tag) + len(tag) for tag in THINK_CLOSE_TAGS if tag in text]
    return text[max(ends):] if ends else text


def extract(text: str, *, last_number: bool = True) -> Extraction:
    """The final answer of a response and the rule that found it (see the module doc); `last_number`
    switches the fallback on (e.g. off for a response cut at the token limit: its last number is not an answer)."""
    text = answer_part(strip_special(text or ""))
    boxed = last_boxed(text)
    if boxed:
        return Extraction(boxed, "boxed")
    for pattern in (_HASHES, _PHRASE):
        for m in reversed(list(pattern.finditer(text))):
            found = first_expression(text[m.end():])
            if found:
                return Extraction(found, "phrase")
    if last_number:
        found = final_sentence_number(text)
        if found:
            return Extraction(found, "last_number")
    return Extraction(None, None)


def extract_answer(text: str, last_number: bool = True) -> str | None:
    """The response's final answer, or None (`extract` without the rule)."""
    return extract(text, last_number=last_number).answer


def last_boxed(text: str) -> str | None:
    """Contents of the last complete \\boxed{...} / \\fbox{...} (nested braces balanced; "\\{" escaped)."""
    for m in reversed(list(_BOXED.finditer(text))):
        i = m.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            inner = braced(text, i)
            if inner is not None:
                return inner.strip()
        elif i > m.end():  # "\boxed 5": up to the next space or $
            word = re.match(r"[^\s$]+", text[i:])
            if word:
                return word.group(0)
    return None


def braced(text: str, open_at: int, close: str = "}") -> str | None:
    """The text inside the group opening at `open_at` ("{", "(" or "["), or None if it never closes."""
    opener = text[open_at]
    close = {"{": "}", "(": ")", "[": "]"}.get(opener, close)
    depth, i = 0, open_at
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2  # \{ \} \\ and commands never open or close a group
            continue
        if ch == opener:
            depth += 1
        elif ch == close:
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
        i += 1
    return None


def final_sentence_number(text: str) -> str | None:
    """The last number of the final sentence ("So she pays $45.00 in total." -> "45.00"), or None."""
    sentences = [s for s in _SENTENCE_END.split(text.strip()) if s.strip()]
    if not sentences:
        return None
    found = list(_LAST_NUMBER.finditer(sentences[-1]))
    if not found:
        return None
    m = found[-1]
    out = ("-" if m.group("sign") else "") + m.group("n").replace(",", "")
    if m.group("d"):
        out += "/" + m.group("d")
    return out + ("\\%" if m.group("pct") else "")


# -- the first complete expression after an answer phrase ---------------------------------------------


def first_expression(text: str) -> str | None:
    """The first complete math expression at the start of `text` (after spaces, "**", ":"), or None.

    A math-delimited span ($..$, \\(..\\), \\[..\\]) is taken whole; "$45.00" is currency. Otherwise the
    expression ends at a word ("km/h", "because"), a comma that is not a thousands separator, a sentence
    end, or a space not followed by an operator ("5 m" -> "5")."""
    s = text.lstrip(" \t\n*`:：")
    currency = re.match(r"(?:\\\$|\$)\s?(" + _NUMBER.pattern + r")(?![\w$\\{_]|\s*[$+\-*/^=])", s)
    if currency:
        return currency.group(1).replace(",", "")
    for left, right in _DELIMITERS:
        if s.startswith(left):
            end = s.find(right, len(left))
            inner = s[len(left):end].strip() if end > 0 else ""
            return (_scan(inner) or inner or None) if end > 0 else _scan(s[len(left):])
    return _scan(s)


def _scan(s: str) -> str | None:
    """Scan one expression from the start of `s` (see `first_expression`); None when there is none."""
    out: list[str] = []
    need = True  # an operand is expected next
    i, n = 0, len(s)
    while i < n:
        ch = s[i]
        if ch in " \t":
            j = i
            while j < n and s[j] in " \t":
                j += 1
            if j >= n:
                break
            nxt = s[j]
            if need or (nxt in _OPERATORS and nxt != "-" or nxt == "-" and j + 1 < n and s[j + 1] in " \t"):
                out.append(" ")
                i = j
                continue
            if nxt == "\\":
                cmd = re.match(r"\\([A-Za-z]+)", s[j:])
                if cmd and cmd.group(1) in _TEX_OPERATORS:
                    out.append(" ")
                    i = j
                    continue
            break
        number = _NUMBER.match(s, i) if ch.isdigit() or ch == "." else None
        if number and number.group(0) != ".":
            if not need and out and (out[-1][-1:].isdigit()):
                break
            out.append(number.group(0).replace(",", ""))
            i, need = number.end(), False
            if i < n and s[i] == "%":
                out.append("\\%")
                i += 1
            elif s.startswith("\\%", i):
                out.append("\\%")
                i += 2
            elif i < n and s[i] == "°":
                i += 1
            continue
        if ch in _UNARY and need:
            out.append("-" if ch == "−" else ch)
            i += 1
            continue
        if ch in _OPERATORS and not need:
            out.append(ch)
            i, need = i + 1, True
            continue
        if ch in "({[":
            inner = braced(s, i)
            if inner is None:
                break
            out.append(s[i : i + len(inner) + 2])
            i, need = i + len(inner) + 2, False
            continue
        if ch == "\\":
            step = _tex(s, i, need)
            if step is None:
                break
            text, i, need = step
            out.append(text)
            continue
        if ch in "√π∞":
            out.append({"√": "\\sqrt", "π": "\\pi", "∞": "\\infty"}[ch])
            i, need = i + 1, ch == "√"
            continue
        if ch.isalpha() and ch.isascii():
            word = re.match(r"[A-Za-z]+", s[i:]).group(0)  # type: ignore[union-attr]
            after = s[i + len(word):]
            if word.lower() in _FUNCTIONS:
                out.append(word)
                i, need = i + len(word), word.lower() != "pi"
                continue
            # one letter is a variable ("x", "2x"), unless it starts a phrase ("a box", "I think")
            if len(word) == 1 and not (not out and re.match(r"\s+[A-Za-z]{2,}", after)):
                out.append(word)
                i, need = i + 1, False
                continue
            break
        break
    expr = "".join(out).strip()
    while expr and (expr[-1] in _OPERATORS or expr[-1] in _UNARY):  # "5 =" or a dangling sign
        expr = expr[:-1].rstrip()
    return expr if any(c.isalnum() for c in expr) else None


def _tex(s: str, i: int, need: bool) -> tuple[str, int, bool] | None:
    """One LaTeX command at s[i] as (text, next index, operand needed next), or None where the expression ends."""
    if s.startswith("\\%", i) and not need:
        return "\\%", i + 2, False
    if s.startswith("\\{", i):
        end = s.find("\\}", i + 2)
        return (s[i : end + 2], end + 2, False) if end > 0 else None
    if s.startswith("\\$", i):
        return "", i + 2, need
    m = re.match(r"\\([A-Za-z]+|.)", s[i:])
    if m is None:
        return None
    name, j = m.group(1), i + m.end()
    if name in _TEX_SPACES:
        if name in ("left", "right") and j < len(s):
            return s[i : j + 1], j + 1, name == "left"
        return "", j, need
    if name in _TEX_UNITS or (name in _TEX_OPERATORS and need):  # "5\\text{ cm}": a unit ends it
        return None
    if name in _TEX_OPERATORS:
        return f"\\{name} ", j, True
    if name in _TEX_GROUPS:
        k = j
        if name == "sqrt" and k < len(s) and s[k] == "[":
            inner = braced(s, k)
            if inner is None:
                return None
            k += len(inner) + 2
        for _ in range(_TEX_GROUPS[name]):
            while k < len(s) and s[k] == " ":
                k += 1
            if k < len(s) and s[k] == "{":
                inner = braced(s, k)
                if inner is None:
                    return None
                k += len(inner) + 2
            elif k < len(s) and (s[k].isalnum()):
                k += 1  # \frac12
            else:
                return None
        return s[i:k], k, False
    if name.isalpha():  # a symbol: \pi, \infty, \alpha ...
        return f"\\{name}", j, False
    return None
