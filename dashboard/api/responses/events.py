"""One answer as a Responses API response: its output items, and the stream events that build
them, in the order the openai SDK's `responses.stream()` consumes them.

A `ResponseBuilder` is handed the answer's text as the answer pipeline splits it
(dashboard.api.pipeline: thinking and content as pieces, then the Ending) and returns the events
each makes; the non-streamed answer is the same builder's final `response()`, so the two cannot
differ. The events of one answer:

1. `response.created`, `response.in_progress` (the response so far: no output);
2. for the thinking, if any: `output_item.added` (a `reasoning` item), `content_part.added`
   (`reasoning_text`), `reasoning_text.delta`..., `reasoning_text.done`, `content_part.done`,
   `output_item.done`;
3. for the answer's text: the same for a `message` item with one `output_text` part
   (`output_text.delta`..., `output_text.done`); an answer without text or calls still has its
   (empty) message;
4. for each tool call, once the answer has ended (calls are parsed whole, dashboard.api.tools):
   `output_item.added` (a `function_call`), `function_call_arguments.delta`,
   `function_call_arguments.done`, `output_item.done`;
5. `response.completed`, or `response.incomplete` (incomplete_details.reason
   "max_output_tokens") for an answer cut short, each with the whole response; an error instead
   ends the stream with an `error` event and `response.failed`.

Every event carries its `sequence_number`, from 0.
"""

import json
import time
import uuid
from dataclasses import dataclass, field

from dashboard.api.answer_parser import Piece
from dashboard.api.errors import ApiError
from dashboard.api.figures import responses_usage, timings
from dashboard.api.pipeline import Ending
from dashboard.api.responses.schemas import ResponsesRequest
from dashboard.api.tools import ToolCall


@dataclass(slots=True)
class _Item:
    """An output item being written: its index, and the text of its one content part."""

    index: int
    item: dict
    text: str = ""


@dataclass(slots=True)
class ResponseBuilder:
    id: str
    model: str
    body: ResponsesRequest
    created_at: int = field(default_factory=lambda: int(time.time()))
    output: list[dict] = field(default_factory=list)  # the items done
    status: str = "in_progress"
    _sequence: int = 0
    _open: _Item | None = None  # the reasoning or message item being written
    _figures: dict | None = None
    _error: dict | None = None

    # --- the response object --------------------------------------------------------------

    def response(self) -> dict:
        body = self.body
        reason = {"reason": "max_output_tokens"} if self.status == "incomplete" else None
        effort = body.reasoning.effort if body.reasoning else None
        response = {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": self.status, "error": self._error, "incomplete_details": reason,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "model": self.model, "output": list(self.output),
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": None, "reasoning": {"effort": effort, "summary": None},
            "service_tier": "flex" if body.service_tier == "flex" else "default",
            "store": False,  # never kept, whatever was asked (responses_schemas)
            "temperature": body.temperature, "text": {"format": body.format.echo()},
            "tool_choice": body.tool_choice or "auto",
            "tools": [tool.model_dump(exclude_none=True) for tool in body.tools or ()],
            "top_p": body.top_p, "truncation": "disabled", "metadata": body.metadata or {},
            "user": body.user, "usage": None,
        }  # fmt: skip
        if self.status in ("completed", "incomplete"):
            response["completed_at"] = int(time.time())
        if self._figures is not None:
            response["usage"] = responses_usage(self._figures)
            response["timings"] = timings(self._figures)
        return response

    # --- events -----------------------------------------------------------------------------

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def opening(self) -> list[dict]:
        return [self._event("response.created", response=self.response()),
                self._event("response.in_progress", response=self.response())]  # fmt: skip

    def piece(self, piece: Piece) -> list[dict]:
        """Text that is final: the events it makes."""
        return self._text("reasoning", piece.thinking) + self._text("message", piece.content)

    def finish(self, end: Ending) -> list[dict]:
        """The answer's end: the rest of its text, its calls, and response.completed (or
        .incomplete)."""
        self.status = "incomplete" if end.finish_reason == "length" else "completed"
        events = self.piece(end.text)
        if not end.calls and not self._has("message"):
            events += self._text("message", "", empty=True)
        events += self._close()
        for call in end.calls:
            events += self._call(call)
        self._figures = end.figures
        return [*events, self._event(f"response.{self.status}", response=self.response())]

    def fail(self, error: ApiError) -> list[dict]:
        """An error after the stream began: the `error` event and response.failed."""
        self.status = "failed"
        self._error = {"code": error.code or "server_error", "message": error.message}
        return [self._event("error", code=error.code, message=error.message, param=error.param),
                self._event("response.failed", response=self.response())]  # fmt: skip

    # --- output items -----------------------------------------------------------------------

    def _text(self, kind: str, text: str, *, empty: bool = False) -> list[dict]:
        """Events for text of a reasoning or message item, opening it (and closing the other)
        first."""
        if not text and not empty:
            return []
        events = []
        if self._open is None or self._open.item["type"] != kind:
            events += self._close()
            events += self._start(kind)
        item = self._open
        if text:
            item.text += text
            delta = "reasoning_text.delta" if kind == "reasoning" else "output_text.delta"
            extra = {} if kind == "reasoning" else {"logprobs": []}
            events.append(self._event(f"response.{delta}", item_id=item.item["id"],
                                      output_index=item.index, content_index=0, delta=text,
                                      **extra))  # fmt: skip
        return events

    def _has(self, kind: str) -> bool:
        items = [*self.output, *([self._open.item] if self._open else [])]
        return any(item["type"] == kind for item in items)

    def _start(self, kind: str) -> list[dict]:
        index = len(self.output)
        if kind == "reasoning":
            item = {"id": f"rs_{uuid.uuid4().hex}", "type": "reasoning", "summary": [],
                    "content": [], "status": "in_progress"}  # fmt: skip
        else:
            item = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}  # fmt: skip
        self._open = _Item(index, item)
        return [
            self._event("response.output_item.added", output_index=index, item=dict(item)),
            self._event("response.content_part.added", item_id=item["id"], output_index=index,
                        content_index=0, part=self._part(kind, "")),
        ]  # fmt: skip

    def _close(self) -> list[dict]:
        if self._open is None:
            return []
        opened, self._open = self._open, None
        item, kind = opened.item, opened.item["type"]
        part = self._part(kind, opened.text)
        where = {"item_id": item["id"], "output_index": opened.index, "content_index": 0}
        if kind == "reasoning":
            done = self._event("response.reasoning_text.done", **where, text=opened.text)
        else:
            done = self._event("response.output_text.done", **where, text=opened.text,
                               logprobs=[])  # fmt: skip
        # An answer cut short leaves its last item incomplete, as OpenAI's does.
        item.update(content=[part], status="incomplete" if self.status == "incomplete"
                    else "completed")  # fmt: skip
        self.output.append(item)
        return [done, self._event("response.content_part.done", **where, part=part),
                self._event("response.output_item.done", output_index=opened.index,
                            item=dict(item))]  # fmt: skip

    @staticmethod
    def _part(kind: str, text: str) -> dict:
        if kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _call(self, call: ToolCall) -> list[dict]:
        index = len(self.output)
        arguments = json.dumps(call.arguments)
        item = {"id": f"fc_{uuid.uuid4().hex}", "type": "function_call", "call_id": call.id,
                "name": call.name, "arguments": "", "status": "in_progress"}  # fmt: skip
        added = self._event("response.output_item.added", output_index=index, item=dict(item))
        where = {"item_id": item["id"], "output_index": index}
        item.update(arguments=arguments, status="completed")
        self.output.append(item)
        return [
            added,
            self._event("response.function_call_arguments.delta", **where, delta=arguments),
            self._event("response.function_call_arguments.done", **where, name=call.name,
                        arguments=arguments),
            self._event("response.output_item.done", output_index=index, item=dict(item)),
        ]  # fmt: skip
