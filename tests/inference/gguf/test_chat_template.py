"""Chat templates render like Hugging Face's, in a sandbox that hostile templates cannot leave."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.gguf import CHATML_TEMPLATE, ChatTemplateError, read_gguf, render_chat
from inference.gguf import chat_template as chat_template_module

CONVERSATION = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Name a colour."},
]


def test_the_starter_models_template_renders_a_two_turn_conversation(starter_model: Path) -> None:
    info = read_gguf(starter_model)

    prompt = render_chat(
        info.chat_template, CONVERSATION, bos_token=info.bos_token, eos_token=info.eos_token
    )

    # SmolLM2 adds its default system prompt when the conversation has none.
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "<|im_start|>user\nHi there<|im_end|>\n" in prompt
    assert "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n" in prompt
    assert prompt.endswith("<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n")


def test_without_a_generation_prompt_the_last_turn_closes_the_prompt(starter_model: Path) -> None:
    template = read_gguf(starter_model).chat_template

    prompt = render_chat(template, CONVERSATION, add_generation_prompt=False)

    assert prompt.endswith("<|im_start|>user\nName a colour.<|im_end|>\n")


def test_a_model_without_a_template_gets_chatml() -> None:
    prompt = render_chat(None, CONVERSATION[:1])

    assert prompt == "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    assert render_chat("", CONVERSATION[:1]) == render_chat(CHATML_TEMPLATE, CONVERSATION[:1])


def test_it_renders_hugging_face_features() -> None:
    template = (
        "{{ bos_token }}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}{{ m | tojson }}{% endgeneration %}{% endfor %}"
        "{% if tools %}{{ tools | length }} tools{% endif %}"
        "{{ strftime_now('%Y') | length }}{{ eos_token }}"
    )
    messages = [{"role": "user", "content": "héllo"}, {"role": "user", "content": "dropped"}]

    prompt = render_chat(template, messages, bos_token="<s>", eos_token="</s>", tools=[{}])

    assert prompt == '<s>{"role": "user", "content": "héllo"}1 tools4</s>'


def test_trim_and_lstrip_blocks_are_on_like_hugging_face() -> None:
    template = "{% for m in messages %}\n    {% if m %}{{ m.content }};{% endif %}\n{% endfor %}"

    assert render_chat(template, CONVERSATION[:2]) == "Hi there;Hello! How can I help?;"


def test_raise_exception_refuses_the_conversation_with_its_message() -> None:
    template = (
        "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}"
    )

    with pytest.raises(ChatTemplateError, match="refused the conversation: system first"):
        render_chat(template, CONVERSATION)


def test_a_syntax_error_is_a_chat_template_error() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        render_chat("{% for m in messages %}", CONVERSATION)


def test_an_undefined_variable_renders_empty_like_hugging_face() -> None:
    assert render_chat("{{ messages[0].tool_calls }}{{ nothing }}x", CONVERSATION) == "x"


def test_it_refuses_messages_that_are_not_a_list_of_role_dicts() -> None:
    with pytest.raises(ChatTemplateError, match="list of dicts"):
        render_chat(None, "hello")  # type: ignore[arg-type]
    with pytest.raises(ChatTemplateError, match="no role"):
        render_chat(None, [{"content": "hi"}])


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ ''.__class__ }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ joiner.__init__.__globals__ }}",
        "{{ namespace.__init__.__globals__ }}",
        "{{ raise_exception.__globals__ }}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{{ (messages|first).items.__self__.__class__ }}",
        "{{ self.__init__.__globals__ }}",
        "{{ '{0.__class__}'.format('') }}",
        "{{ messages.append(1) }}",
        "{{ messages[0].update({'role': 'system'}) }}",
    ],
)
def test_templates_that_reach_for_python_internals_fail_safely(template: str) -> None:
    with pytest.raises(ChatTemplateError):
        render_chat(template, CONVERSATION)


@pytest.mark.parametrize(
    "template",
    [
        "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxx{% endfor %}{% endfor %}",
        "{{ 'a' * 10000000000 }}",
        "{{ [1] * 100000000 }}",
        "{{ 10 ** 10000000 }}",
        "{{ '%999999999s' % 'a' }}",
        "{{ '%*s' % (999999999, 'a') }}",
        "{{ '%(a)999999999s' % {'a': 1} }}",
        "{{ '{:>999999999}'.format('a') }}",
        "{{ 'a'.ljust(999999999) }}",
        "{{ ('a' * 100000).replace('a', 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa') }}",
        "{{ 'a' | center(999999999) }}",
        "{{ ('x\\n' * 1000) | indent(99999) }}",
        "{{ '%999999999s' | format('a') }}",
        "{{ messages | tojson(indent=1000000) }}",
        "{{ range(10) | slice(1000000000) | list }}",
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s | length }}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    ],
)
def test_templates_that_would_blow_up_are_stopped(template: str) -> None:
    with pytest.raises(ChatTemplateError):
        render_chat(template, CONVERSATION)


def test_a_huge_output_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    template = "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"

    with pytest.raises(ChatTemplateError, match="rendered prompt is over"):
        render_chat(template, CONVERSATION)


def test_a_busy_loop_runs_out_of_steps() -> None:
    template = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"

    with pytest.raises(ChatTemplateError, match="more than .* steps"):
        render_chat(template, CONVERSATION)


def test_a_slow_template_runs_out_of_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chat_template_module, "MAX_RENDER_SECONDS", 0.0)
    template = "{% for i in range(100000) %}{% endfor %}"

    with pytest.raises(ChatTemplateError, match="ran longer than"):
        render_chat(template, CONVERSATION)


def test_an_oversized_template_is_refused() -> None:
    template = "x" * (chat_template_module.MAX_TEMPLATE_CHARS + 1)

    with pytest.raises(ChatTemplateError, match="over the .* limit"):
        render_chat(template, CONVERSATION)


def test_ordinary_big_values_still_render() -> None:
    # The guards leave room for real prompts: a long document and ordinary widths.
    document = "word " * 100_000
    template = "{{ messages[0].content | length }}|{{ 'a' | center(9) }}|{{ '%5d' % 42 }}"

    assert (
        render_chat(template, [{"role": "user", "content": document}]) == "500000|    a    |   42"
    )
