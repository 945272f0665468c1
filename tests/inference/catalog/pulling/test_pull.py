"""Pull jobs against a registry on loopback: a model pulled by name is registered under that
name with its layers used, verified against its digest, resumed after a dropped connection
(within a job and from the partial file a failed job left), and refused with the status an
API answer gets for it."""

import hashlib
import json
import threading

import pytest

from inference.catalog.importing import install_file
from inference.catalog.lookup import resolve
from inference.catalog.pulling.pull import pull_model
from inference.jobs.progress import reset_for_retry
from inference.models import Job, LLMModel, PulledName
from tests.inference.catalog.pulling.registry import digest_of
from tests.inference.engine.fakes import wait_until


def pull(name: str, **options) -> tuple[LLMModel | None, Job]:
    job = Job.objects.create(kind=Job.Kind.PULL, source=name)
    model = pull_model(job.id, backoff=0.01, **options)
    job.refresh_from_db()
    return model, job


def names(model: LLMModel) -> list[str]:
    return [pulled.name for pulled in model.pulled_names.all()]


def leftovers(models_dir) -> list[str]:
    return sorted(p.name for p in models_dir.iterdir() if p.name.startswith("."))


@pytest.mark.django_db
def test_a_pulled_model_is_registered_under_its_name_with_its_layers(models_dir, registry, gguf):
    digest = registry.publish(
        "library", "tiny", "1b", gguf, system="Answer briefly.", template="{{ .Prompt }}",
        params={"stop": ["<|end|>"], "temperature": 0.3, "num_ctx": 99999, "seed": 7},
    )  # fmt: skip

    model, job = pull("tiny:1b")

    assert model is not None, job.message
    assert (names(model), model.name, model.source) == (["tiny:1b"], "tiny-1b", "pull")
    assert model.sha256 == hashlib.sha256(gguf).hexdigest()
    assert open(model.file_path, "rb").read() == gguf
    assert model.system_prompt == "Answer briefly."
    assert model.default_params == {"stop": ["<|end|>"], "temperature": 0.3}  # no num_ctx, seed
    assert resolve("tiny:1b") == model and resolve("TINY:1b") == model
    assert job.state == Job.State.DONE and job.model == model and job.progress == 1.0
    assert job.detail["phase"] == "done"
    rows = {row["digest"]: row for row in job.detail["layers"]}
    assert rows[digest]["completed"] == rows[digest]["total"] == len(gguf)
    manifest_headers = registry.headers[0]
    assert manifest_headers["accept"] == "application/vnd.docker.distribution.manifest.v2+json"
    fetched = {path for path, _ in registry.requests}
    assert not any(path.endswith(digest_of(b"{{ .Prompt }}")) for path in fetched)  # Go template
    assert leftovers(models_dir) == []


@pytest.mark.django_db
def test_a_name_without_a_tag_is_latest_and_answers_to_both(models_dir, registry, gguf):
    registry.publish("library", "tiny", "latest", gguf)

    model, job = pull("tiny")

    assert names(model) == ["tiny:latest"], job.message
    assert resolve("tiny") == model and resolve("tiny:latest") == model
    assert resolve("library/tiny") == model


@pytest.mark.django_db
def test_a_file_that_does_not_match_its_digest_is_removed_and_not_registered(
    models_dir, registry, gguf
):
    registry.publish("library", "tiny", "1b", gguf, digest=digest_of(b"something else"))

    model, job = pull("tiny:1b")

    assert model is None
    assert job.state == Job.State.FAILED and job.detail["error_status"] == 502
    assert "is not the layer's" in job.message and "removed" in job.message
    assert not LLMModel.objects.exists() and not PulledName.objects.exists()
    assert leftovers(models_dir) == [] and list(models_dir.iterdir()) == []


@pytest.mark.django_db
def test_a_dropped_connection_is_resumed_with_a_range_request(models_dir, registry, gguf):
    registry.publish("library", "tiny", "1b", gguf)
    registry.drop_after, registry.drops_left = 1000, 1

    model, job = pull("tiny:1b")

    assert model is not None, job.message
    assert [asked for _, asked in registry.blob_requests()] == [None, "bytes=1000-"]
    assert model.sha256 == hashlib.sha256(gguf).hexdigest()


@pytest.mark.django_db
def test_a_pull_that_gave_up_leaves_its_partial_file_for_the_next_pull(models_dir, registry, gguf):
    registry.publish("library", "tiny", "1b", gguf)
    registry.drop_after, registry.drops_left = 1000, 2

    model, job = pull("tiny:1b", attempts=2)

    assert model is None and job.state == Job.State.FAILED
    assert "gave up after 2 attempts" in job.message
    assert leftovers(models_dir) == [f".pull-{hashlib.sha256(gguf).hexdigest()}.part"]

    model, job = pull("tiny:1b")

    assert model is not None, job.message
    assert [asked for _, asked in registry.blob_requests()][-1] == "bytes=2000-"
    assert model.sha256 == hashlib.sha256(gguf).hexdigest()
    assert leftovers(models_dir) == []


@pytest.mark.django_db
def test_a_name_the_registry_does_not_have_fails_with_404(models_dir, registry):
    model, job = pull("missing:7b")

    assert model is None and job.state == Job.State.FAILED
    assert job.detail["error_status"] == 404
    assert "pull model manifest: file does not exist" in job.message


@pytest.mark.django_db
def test_pulling_a_name_again_downloads_nothing_when_it_is_up_to_date(models_dir, registry, gguf):
    registry.publish("library", "tiny", "1b", gguf)
    first, _ = pull("tiny:1b")
    blobs_before = len(registry.blob_requests())

    again, job = pull("tiny:1b")

    assert again == first and job.state == Job.State.DONE
    assert len(registry.blob_requests()) == blobs_before
    assert LLMModel.objects.count() == 1


@pytest.mark.django_db
def test_a_blob_the_appliance_has_gets_the_new_name_without_a_download(models_dir, registry, gguf):
    registry.publish("library", "tiny", "latest", gguf)
    registry.publish("library", "tiny", "1b", gguf)  # the same file under two tags, as Ollama's
    first, _ = pull("tiny:latest")

    second, job = pull("tiny:1b")

    assert second == first and job.state == Job.State.DONE
    assert names(first) == ["tiny:1b", "tiny:latest"]
    assert resolve("tiny") == resolve("tiny:1b") == first
    assert len(registry.blob_requests()) == 1
    assert LLMModel.objects.count() == 1


@pytest.mark.django_db
def test_a_file_registered_some_other_way_is_not_changed_by_a_pull_of_its_bytes(
    models_dir, registry, gguf
):
    (models_dir / ".upload.part").write_bytes(gguf)
    mine = install_file(models_dir / ".upload.part", "mine.gguf", source="upload",
                        sha256=hashlib.sha256(gguf).hexdigest())  # fmt: skip
    LLMModel.objects.filter(pk=mine.pk).update(system_prompt="My own.")
    registry.publish("library", "tiny", "1b", gguf, system="Theirs.")

    model, job = pull("tiny:1b")

    assert model == mine, job.message
    model.refresh_from_db()
    assert model.system_prompt == "My own." and names(model) == ["tiny:1b"]


@pytest.mark.django_db
def test_a_tag_that_moved_on_takes_its_name_to_the_new_model(
    models_dir, registry, gguf, other_gguf
):
    registry.publish("library", "tiny", "1b", gguf)
    old, _ = pull("tiny:1b")
    registry.publish("library", "tiny", "1b", other_gguf)

    new, job = pull("tiny:1b")

    assert new is not None and new != old, job.message
    assert names(old) == [] and names(new) == ["tiny:1b"]
    assert resolve("tiny:1b") == new
    assert new.name == "tiny-1b-2"


@pytest.mark.django_db
def test_weights_larger_than_the_machine_are_refused_before_downloading(models_dir, registry, gguf):
    registry.publish("library", "huge", "1t", gguf)
    path = "v2/library/huge/manifests/1t"
    manifest = json.loads(registry.files[path])
    manifest["layers"][0]["size"] = 1 << 50  # a petabyte of weights
    registry.files[path] = json.dumps(manifest).encode()

    model, job = pull("huge:1t")

    assert model is None and job.detail["error_status"] == 400
    assert "could never be loaded" in job.message
    assert registry.blob_requests() == []


@pytest.mark.django_db
def test_an_adapter_layer_is_refused(models_dir, registry, gguf):
    registry.publish("library", "tuned", "1b", gguf)
    path = "v2/library/tuned/manifests/1b"
    manifest = json.loads(registry.files[path])
    manifest["layers"].append({"mediaType": "application/vnd.ollama.image.adapter",
                               "digest": digest_of(b"lora"), "size": 4})  # fmt: skip
    registry.files[path] = json.dumps(manifest).encode()

    model, job = pull("tuned:1b")

    assert model is None and "LoRA adapter" in job.message


@pytest.mark.django_db
def test_a_hugging_face_name_pulls_the_gguf_of_its_quant(models_dir, registry, gguf, other_gguf):
    registry.publish_hf("someone/Tiny-GGUF", {
        "tiny.Q4_K_M.gguf": other_gguf, "tiny.Q8_0.gguf": gguf, "mmproj-tiny-Q8_0.gguf": b"x",
    })  # fmt: skip

    model, job = pull("hf.co/someone/Tiny-GGUF:q8_0")

    assert model is not None, job.message
    assert model.sha256 == hashlib.sha256(gguf).hexdigest()
    assert names(model) == ["hf.co/someone/Tiny-GGUF:q8_0"]
    assert resolve("hf.co/someone/tiny-gguf:Q8_0") == model
    assert ("cdn/someone/Tiny-GGUF/tiny.Q8_0.gguf", None) in registry.requests

    default, job = pull("huggingface.co/someone/Tiny-GGUF")

    assert default.sha256 == hashlib.sha256(other_gguf).hexdigest(), job.message


@pytest.mark.django_db
def test_a_hugging_face_file_that_does_not_match_its_sha256_is_refused(models_dir, registry, gguf):
    registry.publish_hf("someone/Tiny-GGUF", {"tiny.Q8_0.gguf": gguf})
    listing = json.loads(registry.files["api/models/someone/Tiny-GGUF"])
    listing["siblings"][1]["lfs"]["sha256"] = "0" * 64
    registry.files["api/models/someone/Tiny-GGUF"] = json.dumps(listing).encode()

    model, job = pull("hf.co/someone/Tiny-GGUF:Q8_0")

    assert model is None and "is not the layer's" in job.message
    assert not LLMModel.objects.exists()


@pytest.mark.django_db
def test_an_unknown_hugging_face_repository_fails_with_404(models_dir, registry):
    model, job = pull("hf.co/nobody/Nothing-GGUF")

    assert model is None and job.detail["error_status"] == 404


@pytest.mark.django_db
def test_a_failed_pull_run_again_resumes_from_its_partial_file(models_dir, registry, gguf):
    registry.publish("library", "tiny", "1b", gguf)
    registry.drop_after, registry.drops_left = 1000, 2
    _, job = pull("tiny:1b", attempts=2)
    assert job.state == Job.State.FAILED

    assert reset_for_retry(job)
    model = pull_model(job.id)

    job.refresh_from_db()
    assert model is not None and job.state == Job.State.DONE, job.message
    assert [asked for _, asked in registry.blob_requests()][-1] == "bytes=2000-"


@pytest.mark.django_db(transaction=True)
def test_two_pulls_of_one_blob_download_it_once(models_dir, registry, gguf):
    registry.publish("library", "tiny", "latest", gguf)
    registry.publish("library", "tiny", "1b", gguf)
    registry.pause_after = 2048  # the first pull stalls mid-blob, holding the partial file
    first = Job.objects.create(kind=Job.Kind.PULL, source="tiny:latest")
    second = Job.objects.create(kind=Job.Kind.PULL, source="tiny:1b")
    results = {}
    threads = [
        threading.Thread(target=lambda j=j: results.setdefault(j.id, pull_model(j.id)))
        for j in (first, second)
    ]
    threads[0].start()
    assert wait_until(lambda: len(registry.blob_requests()) == 1, timeout=30, interval=0.05)
    threads[1].start()
    waiting = lambda: "waiting for another pull" in Job.objects.get(pk=second.pk).message  # noqa: E731
    assert wait_until(waiting, timeout=30, interval=0.05)

    registry.resume.set()
    for thread in threads:
        thread.join(30)

    assert results[first.id] == results[second.id] is not None
    assert names(results[first.id]) == ["tiny:1b", "tiny:latest"]
    assert len(registry.blob_requests()) == 1
    assert leftovers(models_dir) == []


@pytest.fixture
def projector_for(tmp_path):
    """The bytes of a projector for the tiny model file `model_bytes` (written to a file)."""
    from tests.inference.projectors import projector_at

    def make(model_bytes: bytes, name: str = "mmproj.gguf", **options) -> bytes:
        model = tmp_path / "served" / f"for-{name}"
        model.parent.mkdir(parents=True, exist_ok=True)
        model.write_bytes(model_bytes)
        return projector_at(tmp_path / "served" / name, model, **options).read_bytes()

    return make


@pytest.mark.django_db
def test_a_hugging_face_pull_fetches_the_repositorys_mmproj_with_the_model(
    models_dir, registry, gguf, projector_for
):
    f16, q8 = projector_for(gguf, "f16.gguf", seed=1), projector_for(gguf, "q8.gguf", seed=2)
    registry.publish_hf("someone/Tiny-VL-GGUF", {
        "tiny.Q8_0.gguf": gguf, "mmproj-tiny-F16.gguf": f16, "mmproj-tiny-Q8_0.gguf": q8,
    })  # fmt: skip

    model, job = pull("hf.co/someone/Tiny-VL-GGUF:Q8_0")

    assert model is not None, job.message
    # llama-server's -hf choice: the projector whose quant is closest to the model's.
    assert model.projector.sha256 == hashlib.sha256(q8).hexdigest()
    assert model.projector.source == LLMModel.Source.PULL
    assert model.takes_images and model.projector.file_name == "mmproj-tiny-Q8_0.gguf"
    assert resolve("hf.co/someone/Tiny-VL-GGUF:Q8_0") == model
    assert [row["digest"] for row in job.detail["layers"]] == [
        f"sha256:{model.sha256}", f"sha256:{model.projector.sha256}"]  # fmt: skip
    assert leftovers(models_dir) == []

    again, job = pull("hf.co/someone/Tiny-VL-GGUF:Q8_0")  # nothing downloaded twice
    assert again == model and again.projector == model.projector, job.message


@pytest.mark.django_db
def test_a_pulled_projector_made_for_another_model_is_left_out_with_the_reason(
    models_dir, registry, gguf, projector_for
):
    wrong = projector_for(gguf, n_embd=128)
    registry.publish_hf("someone/Tiny-VL-GGUF", {"tiny.Q8_0.gguf": gguf, "mmproj.gguf": wrong})

    model, job = pull("hf.co/someone/Tiny-VL-GGUF:Q8_0")

    assert model is not None and model.projector is None, job.message
    assert "its vision projector mmproj.gguf is left out" in job.message
    assert "projection width" in job.message
    assert sorted(p.name for p in models_dir.iterdir()) == ["tiny.Q8_0.gguf"]


@pytest.mark.django_db
def test_an_ollama_manifests_projector_layer_comes_with_the_model(
    models_dir, registry, gguf, projector_for
):
    clip = projector_for(gguf)
    registry.publish("library", "tinyvl", "latest", gguf, projector=clip)

    model, job = pull("tinyvl")

    assert model is not None and model.projector is not None, job.message
    assert model.projector.sha256 == hashlib.sha256(clip).hexdigest()
    assert model.projector.file_name == "mmproj-tinyvl-latest.gguf"
    assert resolve("tinyvl").takes_images
