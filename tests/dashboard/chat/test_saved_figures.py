"""What a saved answer's figures bring back to the chat page (turns.message_data): the ones its
chips show, with where its cached tokens came from and what speculation kept."""

import pytest

from dashboard.chat import turns
from dashboard.models import Conversation, Message

pytestmark = pytest.mark.django_db

ENGINE_FIGURES = {
    "ttft": 0.41, "prompt_tps": 380.0, "decode_tps": 61.0, "prompt_tokens": 460,
    "cached_tokens": 430, "output_tokens": 50, "queue_time": 0.0, "load_time": 0.0,
    "prefill_time": 0.08, "total_time": 1.3, "finish_reason": "stop",
    "cached_by_tier": {"resident": 0, "ram": 430, "disk": 0}, "restore_time": 0.002,
    "drafted": 48, "draft_accepted": 47,
    "itl": {"p50": 0.02, "p95": 0.03, "p99": 0.04, "max": 0.05},
    "timeline": [{"phase": "decode", "start": 0.4, "end": 1.3}],
}  # fmt: skip


def test_a_saved_answer_brings_back_its_cache_tiers_and_speculation(member):
    conversation = Conversation.objects.create(user=member, title="t")
    Message.objects.create(conversation=conversation, role="user", content="Hi")
    Message.objects.create(conversation=conversation, role="assistant", content="Hello",
                           figures=ENGINE_FIGURES)  # fmt: skip
    answer = turns.branch_data(conversation)["messages"][-1]
    assert answer["figures"]["cached_by_tier"] == {"resident": 0, "ram": 430, "disk": 0}
    assert answer["figures"]["restore_time"] == 0.002
    assert (answer["figures"]["drafted"], answer["figures"]["draft_accepted"]) == (48, 47)
    # What no chip shows stays in the message and the request history, not on the page.
    assert "timeline" not in answer["figures"] and "itl" not in answer["figures"]


def test_an_answer_saved_before_the_tiers_shows_what_it_had(member):
    conversation = Conversation.objects.create(user=member, title="t")
    new = ("cached_by_tier", "restore_time", "drafted", "draft_accepted")
    old = {key: value for key, value in ENGINE_FIGURES.items() if key not in new}
    Message.objects.create(conversation=conversation, role="assistant", content="Hi", figures=old)
    figures = turns.branch_data(conversation)["messages"][-1]["figures"]
    assert "cached_by_tier" not in figures and figures["cached_tokens"] == 430
