"""Vision models in the catalog: a language model file with a projector, registered by
import_model --mmproj and by the models-directory scan, loaded with it (spec_for), sized with it
(the estimate and the preflight), and refused with the projector's reason when it does not fit."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from inference.catalog.importing import IsProjector, register_file, scan_report
from inference.catalog.operations import estimate
from inference.catalog.projectors import register_projector, with_projector
from inference.catalog.specs import spec_for
from inference.engine.host import ModelSpec
from inference.gguf.projector import ProjectorError
from inference.jobs.tasks import schedule_hash
from inference.models import LLMModel, Projector
from inference.planning import preflight
from tests.inference.gguf.conftest import EMBED
from tests.inference.ggufs import tiny_gguf
from tests.inference.projectors import projector_at as write_projector

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = StringIO()
    call_command("import_model", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def mmproj(models_dir, tiny_file):
    return write_projector(models_dir / "mmproj-tiny-f32.gguf", tiny_file)


# 1. import_model --mmproj.


def test_import_with_mmproj_registers_a_vision_model(models_dir, tiny_file, mmproj):
    output = run(str(tiny_file), "--mmproj", str(mmproj), "--name", "looker")

    model = LLMModel.objects.get(name="looker")
    assert model.projector.file_path == str(mmproj)
    assert len(model.projector.sha256) == 64
    assert (model.projector.projector_type, model.projector.projection_dim) == ("mlp", EMBED)
    assert model.takes_images
    assert "takes images with mmproj-tiny-f32.gguf" in output


def test_a_projector_outside_the_models_directory_is_copied_in(models_dir, tmp_path, tiny_file):
    outside = write_projector(tmp_path / "elsewhere" / "mmproj.gguf", tiny_file)
    run(str(tiny_file), "--mmproj", str(outside))
    projector = Projector.objects.get()
    assert projector.file_path == str(models_dir / "mmproj.gguf")
    assert (models_dir / "mmproj.gguf").read_bytes() == outside.read_bytes()
    assert outside.exists()


def test_one_language_model_serves_several_entries_each_with_its_own_projector(
    models_dir, tiny_file
):
    first = write_projector(models_dir / "mmproj-a.gguf", tiny_file, seed=1)
    second = write_projector(models_dir / "mmproj-b.gguf", tiny_file, seed=2)
    run(str(tiny_file), "--name", "plain")
    run(str(tiny_file), "--mmproj", str(first), "--name", "eyes-a")
    run(str(tiny_file), "--mmproj", str(second), "--name", "eyes-b")

    entries = {m.name: m for m in LLMModel.objects.filter(file_path=str(tiny_file))}
    assert set(entries) == {"plain", "eyes-a", "eyes-b"}
    assert entries["plain"].projector is None
    assert entries["eyes-a"].projector.file_path == str(first)
    assert entries["eyes-b"].projector.file_path == str(second)
    assert entries["eyes-a"].sha256 == entries["plain"].sha256  # the same file, hashed once
    # Importing a pair again is the same entry.
    run(str(tiny_file), "--mmproj", str(first))
    assert LLMModel.objects.filter(file_path=str(tiny_file)).count() == 3


def test_a_projector_made_for_another_model_is_refused_with_the_reason(models_dir, tiny_file):
    wrong = write_projector(models_dir / "mmproj.gguf", tiny_file, n_embd=2 * EMBED)
    with pytest.raises(CommandError, match=f"projection width .* is {2 * EMBED}, but the "
                       f"language model's embedding width is {EMBED}"):  # fmt: skip
        run(str(tiny_file), "--mmproj", str(wrong))
    assert LLMModel.all_objects.count() == 0 and Projector.objects.count() == 0


def test_a_projector_of_a_type_llama_cpp_does_not_know_is_refused(models_dir, tiny_file):
    unknown = write_projector(models_dir / "mmproj.gguf", tiny_file, projector_type="hologram")
    with pytest.raises(CommandError, match="'hologram' is not one this llama.cpp knows"):
        run(str(tiny_file), "--mmproj", str(unknown))


def test_a_language_model_given_as_the_projector_is_refused(models_dir, tiny_file, outside_file):
    with pytest.raises(CommandError, match="not 'clip': it is not a projector"):
        run(str(tiny_file), "--mmproj", str(outside_file))


def test_a_projector_is_never_registered_as_a_model(mmproj):
    with pytest.raises(IsProjector, match="is a vision projector"):
        register_file(mmproj, source=LLMModel.Source.IMPORT)
    with pytest.raises(CommandError, match="is a vision projector"):
        run(str(mmproj))
    assert LLMModel.all_objects.count() == 0


# 2. The models-directory scan.


def test_the_scan_pairs_an_mmproj_with_the_model_beside_it(models_dir, tiny_file, mmproj):
    new, skipped = scan_report(schedule_hash)

    assert skipped == []
    (model,) = new
    assert model.file_path == str(tiny_file)
    assert model.projector.file_path == str(mmproj)
    assert not LLMModel.all_objects.filter(file_path=str(mmproj)).exists()
    assert scan_report(schedule_hash) == ([], [])  # idempotent


def test_an_mmproj_dropped_in_later_is_paired_with_the_model_already_there(
    models_dir, tiny_file
):
    (model,) = scan_report(schedule_hash)[0]
    assert model.projector is None
    mmproj = write_projector(models_dir / "mmproj.gguf", tiny_file)
    assert scan_report(schedule_hash) == ([], [])
    model.refresh_from_db()
    assert model.projector.file_path == str(mmproj)


def test_the_scan_pairs_only_models_in_the_projectors_directory(models_dir, tiny_file):
    elsewhere = tiny_gguf(models_dir / "other" / "other.gguf")
    write_projector(models_dir / "other" / "mmproj.gguf", elsewhere)
    new, _ = scan_report(schedule_hash)
    by_path = {m.file_path: m for m in new}
    assert by_path[str(tiny_file)].projector is None
    assert by_path[str(elsewhere)].projector is not None


def test_a_projector_that_fits_no_model_beside_it_pairs_with_none(models_dir, tiny_file):
    write_projector(models_dir / "mmproj.gguf", tiny_file, n_embd=2 * EMBED)
    (model,) = scan_report(schedule_hash)[0]
    assert model.projector is None
    assert Projector.objects.count() == 1  # registered: the page can offer it


def test_a_broken_projector_is_skipped_with_its_reason(models_dir, tiny_file):
    write_projector(models_dir / "mmproj.gguf", tiny_file, projector_type="ultravox")
    _, skipped = scan_report(schedule_hash)
    assert [path for path, _ in skipped] == [str(models_dir / "mmproj.gguf")]
    assert "encodes audio, not images" in skipped[0][1]
    assert Projector.objects.count() == 0


# 3. Loading and sizing.


def test_the_spec_loads_the_projector_and_carries_its_digest(models_dir, tiny_file, mmproj):
    run(str(tiny_file), "--mmproj", str(mmproj), "--name", "looker")
    spec = spec_for(LLMModel.objects.get(name="looker"))
    projector = Projector.objects.get()
    assert spec.config.mmproj_path == str(mmproj)
    assert spec.mmproj_sha256 == spec.config.mmproj_sha256 == projector.sha256
    sent = ModelSpec.from_wire(spec.to_wire())
    assert sent.mmproj_sha256 == sent.config.mmproj_sha256 == projector.sha256


def test_a_text_only_entry_loads_without_a_projector(models_dir, tiny_file):
    run(str(tiny_file), "--name", "plain")
    spec = spec_for(LLMModel.objects.get())
    assert (spec.config.mmproj_path, spec.mmproj_sha256, spec.config.mmproj_sha256) == ("", "", "")


def test_the_estimate_grows_by_the_projector_weights_and_encoder(models_dir, tiny_file, mmproj):
    run(str(tiny_file), "--name", "plain")
    run(str(tiny_file), "--mmproj", str(mmproj), "--name", "looker")
    plain, _ = estimate(LLMModel.objects.get(name="plain"))
    vision, _ = estimate(LLMModel.objects.get(name="looker"))
    projector = preflight.projector_of(spec_for(LLMModel.objects.get(name="looker")).config,
                                       preflight.gguf_info(tiny_file))  # fmt: skip
    assert vision.weights_bytes == plain.weights_bytes + projector.weights_bytes
    assert vision.compute_bytes == plain.compute_bytes + projector.encoder_compute_bytes
    looker = LLMModel.objects.get(name="looker")
    assert looker.estimated_bytes > LLMModel.objects.get(name="plain").estimated_bytes


def test_the_preflight_refuses_a_projector_that_no_longer_fits_the_model(
    models_dir, tiny_file, mmproj
):
    run(str(tiny_file), "--mmproj", str(mmproj), "--name", "looker")
    spec = spec_for(LLMModel.objects.get(name="looker"))
    preflight.validate(spec)  # as registered, it passes
    write_projector(mmproj, tiny_file, n_embd=2 * EMBED)  # replaced on disk by another
    with pytest.raises(ProjectorError, match="it was made for another model"):
        preflight.validate(spec)
    with pytest.raises(ProjectorError, match="it was made for another model"):
        preflight.fit(spec)


def test_with_projector_gives_a_text_only_entry_its_first_projector(models_dir, tiny_file, mmproj):
    run(str(tiny_file), "--name", "plain")
    projector = register_projector(mmproj, source=LLMModel.Source.IMPORT, n_embd=EMBED)
    model = with_projector(LLMModel.objects.get(), projector)
    assert model.name == "plain" and model.projector == projector
    assert LLMModel.objects.count() == 1


# 4. Deleting.


def test_deleting_one_entry_of_a_shared_file_keeps_the_file_for_the_others(
    models_dir, tiny_file, mmproj
):
    from inference.catalog.operations import unregister

    run(str(tiny_file), "--name", "plain")
    run(str(tiny_file), "--mmproj", str(mmproj), "--name", "looker")
    said = unregister(LLMModel.objects.get(name="looker"))
    assert said == "looker deleted; its file stays, plain loads it"
    assert tiny_file.exists()
    # Its projector, which nothing else uses, went with it.
    assert not mmproj.exists() and Projector.objects.count() == 0
    assert unregister(LLMModel.objects.get(name="plain")) == "plain deleted with its file"
    assert not tiny_file.exists()


def test_a_projector_another_entry_uses_stays_when_one_goes(models_dir, tiny_file, mmproj):
    from inference.catalog.operations import unregister

    other = tiny_gguf(models_dir / "other.gguf")
    run(str(tiny_file), "--mmproj", str(mmproj), "--name", "one")
    run(str(other), "--mmproj", str(mmproj), "--name", "two")
    unregister(LLMModel.objects.get(name="one"))
    assert mmproj.exists() and LLMModel.objects.get(name="two").projector is not None


@pytest.mark.django_db(transaction=True)
async def test_a_model_found_by_any_name_brings_its_projector_for_the_event_loop(
    models_dir, tiny_file, mmproj
):
    from asgiref.sync import sync_to_async

    from inference.catalog.creating import add_name, derive
    from inference.catalog.lookup import resolve

    def make():
        run(str(tiny_file), "--mmproj", str(mmproj), "--name", "looker")
        looker = LLMModel.objects.get(name="looker")
        add_name(looker, "eyes:v1")
        derive(looker, "peeker")

    await sync_to_async(make)()
    for name in ("looker", "eyes:v1", "peeker"):
        model = await sync_to_async(resolve)(name)
        # On the event loop, where a query would raise: everything spec_for reads came along.
        assert spec_for(model).config.mmproj_path == str(mmproj)


def test_a_hash_job_hashes_every_entry_of_the_file(models_dir, tiny_file, mmproj):
    from inference.catalog.importing import hash_model_job
    from inference.models import Job

    (looker,) = scan_report(schedule_hash)[0]  # registered unhashed, for a job
    second = register_projector(write_projector(models_dir / "mmproj-2.gguf", tiny_file, seed=9),
                                source="scan", n_embd=None)  # fmt: skip
    other = with_projector(looker, second, name="other-eyes")
    LLMModel.objects.filter(file_path=str(tiny_file)).update(sha256="")

    digest = hash_model_job(Job.objects.create(kind=Job.Kind.HASH, model=looker).id)

    assert {m.sha256 for m in LLMModel.objects.filter(pk__in=[looker.pk, other.pk])} == {digest}
