"""Thinking blocks: which templates have a thinking mode, how the switch reaches them, and how a
streamed answer splits into thinking and content wherever the pieces break."""

import re

from hypothesis import given
from hypothesis import strategies as st

from inference.gguf.chat_template import render_chat
from inference.text.thinking import (
    ThinkingSplitter,
    close_thinking,
    prompt_opens_thinking,
    template_variables,
    thinking_mode,
)
from tests.inference.text.thinking_templates import DEEPSEEK_R1, FEW_SHOT, QWEN3

CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
HI = [{"role": "user", "content": "Hi"}]


def stream(splitter: ThinkingSplitter, pieces: list[str]) -> tuple[str, str]:
    thinking, content = "", ""
    for piece in pieces:
        t, c = splitter.feed(piece)
        thinking, content = thinking + t, content + c
    t, c = splitter.finish()
    return thinking + t, content + c


def characters(text: str) -> list[str]:
    return list(text)


def split_thinking(answer: str, *, inside: bool = False) -> tuple[str, str]:
    """A whole answer split at once: (thinking, content)."""
    return stream(ThinkingSplitter(inside=inside), [answer])


# 1. Templates.


def test_qwen3_and_deepseek_r1_templates_have_a_thinking_mode_and_chatml_has_none():
    assert thinking_mode(QWEN3)
    assert thinking_mode(DEEPSEEK_R1)
    assert thinking_mode("{% if enable_thinking %}x{% endif %}")
    assert not thinking_mode(CHATML)
    assert not thinking_mode("")
    assert not thinking_mode(None)


def test_the_switch_reaches_the_template_only_when_the_request_sets_it():
    assert template_variables(QWEN3, None) == {}
    assert template_variables(QWEN3, False) == {"enable_thinking": False}
    assert template_variables(QWEN3, True) == {"enable_thinking": True}
    assert template_variables(QWEN3, "low") == {"enable_thinking": True}
    effort = "{{ reasoning_effort }}"
    assert template_variables(effort, "high") == {"enable_thinking": True,
                                                  "reasoning_effort": "high"}  # fmt: skip


def test_qwen3_writes_an_empty_block_when_thinking_is_off_and_leaves_it_to_the_model_when_on():
    on = render_chat(QWEN3, HI, **template_variables(QWEN3, True))
    off = render_chat(QWEN3, HI, **template_variables(QWEN3, False))
    default = render_chat(QWEN3, HI, **template_variables(QWEN3, None))
    assert on == default and on.endswith("<|im_start|>assistant\n")
    assert off == on + "<think>\n\n</think>\n\n"
    assert not prompt_opens_thinking(on) and not prompt_opens_thinking(off)


def test_a_deepseek_r1_prompt_opens_the_block_and_closing_it_turns_thinking_off():
    prompt = render_chat(DEEPSEEK_R1, HI, bos_token="<s>")
    assert prompt.endswith("<｜Assistant｜><think>\n")
    assert prompt_opens_thinking(prompt)
    closed = close_thinking(prompt)
    assert closed == prompt + "\n</think>\n\n"
    assert not prompt_opens_thinking(closed)


def test_the_few_shot_template_opens_the_block_unless_thinking_is_off():
    assert prompt_opens_thinking(render_chat(FEW_SHOT, HI))
    assert not prompt_opens_thinking(render_chat(FEW_SHOT, HI, enable_thinking=False))


# 2. Splitting.


def test_an_answer_without_a_block_is_all_content_and_streams_at_once():
    splitter = ThinkingSplitter()
    assert splitter.feed("Hello") == ("", "Hello")
    assert splitter.feed(" <think>there") == ("", " <think>there")  # a later tag is text
    assert splitter.finish() == ("", "")


def test_a_block_at_the_start_is_thinking_without_its_tags_and_surrounding_whitespace():
    answer = "\n<think>\n  I should greet.\n</think>\n\nHello!"
    assert split_thinking(answer) == ("I should greet.", "Hello!")


def test_tags_split_across_pieces_are_held_back_until_they_are_known():
    splitter = ThinkingSplitter()
    assert splitter.feed("<th") == ("", "")
    assert splitter.feed("ink>Hmm") == ("Hmm", "")
    assert splitter.feed(", yes.\n</th") == (", yes.", "")
    assert splitter.thinking
    assert splitter.feed("ink>\n") == ("", "")
    assert not splitter.thinking
    assert splitter.feed("Yes") == ("", "Yes")
    assert splitter.finish() == ("", "")


def test_what_only_looked_like_a_tag_is_given_back_as_it_was():
    splitter = ThinkingSplitter()
    assert splitter.feed("<thi") == ("", "")
    assert splitter.feed("s is a tag>") == ("", "<this is a tag>")
    inside = ThinkingSplitter(inside=True)
    assert inside.feed("a </thin") == ("a", "")
    assert inside.feed("g>") == (" </thing>", "")


def test_an_unclosed_block_is_all_thinking():
    assert split_thinking("<think>I ran out of tok") == ("I ran out of tok", "")
    assert split_thinking("I ran out </thi", inside=True) == ("I ran out </thi", "")


def test_an_answer_that_starts_inside_a_block_the_prompt_opened_is_thinking_up_to_the_close():
    splitter = ThinkingSplitter(inside=True)
    assert splitter.thinking
    assert stream(splitter, characters("I greet back.\n</think>\n\nHello!")) == (
        "I greet back.",
        "Hello!",
    )


def test_an_answer_that_is_only_a_possible_tag_or_whitespace_is_content():
    assert split_thinking("<thi") == ("", "<thi")
    assert split_thinking("  \n") == ("", "")
    assert split_thinking("") == ("", "")


# 3. Streaming changes nothing, and the rules are what a plain reading of them gives.


def oracle(answer: str, inside: bool) -> tuple[str, str]:
    """The rules, read plainly: a leading block (or everything up to the first close, when the
    prompt opened it) is thinking, stripped; the rest is content, without leading whitespace."""
    if not inside:
        match = re.match(r"\s*<think>", answer)
        if match is None:
            return "", answer.lstrip()
        answer = answer[match.end() :]
    thinking, closed, content = answer.partition("</think>")
    return thinking.strip(), content.lstrip() if closed else ""


ALPHABET = st.sampled_from(["<think>", "</think>", "<", "</", "<th", "think>", "k>", " ", "\n",
                            "a", "b", "<tool_call>"])  # fmt: skip


@given(st.lists(ALPHABET, max_size=30), st.lists(st.integers(1, 12), max_size=30), st.booleans())
def test_any_answer_in_any_pieces_splits_as_the_rules_say(tokens, cuts, inside):
    answer = "".join(tokens)
    pieces, rest = [], answer
    for cut in cuts:
        pieces.append(rest[:cut])
        rest = rest[cut:]
    pieces.append(rest)
    assert stream(ThinkingSplitter(inside=inside), pieces) == oracle(answer, inside)
