"""Split mode's database: PostgreSQL, as docker-compose.yml deploys it (`make test` runs this
module on it, with split mode's tests, in a pytest run of its own: the Makefile's SPLIT_TESTS
and SPLIT_DATABASE_URL). What SQLite takes and PostgreSQL refuses is stored the same way on both
(inference.storable): these rows would fail to save on PostgreSQL otherwise."""

import math
import os

import pytest

from dashboard.models import Conversation, Message
from inference.catalog.importing import register_file
from inference.jobs.progress import JobProgress
from inference.models import Job, LLMModel, RequestRecord
from tests.inference.ggufs import tiny_gguf

pytestmark = pytest.mark.django_db


@pytest.mark.skipif(not os.environ.get("CI"), reason="only CI is sure to have PostgreSQL")
def test_in_ci_these_tests_run_on_postgresql(settings):
    assert settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


def test_an_answer_with_nul_characters_is_saved_with_them_marked(member):
    conversation = Conversation.objects.create(user=member, title="a\x00b")
    answer = Message.objects.create(
        conversation=conversation, role=Message.Role.ASSISTANT, content="one\x00two",
        figures={"text\x00": "x\x00", "itl_max": math.inf},
    )  # fmt: skip

    answer.refresh_from_db()
    assert answer.content == "one\ufffdtwo"
    assert answer.figures == {"text\ufffd": "x\ufffd", "itl_max": None}
    assert Conversation.objects.get(pk=conversation.pk).title == "a\ufffdb"


def test_a_request_record_keeps_an_error_with_a_nul_character():
    record = RequestRecord.objects.create(
        request_id="r1", model_name="m", source="openai", outcome="error", error="bad\x00input"
    )

    assert RequestRecord.objects.get(pk=record.pk).error == "bad\ufffdinput"


def test_a_gguf_that_claims_numbers_beyond_the_columns_is_registered_with_them_unknown():
    model = LLMModel.objects.create(
        name="odd-header", file_path="/models/odd.gguf", architecture="llama\x00",
        context_length=2**40, parameter_count=2**64, layer_count=30,
        chat_template="{{ '\x00' }}", metadata={"general.name\x00": "odd\x00"},
    )  # fmt: skip

    model.refresh_from_db()
    assert (model.context_length, model.parameter_count, model.layer_count) == (None, None, 30)
    assert model.architecture == "llama\ufffd"
    assert model.chat_template == "{{ '\ufffd' }}"
    assert model.metadata == {"general.name\ufffd": "odd\ufffd"}


def test_a_gguf_file_whose_metadata_holds_a_nul_character_is_registered(models_dir):
    def describe(writer):
        writer.add_string("general.description", "one\x00two")

    path = tiny_gguf(models_dir / "nul.gguf", extra=describe)
    model = register_file(path, source=LLMModel.Source.SCAN, hash_file=False)

    model.refresh_from_db()
    assert model.metadata["keys"]["general.description"] == "one\ufffdtwo"


def test_a_job_that_fails_with_a_nul_in_its_message_is_marked_failed():
    job = Job.objects.create(kind=Job.Kind.DOWNLOAD)
    progress = JobProgress(job.pk)
    progress.note("fetching \x00")
    progress.fail("the server said \x00")

    job.refresh_from_db()
    assert (job.state, job.message) == (Job.State.FAILED, "the server said \ufffd")
