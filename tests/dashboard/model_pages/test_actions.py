"""Load, unload, make default and delete from the pages, through the inference client."""

import re
import threading

import pytest
from django.urls import reverse

from inference.catalog.importing import register_file
from inference.catalog.specs import spec_for
from inference.engine.params import SamplingParams
from inference.models import LLMModel
from inference.planning import preflight as preflight_module
from inference.planning.memory import AvailableMemory
from tests.dashboard.model_pages.conftest import flashes
from tests.inference.engine.fakes import ask, wait_until
from tests.inference.ggufs import corrupt_copy, tiny_gguf

pytestmark = pytest.mark.django_db


def load(client, model):
    return client.post(reverse("model-load", args=[model.name]))


def loaded(fake_engine) -> list[str]:
    return [row["name"] for row in fake_engine.host.loaded()]


def test_load_loads_through_the_client_and_records_the_load(staff, tiny_model, fake_engine):
    response = load(staff, tiny_model)

    assert response.status_code == 302
    assert response["Location"] == reverse("model-detail", args=[tiny_model.name])
    assert flashes(response)[0].startswith(f"{tiny_model.name} is loaded")
    assert loaded(fake_engine) == [tiny_model.name]
    tiny_model.refresh_from_db()
    assert tiny_model.last_load_seconds is not None and tiny_model.last_used_at is not None
    assert tiny_model.estimated_bytes > 0


def test_a_load_of_a_corrupt_file_is_refused_with_the_readers_message(
    staff, models_dir, outside_file, fake_engine
):
    good = tiny_gguf(models_dir / "soon-broken.gguf")
    model = register_file(good, source="scan", hash_file=False)
    corrupt_copy(outside_file, good)  # the file broke after it was registered

    response = load(staff, model)

    (message,) = flashes(response)
    assert message.startswith(f"{model.name} was not loaded: ")
    assert "runs past the end of the file" in message
    assert loaded(fake_engine) == [] and fake_engine.runners == []


def test_a_load_that_cannot_fit_is_refused_with_the_numbers(staff, tiny_model, fake_engine,
                                                           monkeypatch):  # fmt: skip
    monkeypatch.setattr(preflight_module, "available_memory",
                        lambda: AvailableMemory(ram_bytes=1024, gpu_bytes=None))  # fmt: skip
    (message,) = flashes(load(staff, tiny_model))
    assert "was not loaded: needs" in message and "but only 0 MiB of RAM is free" in message
    assert loaded(fake_engine) == []


def test_unload_unloads_and_says_so(staff, tiny_model, fake_engine):
    load(staff, tiny_model)
    response = staff.post(reverse("model-unload", args=[tiny_model.name]))
    assert flashes(response)[-1] == f"{tiny_model.name} unloaded."
    assert loaded(fake_engine) == []
    again = staff.post(reverse("model-unload", args=[tiny_model.name]))
    assert flashes(again)[-1] == f"{tiny_model.name} was not loaded."


def test_there_is_one_default_model(staff, tiny_model, models_dir):
    other = register_file(tiny_gguf(models_dir / "other.gguf"), source="scan", hash_file=False)
    staff.post(reverse("model-default", args=[other.name]))
    assert list(LLMModel.objects.filter(is_default=True)) == [other]


def test_delete_asks_for_confirmation_first(staff, tiny_model):
    page = staff.get(reverse("model-delete", args=[tiny_model.name])).content.decode()
    assert f"Delete {tiny_model.name}?" in page and "deleted from disk" in page
    assert LLMModel.objects.filter(pk=tiny_model.pk).exists()


def test_delete_is_refused_while_the_model_answers(staff, tiny_model, fake_engine, tiny_file):
    load(staff, tiny_model)
    (runner,) = fake_engine.runners
    runner.gate = threading.Event()
    handle = fake_engine.host.submit(spec_for(tiny_model), ask("hi", SamplingParams(max_tokens=2)))
    assert wait_until(runner.executing.is_set)

    response = staff.post(reverse("model-delete", args=[tiny_model.name]))

    assert flashes(response)[-1] == (
        f"{tiny_model.name} was not deleted: {tiny_model.name} is answering a request; "
        "delete it when it is idle"
    )
    assert tiny_file.exists() and LLMModel.objects.filter(pk=tiny_model.pk).exists()
    runner.gate.set()
    assert handle.result(10).type == "done"


def test_delete_unloads_an_idle_model_and_removes_its_file(staff, tiny_model, fake_engine,
                                                          tiny_file):  # fmt: skip
    load(staff, tiny_model)

    response = staff.post(reverse("model-delete", args=[tiny_model.name]))

    assert response["Location"] == reverse("models")
    assert flashes(response)[-1] == f"{tiny_model.name} deleted with its file."
    assert loaded(fake_engine) == []
    assert not tiny_file.exists()
    assert not LLMModel.all_objects.filter(pk=tiny_model.pk).exists()


def test_deleting_a_packaged_model_hides_it_and_keeps_its_file(staff, starter_path, models_dir):
    from inference.catalog.importing import register_packaged_models

    (model,) = register_packaged_models()
    page = staff.get(reverse("model-delete", args=[model.name])).content.decode()
    assert "belongs to an installed package" in page

    staff.post(reverse("model-delete", args=[model.name]))

    assert starter_path.is_file()
    assert LLMModel.all_objects.get(pk=model.pk).hidden
    assert staff.get(reverse("model-detail", args=[model.name])).status_code == 404
    assert register_packaged_models() == []


@pytest.mark.model
def test_a_real_load_records_what_it_took_next_to_the_estimate(staff, starter_model):
    """The starter model through llama.cpp, in a client of its own (unloaded afterwards)."""
    from inference.serving import client as client_module
    from inference.serving.client import EmbeddedClient, set_client

    previous = client_module._client
    client = EmbeddedClient()
    set_client(client)
    try:
        starter_model.n_ctx, starter_model.parallel, starter_model.keep_alive = 512, 1, "-1"
        starter_model.save()
        response = load(staff, starter_model)
        assert flashes(response)[0].startswith(f"{starter_model.name} is loaded in ")
        starter_model.refresh_from_db()
        assert starter_model.measured_bytes and starter_model.measured_bytes > 0
        assert starter_model.estimated_bytes > starter_model.size_bytes * 0.9
        page = staff.get(reverse("model-detail", args=[starter_model.name])).content.decode()
        assert "Measured at the last load with the Load button" in page
        assert "not measured yet" not in page
        # One source for the load state: the badge and the line both say loaded.
        assert 'id="loaded-badge"' in page and ">loaded</span>" in page
        assert re.search(r'id="load-state"[^>]*>Loaded \d+s ago \(the load took ', page)
    finally:
        set_client(previous)
        client.host.shutdown()
