"""Prompt formats: how one model of a pair sees a problem (a raw template or its chat template, with an
instruction in the user turn and an optional thinking prefill), and the named formats of the paper."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.errors import InvalidInputError

DEFAULT_BASE_FORMAT = "Question: {problem}\nAnswer:"
CHAT_MODES = ("chat", "chat:think", "chat:nothink")
PREFILLS = ("think", "answer")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
PAPER_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
# Named formats (expanded by `format_spec`); the paper's prompt carries PAPER_INSTRUCTION.
NAMED_FORMATS = {
    "paper-base": "Question: {problem}\n" + PAPER_INSTRUCTION + "\nAnswer:",
    "paper-think": "chat:think+think|{problem}\n" + PAPER_INSTRUCTION,
    "paper-answer": "chat:nothink+answer|{problem}\n" + PAPER_INSTRUCTION,
}


def format_spec(spec: str) -> str:
    """A format spec with named formats (NAMED_FORMATS, e.g. "paper-base") expanded."""
    return NAMED_FORMATS.get(spec, spec)


@dataclass(frozen=True)
class PromptFormat:
    """How one model sees a problem: a raw template with `{problem}`, or the tokenizer's chat template.

    Written as a string: a raw template like "Question: {problem}\\nAnswer:", or
    `chat[:think|:nothink][+think|+answer][|system text][|user template with {problem}]`.
    chat:think / chat:nothink set Qwen3's `enable_thinking`. `+think` prefills the opening of the
    thinking ("<think>\\n") after the assistant turn, so the shared response is read as thinking
    content (no artefact spike at t = 0); `+answer` prefills an empty closed thought, so it is read as
    the final answer. A `|` part with {problem} is the user turn's template (e.g. the problem plus an
    instruction), another `|` part is a system message. Named formats: see NAMED_FORMATS.
    """

    spec: str

    def __post_init__(self) -> None:
        if self.is_chat:
            self.parts()  # validates
        elif "{problem}" not in self.spec:
            raise InvalidInputError(
                f"Prompt format {self.spec!r} has no '{{problem}}' placeholder; use a template such as "
                f"{DEFAULT_BASE_FORMAT!r}, one of: {', '.join(CHAT_MODES)} (optionally +think / +answer), "
                f"or a named format: {', '.join(NAMED_FORMATS)}"
            )

    @property
    def is_chat(self) -> bool:
        return self.spec.split("|", 1)[0].split("+", 1)[0] in CHAT_MODES

    def parts(self) -> dict[str, Any]:
        """The chat spec's parts: mode, prefill (None/think/answer), system text, user template."""
        head, *rest = self.spec.split("|")
        mode, _, prefill = head.partition("+")
        if prefill and prefill not in PREFILLS:
            raise InvalidInputError(f"Unknown prefill {prefill!r} in prompt format {self.spec!r}; choose one of: "
                                    f"{', '.join(PREFILLS)}")
        users = [r for r in rest if "{problem}" in r]
        systems = [r for r in rest if "{problem}" not in r]
        if len(users) > 1 or len(systems) > 1:
            raise InvalidInputError(f"Prompt format {self.spec!r} has more than one system or user part")
        return {"mode": mode, "prefill": prefill or None, "system": systems[0] if systems else None,
                "user": users[0] if users else None}

    def describe(self) -> dict[str, Any]:
        """What the format does, for trace meta and the UI: kind, thinking mode, prefill, instruction."""
        if not self.is_chat:
            return {"spec": self.spec, "kind": "raw", "thinking": None, "prefill": None}
        p = self.parts()
        thinking = {"chat:think": True, "chat:nothink": False}.get(p["mode"])
        return {"spec": self.spec, "kind": "chat", "thinking": thinking, "prefill": p["prefill"],
                "system": p["system"], "user": p["user"],
                "response_read_as": {"think": "thinking", "answer": "answer"}.get(p["prefill"] or "", "template")}

    def render(self, tokenizer: Any, problem: str) -> list[int]:
        """Token ids of the formatted prompt for `problem` (BOS and chat markup as the model expects)."""
        if not self.is_chat:
            text = self.spec.replace("{problem}", problem)
            return list(tokenizer(text, add_special_tokens=True)["input_ids"])
        if not getattr(tokenizer, "chat_template", None):
            raise InvalidInputError(
                "Prompt format 'chat' needs a tokenizer with a chat template; this one has none. "
                f"Use a raw template such as {DEFAULT_BASE_FORMAT!r}."
            )
        p = self.parts()
        user = p["user"].replace("{problem}", problem) if p["user"] else problem
        messages = ([{"role": "system", "content": p["system"]}] if p["system"] else []) + [
            {"role": "user", "content": user}
        ]
        kwargs: dict[str, Any] = {}
        if p["mode"] != "chat":
            kwargs["enable_thinking"] = p["mode"] == "chat:think"
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        text += _prefill(text, p["prefill"])
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _prefill(text: str, prefill: str | None) -> str:
    """What to append so the prompt ends with an open thought (think) or an empty closed one (answer);
    nothing when the chat template already wrote it."""
    opened, closed = THINK_OPEN + "\n", THINK_OPEN + "\n\n" + THINK_CLOSE + "\n\n"
    if prefill == "think":
        return "" if text.endswith(opened) else opened
    if prefill == "answer":
        if text.endswith(closed):
            return ""
        return closed[len(opened):] if text.endswith(opened) else closed
    return ""
