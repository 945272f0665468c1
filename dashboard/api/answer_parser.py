"""An answer as it streams, split into its thinking, its content and its tool calls.

The thinking block comes first (inference.text.thinking), and tool calls are parsed out of the
content only (dashboard.api.tools): a model that mentions "<tool_call>" while it thinks has not
called anything. Both parsers hold back what they cannot decide yet, so a streamed answer and
the same answer parsed whole come out the same. It also counts the tokens of the thinking
(`thinking_tokens`: each piece fed while the answer was inside its block, or that entered it).
"""

from dataclasses import dataclass

from dashboard.api.tools import ToolCall, ToolCallParser
from inference.text.thinking import ThinkingSplitter


@dataclass(slots=True, frozen=True)
class Piece:
    thinking: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.thinking or self.content)

    def __add__(self, other: "Piece") -> "Piece":
        return Piece(self.thinking + other.thinking, self.content + other.content)


class AnswerParser:
    def __init__(self, thinking: ThinkingSplitter | None, tools: ToolCallParser | None):
        self._thinking = thinking
        self._tools = tools
        self.thinking_tokens = 0  # pieces fed inside the thinking block: one per token event

    @property
    def thinking(self) -> bool:
        """Whether the answer is inside its thinking block now."""
        return self._thinking is not None and self._thinking.thinking

    def feed(self, text: str) -> Piece:
        """Take a piece of the answer; return the thinking and content that are final."""
        before = self.thinking
        thinking, content = self._thinking.feed(text) if self._thinking else ("", text)
        if before or self.thinking:
            self.thinking_tokens += 1
        if self._tools and content:
            content = self._tools.feed(content)
        return Piece(thinking, content)

    def finish(self) -> tuple[Piece, list[ToolCall]]:
        """The rest of the answer and its tool calls, once it has ended."""
        thinking, content = self._thinking.finish() if self._thinking else ("", "")
        calls: list[ToolCall] = []
        if self._tools:
            content = self._tools.feed(content)
            rest, calls = self._tools.finish()
            content += rest
        return Piece(thinking, content), calls
