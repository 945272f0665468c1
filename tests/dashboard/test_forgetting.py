"""What the box keeps for an app key or a person is forgotten when they go: a key revoked or
deleted (from the keys page, the admin, the shell), a household's partition with its last live
key, a person deleted; another key's and another person's stay. The client is the embedded one
over a host whose engine keeps prompts in RAM, with a real disk tier for a model not loaded."""

import logging

import pytest
from django.db import transaction
from django.urls import reverse

from dashboard import forgetting
from dashboard.models import ApiKey
from inference.engine.host import ModelSpec
from inference.engine.runner_config import RunnerConfig
from inference.serving import client as client_module
from tests.dashboard.kept_prompts import OTHER, SHA, keep, on_disk, partitions_in
from tests.dashboard.kept_prompts import partitions_on_disk as on_disk_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def warm(kept):
    """A loaded model keeping prompts in RAM, another model's kept on disk (not loaded)."""
    kept.host.load(ModelSpec("m", RunnerConfig(model_path="/m.gguf"), sha256=SHA))
    return kept


@pytest.fixture
def committed(django_capture_on_commit_callbacks):
    """Run what was left for after the commit, then wait for the forgetting it started."""

    class Commit:
        def __enter__(self):
            self.callbacks = django_capture_on_commit_callbacks(execute=True)
            return self.callbacks.__enter__()

        def __exit__(self, *exc):
            self.callbacks.__exit__(*exc)
            assert forgetting.wait(10)

    return Commit


def test_revoking_a_key_on_the_keys_page_forgets_its_kept_prompts_and_no_one_elses(
    client, admin_user, warm, committed
):
    key, _ = ApiKey.create("old-script")
    other, _ = ApiKey.create("home-assistant")
    keep(warm.store, key.cache_partition, other.cache_partition, "user:1")
    on_disk(warm.directory, OTHER, [key.cache_partition, other.cache_partition])
    client.force_login(admin_user)

    with committed():
        client.post(reverse("revoke_api_key", args=[key.pk]), {"confirm": "yes"})

    assert partitions_in(warm.store) == sorted([other.cache_partition, "user:1"])
    assert on_disk_of(warm.directory, OTHER) == [other.cache_partition]


def test_deleting_a_key_forgets_its_kept_prompts(warm, committed):
    key, _ = ApiKey.create("tagger")
    other, _ = ApiKey.create("open-webui")
    keep(warm.store, key.cache_partition, other.cache_partition)
    with committed():
        key.delete()
    assert partitions_in(warm.store) == [other.cache_partition]


def test_a_households_kept_prompts_go_with_its_last_live_key(warm, committed):
    kitchen, _ = ApiKey.create("kitchen", household="home")
    hall, _ = ApiKey.create("hall", household="home")
    alone, _ = ApiKey.create("alone")
    keep(warm.store, "household:home", alone.cache_partition)

    with committed():
        kitchen.revoked = True
        kitchen.save(update_fields=["revoked"])
    assert partitions_in(warm.store) == sorted(["household:home", alone.cache_partition])

    with committed():  # revoked keys do not count: the hall was the household's last
        hall.delete()
    assert partitions_in(warm.store) == [alone.cache_partition]


def test_deleting_a_person_forgets_their_kept_prompts_and_no_one_elses(
    django_user_model, warm, committed
):
    alice = django_user_model.objects.create_user("alice")
    bob = django_user_model.objects.create_user("bob")
    keep(warm.store, f"user:{alice.pk}", f"user:{bob.pk}", "apikey:1")
    on_disk(warm.directory, OTHER, [f"user:{alice.pk}"])
    with committed():
        alice.delete()
    assert partitions_in(warm.store) == sorted([f"user:{bob.pk}", "apikey:1"])
    assert on_disk_of(warm.directory, OTHER) == []


def test_revoking_keys_in_the_admin_forgets_them_too(client, admin_user, warm, committed):
    key, _ = ApiKey.create("nas")
    keep(warm.store, key.cache_partition)
    client.force_login(admin_user)
    with committed():
        client.post(reverse("admin:dashboard_apikey_changelist"),
                    {"action": "revoke", "_selected_action": [key.pk]})  # fmt: skip
    key.refresh_from_db()
    assert key.revoked and partitions_in(warm.store) == []


def test_a_save_that_does_not_revoke_forgets_nothing_nor_does_a_rolled_back_delete(warm, committed):
    key, _ = ApiKey.create("script")
    partition = key.cache_partition
    keep(warm.store, partition)
    with committed() as callbacks:
        key.priority = ApiKey.Priority.BACKGROUND  # a save that does not revoke
        key.save()
    assert callbacks == [] and partitions_in(warm.store) == [partition]
    with pytest.raises(RuntimeError), committed() as callbacks:
        with transaction.atomic():
            key.delete()
            raise RuntimeError("the delete is rolled back")
    assert callbacks == [] and partitions_in(warm.store) == [partition]


def test_a_failure_to_forget_is_logged_and_never_breaks_the_delete(
    warm, committed, monkeypatch, caplog
):
    async def refuse(**_):
        raise ConnectionError("no inference worker answered")

    monkeypatch.setattr(client_module._client, "forget_prompts", refuse)
    key, _ = ApiKey.create("gone")
    partition = key.cache_partition
    with caplog.at_level(logging.WARNING, logger="dashboard.forgetting"), committed():
        key.delete()
    assert not ApiKey.objects.filter(name="gone").exists()
    assert f"the kept prompts of {partition} could not be forgotten" in caplog.text
