"""A model's kept prompts (warm memory) on its page: what it keeps, a staff button that forgets
them all, on every box, and a delete that takes them with the model. The inference client's
host runs fake runners whose engine keeps prompts in a real PromptStore; the disk tier is real
files under this test's data directory."""

import dataclasses
from pathlib import Path

import pytest
from django.urls import reverse

from inference.engine.host import EngineHost
from inference.engine.tiers import PromptStore
from inference.engine.tiers.disk import DiskTier
from inference.serving import client as client_module
from inference.serving.client import EmbeddedClient, set_client
from inference.serving.hosting import EMBEDDED, prompt_cache_config
from tests.dashboard import kept_prompts
from tests.dashboard.kept_prompts import OTHER, SHA, files_of, keep, on_disk
from tests.dashboard.model_pages.conftest import flashes
from tests.inference.engine.fakes import FakeRunner, engines_on

pytestmark = pytest.mark.django_db


@pytest.fixture
def hashed_model(tiny_model):
    tiny_model.sha256 = SHA
    tiny_model.save(update_fields=["sha256"])
    return tiny_model


@pytest.fixture
def reloaded_smaller(settings, tmp_path):
    """Kept prompts of 20 tokens on disk from a load with 256 tokens a sequence; the host's
    engines keep prompts in a store opened on them with 16 (a client asked a smaller num_ctx)."""
    settings.DATA_DIR = tmp_path
    directory = Path(prompt_cache_config(EMBEDDED).directory)
    on_disk(directory, SHA, ["apikey:1", "user:2"])
    layout = dataclasses.replace(kept_prompts._layout(SHA), ctx_per_seq=16)
    store = PromptStore(1 << 20, DiskTier(directory, layout, 1 << 30)).open()
    host = EngineHost(engines_on(lambda config: FakeRunner(), prompts=store), max_loaded=1)
    previous = client_module._client
    set_client(EmbeddedClient(host))
    yield host
    set_client(previous)
    host.shutdown()
    store.close()


def test_the_page_says_what_a_load_dropped_from_disk_and_why(
    staff, hashed_model, reloaded_smaller
):
    staff.post(reverse("model-load", args=[hashed_model.name]))
    page = staff.get(reverse("model-detail", args=[hashed_model.name])).content.decode()
    assert ("At load it dropped 2 entries: longer than this load&#x27;s context (16 tokens)."
            in page)  # fmt: skip


def forget(client, model):
    return client.post(reverse("model-forget-prompts", args=[model.name]))


def test_staff_forget_a_loaded_models_kept_prompts_and_are_told_how_many(
    staff, hashed_model, kept
):
    staff.post(reverse("model-load", args=[hashed_model.name]))
    keep(kept.store, "apikey:1", "user:2")
    page = staff.get(reverse("model-detail", args=[hashed_model.name])).content.decode()
    assert "Forget cached prompts" in page
    assert "Kept in RAM 0 KiB of 1 MiB (2 prompts), no disk tier. No request yet" in page

    response = forget(staff, hashed_model)

    assert response["Location"] == reverse("model-detail", args=[hashed_model.name])
    assert flashes(response) == [f"Forgot 2 cached prompts of {hashed_model.name}."]
    assert kept.store.held() == []
    again = forget(staff, hashed_model)
    assert flashes(again)[-1] == f"{hashed_model.name} had no cached prompts to forget."


def test_a_model_that_is_not_loaded_has_its_kept_prompts_on_disk_forgotten(
    staff, hashed_model, kept
):
    on_disk(kept.directory, SHA, ["apikey:1", "user:2"])
    on_disk(kept.directory, OTHER, ["apikey:1"])  # another model's: they stay
    page = staff.get(reverse("model-detail", args=[hashed_model.name])).content.decode()
    assert "Not loaded: the prompts it keeps on disk wait for its next load." in page

    assert flashes(forget(staff, hashed_model)) == [
        f"Forgot 2 cached prompts of {hashed_model.name}."]  # fmt: skip
    assert files_of(kept.directory, SHA) == 0 and files_of(kept.directory, OTHER) == 1


def test_deleting_a_model_forgets_its_kept_prompts_after_the_unload(staff, hashed_model, kept):
    staff.post(reverse("model-load", args=[hashed_model.name]))
    keep(kept.store, "apikey:1")
    on_disk(kept.directory, SHA, ["user:2"])
    on_disk(kept.directory, OTHER, ["user:2"])

    response = staff.post(reverse("model-delete", args=[hashed_model.name]))

    assert flashes(response)[-1] == f"{hashed_model.name} deleted with its file."
    assert kept.host.loaded() == []
    assert files_of(kept.directory, SHA) == 0 and files_of(kept.directory, OTHER) == 1


def test_a_delete_goes_on_when_its_kept_prompts_cannot_be_forgotten(
    staff, hashed_model, kept, monkeypatch, caplog
):
    async def refuse(**_):
        raise ConnectionError("the worker did not answer")

    monkeypatch.setattr(client_module._client, "forget_prompts", refuse)
    response = staff.post(reverse("model-delete", args=[hashed_model.name]))
    assert flashes(response)[-1] == f"{hashed_model.name} deleted with its file."
    assert "its kept prompts could not be forgotten" in caplog.text


def test_a_failure_to_forget_is_said_in_plain_words(staff, hashed_model, kept, monkeypatch):
    async def refuse(**_):
        raise ConnectionError("the worker did not answer")

    monkeypatch.setattr(client_module._client, "forget_prompts", refuse)
    assert flashes(forget(staff, hashed_model)) == [
        f"The cached prompts of {hashed_model.name} were not forgotten: the worker did not "
        "answer"]  # fmt: skip


def test_only_staff_forget_and_only_with_a_post(client, member_client, hashed_model, kept):
    url = reverse("model-forget-prompts", args=[hashed_model.name])
    assert member_client.post(url).status_code == 403
    page = member_client.get(reverse("model-detail", args=[hashed_model.name])).content.decode()
    assert "Forget cached prompts" not in page and "Kept prompts" in page
    client.logout()
    assert client.post(url).status_code == 302  # to the login page


def test_staff_cannot_get_the_forget_url(staff, hashed_model, kept):
    assert staff.get(reverse("model-forget-prompts", args=[hashed_model.name])).status_code == 405


def test_a_derived_model_points_to_its_base_for_its_kept_prompts(staff, hashed_model, kept):
    from inference.catalog.creating import derive

    derived = derive(hashed_model, "tiny-kind", system="Be kind.")
    on_disk(kept.directory, SHA, ["apikey:1"])
    assert flashes(forget(staff, derived)) == [
        f"tiny-kind's cached prompts are {hashed_model.name}'s: forget them on "
        f"{hashed_model.name}'s page."]  # fmt: skip
    assert files_of(kept.directory, SHA) == 1
