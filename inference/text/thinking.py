"""Thinking in an answer: the <think>...</think> block that reasoning models (Qwen3, DeepSeek-R1
and their distills) write before the answer, kept apart from the answer.

The rules are Ollama's (llama-server's "deepseek" reasoning format agrees):

1. only a block at the very start of the answer (after whitespace) is thinking; an answer that
   starts with other text has no thinking, and a later "<think>" is plain text;
2. whitespace at the start of the answer, right after "<think>", right before "</think>" and
   right after "</think>" is dropped (a model asked not to think often answers "\n" first);
3. a template may open the block in the prompt (DeepSeek-R1, Qwen3's thinking variants: the
   generation prompt ends with "<think>\\n"), so the answer starts inside it: a splitter made
   with inside=True;
4. an answer that ends inside the block (it ran out of tokens) is all thinking.

The splitter sees the answer as it streams and keeps one invariant: what it has returned is
final. A piece that might be the start of a tag, or whitespace that rule 2 might drop, is held
back until the next piece (or finish()) decides it.

The request's switch (Ollama `think`, OpenAI `reasoning_effort`) reaches the template as the
variables Hugging Face templates read: `enable_thinking` (Qwen3) and `reasoning_effort`
(gpt-oss). A template that opens the block itself and has no switch (DeepSeek-R1) is switched
off the way llama.cpp does it: the open block is closed at the end of the prompt.
"""

from __future__ import annotations

import enum
import re
from typing import Literal

OPEN = "<think>"
CLOSE = "</think>"

Level = Literal["low", "medium", "high"]
Think = bool | Level | None  # None: the template's own default
LEVELS: tuple[Level, ...] = ("low", "medium", "high")

_SWITCH = re.compile(r"\benable_thinking\b")
_EFFORT = re.compile(r"\breasoning_effort\b")


def thinking_mode(template: str | None) -> bool:
    """Whether a chat template has a thinking mode: Qwen3's `enable_thinking` switch, or
    DeepSeek-R1's <think> blocks (which it strips from history or opens in the prompt)."""
    text = template or ""
    return bool(_SWITCH.search(text)) or OPEN in text or CLOSE in text


def template_variables(template: str | None, think: Think) -> dict[str, object]:
    """The variables that carry the request's switch into the template; none when the request
    leaves it to the template (think is None), so `enable_thinking is defined` stays false."""
    if think is None:
        return {}
    variables: dict[str, object] = {"enable_thinking": think is not False}
    if isinstance(think, str) and _EFFORT.search(template or ""):
        variables["reasoning_effort"] = think
    return variables


def prompt_opens_thinking(prompt: str) -> bool:
    """Whether the rendered prompt ends inside an open <think> block (rule 3)."""
    return prompt.rstrip().endswith(OPEN)


def close_thinking(prompt: str) -> str:
    """The prompt with its open <think> block closed empty, as Qwen3 writes it when thinking is
    off ("<think>\\n\\n</think>\\n\\n"): the answer then starts after the block."""
    return prompt.rstrip() + "\n\n" + CLOSE + "\n\n"


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that could be the start of `tag`."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class _State(enum.Enum):
    LOOKING = "looking"  # the answer so far is whitespace or a possible start of OPEN
    OPENED = "opened"  # after OPEN: dropping whitespace
    THINKING = "thinking"
    CLOSED = "closed"  # after CLOSE: dropping whitespace
    CONTENT = "content"


class ThinkingSplitter:
    """Splits a streamed answer into (thinking, content) pieces by the rules above."""

    def __init__(self, *, inside: bool = False):
        self._state = _State.OPENED if inside else _State.LOOKING
        self._pending = ""  # held back: not yet known to be thinking, content or dropped

    @property
    def thinking(self) -> bool:
        """Whether the answer is inside the thinking block now (what a page shows as live)."""
        return self._state in (_State.OPENED, _State.THINKING)

    def feed(self, text: str) -> tuple[str, str]:
        """Take a piece of the answer; return the (thinking, content) text that is final."""
        self._pending += text
        thinking, content = [], []
        while self._pending:
            state = self._state
            if state is _State.LOOKING:
                start = self._pending.lstrip()
                if start.startswith(OPEN):
                    self._pending, self._state = start[len(OPEN) :], _State.OPENED
                elif start and not OPEN.startswith(start):
                    content.append(start)
                    self._pending, self._state = "", _State.CONTENT
                else:
                    break  # whitespace, or a possible "<think"
            elif state in (_State.OPENED, _State.CLOSED):
                rest = self._pending.lstrip()
                self._pending = rest
                if rest:
                    self._state = _State.THINKING if state is _State.OPENED else _State.CONTENT
            elif state is _State.THINKING:
                end = self._pending.find(CLOSE)
                if end >= 0:
                    thinking.append(self._pending[:end].rstrip())
                    self._pending, self._state = self._pending[end + len(CLOSE) :], _State.CLOSED
                    continue
                keep = _partial_tag(self._pending, CLOSE)
                final = self._pending[: len(self._pending) - keep].rstrip()
                thinking.append(final)
                self._pending = self._pending[len(final) :]
                break
            else:
                content.append(self._pending)
                self._pending = ""
        return "".join(thinking), "".join(content)

    def finish(self) -> tuple[str, str]:
        """The rest, once the answer has ended: held-back text is what it looked like."""
        rest, self._pending = self._pending, ""
        if self._state is _State.LOOKING:
            self._state = _State.CONTENT
            return "", rest.lstrip()  # whitespace, or "<thi" that never became a tag
        if self._state is _State.THINKING:
            return rest.rstrip(), ""  # rule 4; a partial "</thi" is thinking text
        return "", ""
