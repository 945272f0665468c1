"""The <tool_call> parser: text streams out at once, calls are recognised whole, and anything
that is not recognisably a call for an offered tool comes back as plain text."""

import json

from dashboard.api.tools import ToolCallParser, template_marks_tool_calls, template_renders_tools

QWEN_STYLE = (
    "{%- if tools %}{{ tools | tojson }}{% endif %}{%- for m in messages %}<tool_call>{% endfor %}"
)


def feed_all(parser: ToolCallParser, pieces: list[str]) -> str:
    return "".join(parser.feed(piece) for piece in pieces)


def test_plain_text_passes_through_as_it_streams():
    parser = ToolCallParser({"get_weather"})
    assert parser.feed("Hello") == "Hello"
    assert parser.feed(" there") == " there"
    assert parser.finish() == ("", [])


def test_a_possible_start_of_a_block_is_held_back_until_it_is_known():
    parser = ToolCallParser({"get_weather"})
    assert parser.feed("Sure <tool") == "Sure "
    assert parser.feed("box is here") == "<toolbox is here"
    assert parser.finish() == ("", [])


def test_a_call_split_across_tokens_is_recognised():
    parser = ToolCallParser({"get_weather"})
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    visible = feed_all(
        parser, ["Let me check. "] + [call[i : i + 3] for i in range(0, len(call), 3)]
    )
    rest, calls = parser.finish()
    assert visible == "Let me check. "
    assert rest == ""
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
    openai = calls[0].openai(0)
    assert openai["index"] == 0 and openai["type"] == "function"
    assert json.loads(openai["function"]["arguments"]) == {"city": "Paris"}
    assert openai["id"].startswith("call_")
    assert calls[0].ollama() == {
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}
    }


def test_several_calls_and_arguments_given_as_text_are_recognised():
    parser = ToolCallParser({"a", "b"})
    feed_all(
        parser,
        [
            '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>\n',
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>',
        ],
    )
    rest, calls = parser.finish()
    assert rest == ""
    assert [(c.name, c.arguments) for c in calls] == [("a", {"x": 1}), ("b", {})]


def test_an_unclosed_last_block_still_counts_when_it_parses():
    parser = ToolCallParser({"a"})
    parser.feed('<tool_call>{"name": "a", "arguments": {"k": "v"}}')
    assert [c.name for c in parser.finish()[1]] == ["a"]


def test_a_block_that_does_not_parse_comes_back_as_text():
    parser = ToolCallParser({"a"})
    text = "<tool_call>{not json}</tool_call>"
    assert parser.feed(text) == ""
    assert parser.finish() == (text, [])


def test_a_call_to_a_tool_that_was_not_offered_comes_back_as_text():
    parser = ToolCallParser({"a"})
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    parser.feed(text)
    assert parser.finish() == (text, [])


def test_templates_are_told_apart_by_what_they_read_and_write():
    assert template_renders_tools(QWEN_STYLE) and template_marks_tool_calls(QWEN_STYLE)
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}"
    assert not template_renders_tools(chatml) and not template_marks_tool_calls(chatml)
    assert not template_renders_tools("{{ toolsmith }}")


HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{% for tool in tools %}{{ tool | tojson }}\n"
    '{% endfor %}Call a tool as <tool_call>{"name": ..., "arguments": ...}</tool_call>'
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>"
    "{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n"
)
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def test_a_template_that_reads_tools_gets_them_and_its_answers_are_parsed():
    from dashboard.api.templating import _render
    from inference.models import LLMModel

    model = LLMModel(name="hermes", file_path="/nowhere.gguf", chat_template=HERMES_TEMPLATE)
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    prompt = _render(model, history, WEATHER)
    assert '"name": "get_weather"' in prompt.text  # the tool list, through the template
    # OpenAI sends arguments as JSON text; templates get them as a mapping.
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt.text
    assert prompt.tool_names == {"get_weather"}
    assert prompt.tool_parser() is not None


def test_a_template_without_tools_renders_a_plain_prompt_and_parses_nothing():
    from dashboard.api.templating import _render
    from inference.models import LLMModel

    model = LLMModel(name="plain", file_path="/nowhere.gguf", chat_template="")
    prompt = _render(model, [{"role": "user", "content": "hi"}], WEATHER)
    assert "get_weather" not in prompt.text
    assert prompt.tool_parser() is None


def test_an_answer_that_may_hold_calls_gets_a_lazy_tool_call_grammar():
    from dashboard.api.templating import ChatPrompt
    from inference.engine.params import SamplingParams
    from inference.text.prompting import Prompt

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    prompt = ChatPrompt(Prompt("text", True), {"get_weather"}, tools=tools)
    params = prompt.constrain({"temperature": 0.5})
    assert params["temperature"] == 0.5
    assert params["grammar_triggers"] == ("<tool_call>",)
    assert '"\\"get_weather\\""' in params["grammar"] and '"\\"city\\""' in params["grammar"]
    SamplingParams(**params)  # the engine takes it as it is
    one = prompt.constrain({}, parallel=False)["grammar"]
    assert one.count('"<tool_call>"') == 1 < params["grammar"].count('"<tool_call>"')
    # A request's own grammar (format, response_format) holds the whole answer instead.
    assert prompt.constrain({"grammar": 'root ::= "x"'}) == {"grammar": 'root ::= "x"'}
    # Without offered tools, or with a template that marks no calls, nothing is added.
    assert ChatPrompt("text", True, None).constrain({}) == {}
