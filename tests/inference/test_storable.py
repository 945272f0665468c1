"""inference.storable: values PostgreSQL and SQLite both store, so a row is the same in both
modes (what a model writes, an app sends or a GGUF file says may hold any of these)."""

import math

import pytest

from dashboard.models import Message
from inference import storable
from inference.models import Job, LLMModel


def test_a_nul_in_text_becomes_the_replacement_character():
    assert storable.text("a\x00b\x00") == "a\ufffdb\ufffd"
    assert storable.text("plain") == "plain"


def test_json_keeps_its_shape_with_nul_marked_and_non_finite_numbers_null():
    value = {"k\x00": ["v\x00", math.nan, 1.5, {"inf": math.inf}], "n": 3, "none": None}

    assert storable.json_value(value) == {
        "k\ufffd": ["v\ufffd", None, 1.5, {"inf": None}], "n": 3, "none": None,
    }  # fmt: skip


def test_an_integer_beyond_its_column_is_unknown_where_it_may_be_null():
    context_length = LLMModel._meta.get_field("context_length")  # IntegerField, null=True
    parameter_count = LLMModel._meta.get_field("parameter_count")  # BigIntegerField

    assert storable.field_value(context_length, 2**40) is None
    assert storable.field_value(context_length, 131072) == 131072
    assert storable.field_value(parameter_count, 2**64) is None
    assert storable.field_value(parameter_count, 2**40) == 2**40


def test_an_integer_beyond_a_column_that_may_not_be_null_is_held_at_the_bound():
    pk = Message._meta.get_field("id")  # BigAutoField: never null
    assert storable.field_value(pk, 2**70) == 2**63 - 1
    n_ctx = LLMModel._meta.get_field("n_ctx")  # PositiveIntegerField
    assert storable.field_value(n_ctx, -1) == 0


def test_update_values_are_made_storable_by_their_fields():
    fields = storable.values(Job, message="bad\x00", detail={"why": "\x00"}, progress=0.5)

    assert fields == {"message": "bad\ufffd", "detail": {"why": "\ufffd"}, "progress": 0.5}


def test_a_value_with_nothing_to_change_is_the_same_object():
    message = Message._meta.get_field("content")
    content = "hello"
    assert storable.field_value(message, content) is content


@pytest.mark.django_db
def test_a_save_reads_no_field_it_did_not_load(member, django_assert_num_queries):
    from dashboard.models import Conversation

    conversation = Conversation.objects.create(user=member, title="t")
    Message.objects.create(conversation=conversation, role=Message.Role.USER, content="hi")
    partial = Message.objects.only("id", "content").get()
    partial.content = "a\x00b"

    with django_assert_num_queries(1):  # the UPDATE alone
        partial.save(update_fields=["content"])
    assert Message.objects.get().content == "a\ufffdb"
