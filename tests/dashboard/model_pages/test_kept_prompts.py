"""A model's kept prompts (warm memory) on its page: what it keeps, a staff button that forgets
them all, on every box, and a delete that takes them with the model. The inference client's
host runs fake runners whose engine keeps prompts in a real PromptStore; the disk tier is real
files under this test's data directory."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from django.urls import reverse

from inference.engine.host import EngineHost
from inference.engine.tiers import KvLayout, PromptStore, files
from inference.engine.tiers.disk import DiskTier
from inference.planning.preflight import fit
from inference.serving import client as client_module
from inference.serving.client import EmbeddedClient, set_client
from inference.serving.hosting import EMBEDDED, prompt_cache_config
from tests.dashboard.model_pages.conftest import flashes
from tests.inference.engine.fakes import FakeRunner, engines_on

pytestmark = pytest.mark.django_db

SHA, OTHER = "ab" * 32, "cd" * 32


@pytest.fixture
def kept(settings, tmp_path):
    """The client's host keeps prompts in `store` for the model it loads; the worker's disk tier
    lives under this test's own data directory."""
    settings.DATA_DIR = tmp_path
    store = PromptStore(1 << 20)
    host = EngineHost(engines_on(lambda config: FakeRunner(), prompts=store), max_loaded=2,
                      preflight=fit)  # fmt: skip
    previous = client_module._client
    set_client(EmbeddedClient(host))
    yield SimpleNamespace(host=host, store=store,
                          directory=Path(prompt_cache_config(EMBEDDED).directory))  # fmt: skip
    set_client(previous)
    host.shutdown()


@pytest.fixture
def hashed_model(tiny_model):
    tiny_model.sha256 = SHA
    tiny_model.save(update_fields=["sha256"])
    return tiny_model


def on_disk(directory, sha: str, partitions: list[str]) -> None:
    """Kept prompts of the model `sha` written to the worker's disk tier, as a runner leaves
    them when it stops."""
    layout = KvLayout(sha, 1, 1, 256, "f16", True, -1, "fake 1")
    store = PromptStore(1 << 20, DiskTier(directory, layout, 1 << 30)).open()
    for n, partition in enumerate(partitions):
        store.put(partition, f"c{n}", list(range(100 * n, 100 * n + 20)), bytearray(b"s" * 64))
    store.flush(10)
    store.close()


def files_of(directory, sha: str) -> int:
    return len(list((directory / sha).glob(f"*/*{files.SUFFIX}")))


def forget(client, model):
    return client.post(reverse("model-forget-prompts", args=[model.name]))


def test_staff_forget_a_loaded_models_kept_prompts_and_are_told_how_many(
    staff, hashed_model, kept
):
    staff.post(reverse("model-load", args=[hashed_model.name]))
    for partition in ("apikey:1", "user:2"):
        kept.store.put(partition, "c", list(range(20)), bytearray(b"s" * 64))
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
    kept.store.put("apikey:1", "c", list(range(20)), bytearray(b"s" * 64))
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
