"""Tool calls in an answer: the <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks
that Hermes- and Qwen-style chat templates teach their models to write.

The parser sees the answer as it streams: text before the first block goes out at once, a
possible start of a block ("<tool_", "<tool_call") is held back until it is known, and
everything from the first block on is kept and parsed when the answer ends. A block that does
not parse, or names a tool the request did not offer, is returned as plain text: nothing the
model wrote is lost, and nothing is made up.

`tool_constraint` goes further where the model allows: a lazy grammar (inference.engine.params)
that, once the model writes <tool_call>, holds the call to an offered tool's name and its
arguments to that tool's parameter schema. llama.cpp can start it only where <tool_call> is one
token of the model's vocabulary (Qwen, Hermes); elsewhere the answer stays free and the parser
above is all there is.
"""

import functools
import json
import re
import uuid
from dataclasses import dataclass

from inference.text.structured import UnsupportedSchema, tool_call_grammar

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)
MAX_CALLS = 64


@dataclass(slots=True, frozen=True)
class ToolCall:
    name: str
    arguments: dict
    id: str

    def openai(self, index: int | None = None) -> dict:
        function = {"name": self.name, "arguments": json.dumps(self.arguments)}
        call = {"id": self.id, "type": "function", "function": function}
        return call if index is None else {"index": index, **call}

    def ollama(self) -> dict:
        return {"function": {"name": self.name, "arguments": self.arguments}}


def tool_constraint(tools: list[dict], *, parallel: bool = True) -> dict:
    """Sampling params that hold tool calls to the offered tools (one call unless `parallel`),
    from the moment the model opens one; {} when no grammar can be made for them."""
    calls = [(t["function"]["name"], t["function"].get("parameters")) for t in tools]
    grammar = _tool_grammar(json.dumps(calls, sort_keys=True), parallel)
    return {"grammar": grammar, "grammar_triggers": (OPEN,)} if grammar else {}


@functools.lru_cache(maxsize=32)
def _tool_grammar(calls: str, parallel: bool) -> str | None:
    """(Cached: an app such as Home Assistant offers the same tools with every request.)"""
    try:
        return tool_call_grammar(json.loads(calls), OPEN, CLOSE, parallel=parallel)
    except UnsupportedSchema:  # e.g. too large a grammar: the calls are parsed as before
        return None


def template_renders_tools(template: str) -> bool:
    """Whether a chat template reads the `tools` variable at all."""
    return bool(re.search(r"\btools\b", template or ""))


def template_marks_tool_calls(template: str) -> bool:
    return OPEN in (template or "")


def _held_back(text: str) -> int:
    """Length of the longest suffix of `text` that could be the start of OPEN."""
    for size in range(min(len(text), len(OPEN) - 1), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0


def _parse_call(body: str, allowed: set[str]) -> ToolCall | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("name") not in allowed:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(data["name"], arguments, "call_" + uuid.uuid4().hex[:24])


class ToolCallParser:
    def __init__(self, tool_names: set[str]):
        self.allowed = tool_names
        self._pending = ""  # text that might be the start of a block
        self._captured: str | None = None  # everything from the first block on

    def feed(self, text: str) -> str:
        """Take a piece of the answer; return the part that is plain text for certain."""
        if self._captured is not None:
            self._captured += text
            return ""
        self._pending += text
        start = self._pending.find(OPEN)
        if start >= 0:
            visible, self._captured = self._pending[:start], self._pending[start:]
            self._pending = ""
            return visible
        keep = _held_back(self._pending)
        visible = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(self._pending) - keep :]
        return visible

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The rest of the plain text, and the tool calls, once the answer has ended."""
        if self._captured is None:
            rest, self._pending = self._pending, ""
            return rest, []
        captured = self._captured
        calls = []
        for match in _BLOCK.finditer(captured):
            call = _parse_call(match.group(1).strip(), self.allowed)
            if call is None or len(calls) >= MAX_CALLS:
                return captured, []  # not recognisably a call: give the text back as it was
            calls.append(call)
        return _BLOCK.sub("", captured).strip(), calls
