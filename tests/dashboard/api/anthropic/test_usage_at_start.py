"""Anthropic's streamed message_start counts the prompt in usage.input_tokens, as the real API
does (the anthropic client reads it), and the thinking switch may be turned off on any model."""

import anthropic
import pytest

from tests.dashboard.api.server import STARTER

pytestmark = pytest.mark.model


@pytest.fixture
def client(appliance) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=appliance.url, api_key=appliance.keys["chat-app"],
                               max_retries=0, timeout=120)  # fmt: skip


def test_message_start_counts_the_prompt(client):
    messages = [{"role": "user", "content": "Count these words for message_start, please."}]
    counted = client.messages.count_tokens(model=STARTER, messages=messages).input_tokens
    with client.messages.stream(model=STARTER, max_tokens=4, messages=messages,
                                extra_body={"temperature": 0}) as stream:  # fmt: skip
        events = list(stream)
        final = stream.get_final_message()
    start = next(event for event in events if event.type == "message_start")
    usage = start.message.usage
    assert usage.input_tokens > 0
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == counted
    assert usage.input_tokens == final.usage.input_tokens
    assert usage.output_tokens == 0


def test_thinking_disabled_is_fine_for_a_model_without_a_thinking_mode(client):
    message = client.messages.create(model=STARTER, max_tokens=4, extra_body={"temperature": 0},
                                     messages=[{"role": "user", "content": "Hi"}],
                                     thinking={"type": "disabled"})  # fmt: skip
    assert [block.type for block in message.content] == ["text"]
