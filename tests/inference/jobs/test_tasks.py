"""The Celery jobs: explicit names, the "jobs" queue, time limits, retries only for named
errors, and the retention task calling the history module."""

from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone

from appliance.celery import app
from inference.jobs import tasks
from inference.models import RequestRecord

JOB_TASKS = [
    "inference.hash_model", "inference.download_model", "inference.scan_models_dir",
    "inference.prune_request_history", "inference.unload_idle_models", "inference.prune_blobs",
]  # fmt: skip


@pytest.mark.parametrize("name", JOB_TASKS)
def test_each_job_has_an_explicit_name_a_time_limit_and_the_jobs_queue(name):
    task = app.tasks[name]
    assert task.soft_time_limit and task.time_limit > task.soft_time_limit
    route = app.amqp.router.route({}, name)
    assert route["queue"].name == "jobs"


def test_database_tasks_retry_only_a_database_error_with_backoff():
    for task in (tasks.hash_model, tasks.download_model, tasks.prune_request_history,
                 tasks.prune_blobs):
        assert task.autoretry_for == (OperationalError,)
        assert task.retry_backoff and task.max_retries == 5


@pytest.mark.django_db
def test_the_retention_task_prunes_old_request_records(settings):
    settings.REQUEST_RETENTION_DAYS = 7
    old = RequestRecord.objects.create(request_id="old", model_name="m", source="chat",
                                       outcome="stop")  # fmt: skip
    RequestRecord.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=8))
    RequestRecord.objects.create(request_id="new", model_name="m", source="chat", outcome="stop")

    assert tasks.prune_request_history() == 1
    assert list(RequestRecord.objects.values_list("request_id", flat=True)) == ["new"]


@pytest.mark.django_db
def test_the_scan_task_returns_the_names_it_registered(tiny_file):
    assert tasks.scan_models_dir() == ["tiny-chat-q8_0"]
    assert tasks.scan_models_dir() == []
