"""An answer split into thinking, content and tool calls: calls are parsed out of the content
only, and a streamed answer comes out as the same answer parsed whole."""

from dashboard.api.answer_parser import AnswerParser, Piece
from dashboard.api.tools import ToolCallParser
from inference.text.thinking import ThinkingSplitter

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWER = f"I could write {CALL} here.\n</think>\n\nLet me check.{CALL}"


def parser() -> AnswerParser:
    return AnswerParser(ThinkingSplitter(inside=True), ToolCallParser({"get_weather"}))


def whole(parser: AnswerParser, text: str):
    """A whole answer parsed at once: fed as one piece, then finished."""
    first = parser.feed(text)
    rest, calls = parser.finish()
    return first + rest, calls


def test_a_call_in_the_thinking_is_thinking_and_a_call_in_the_content_is_a_call():
    piece, calls = whole(parser(), ANSWER)
    assert piece == Piece(f"I could write {CALL} here.", "Let me check.")
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]


def test_streamed_in_pieces_the_answer_splits_the_same_as_whole():
    streaming = parser()
    pieces = [streaming.feed(ANSWER[i : i + 5]) for i in range(0, len(ANSWER), 5)]
    rest, calls = streaming.finish()
    thinking = "".join(p.thinking for p in pieces) + rest.thinking
    content = "".join(p.content for p in pieces) + rest.content
    assert Piece(thinking, content) == whole(parser(), ANSWER)[0]
    assert [c.name for c in calls] == ["get_weather"]
    assert not any(p.content for p in pieces[: len(ANSWER.split("</think>")[0]) // 5])


def test_without_a_thinking_mode_or_tools_the_answer_is_content_as_it_streams():
    plain = AnswerParser(None, None)
    assert plain.feed("<think>hi") == Piece("", "<think>hi")
    assert plain.finish() == (Piece(), [])
