"""Derived models and names (inference.catalog.creating): Ollama's parameters mapped and
bounds-checked, a derived model loading as its base (one engine) with its own prompt and
sampling, and blobs (inference.catalog.blobs) taken only when their digest and header are
right."""

import hashlib
import io

import pytest

from inference.catalog import blobs, creating
from inference.catalog.importing import register_file
from inference.catalog.lookup import resolve
from inference.catalog.specs import request_for, spec_for
from inference.models import LLMModel
from inference.text.prompting import prompt_for, with_model_messages
from tests.inference.ggufs import tiny_gguf

# --- the parameters mapping (no database) -------------------------------------------------


def test_ollama_names_map_to_the_engines_fields():
    kept, ignored = creating.sampling_parameters({
        "temperature": 0.3, "top_k": 20, "top_p": 0.9, "min_p": 0.1, "repeat_penalty": 1.1,
        "repeat_last_n": 32, "presence_penalty": 0.5, "frequency_penalty": -0.5, "seed": 7,
        "num_predict": 64, "stop": "<end>", "num_ctx": 4096,
    })  # fmt: skip
    assert kept == {"temperature": 0.3, "top_k": 20, "top_p": 0.9, "min_p": 0.1,
                    "repeat_penalty": 1.1, "repeat_last_n": 32, "presence_penalty": 0.5,
                    "frequency_penalty": -0.5, "seed": 7, "max_tokens": 64,
                    "stop": ["<end>"]}  # fmt: skip
    assert ignored == ["num_ctx"]


def test_a_list_of_stops_is_kept_as_a_list():
    kept, _ = creating.sampling_parameters({"stop": ["a", "b"]})
    assert kept == {"stop": ["a", "b"]}


@pytest.mark.parametrize(
    ("name", "value"),
    [("temperature", 9.0), ("temperature", -1), ("top_p", 1.5), ("top_k", -1),
     ("num_predict", 0), ("seed", -3), ("repeat_last_n", -2), ("presence_penalty", 3.0),
     ("stop", [""]), ("stop", ["x"] * 17), ("top_k", "many"), ("temperature", True)],
)  # fmt: skip
def test_a_value_out_of_bounds_is_refused_naming_the_parameter(name, value):
    with pytest.raises(creating.CreateRefused) as refused:
        creating.sampling_parameters({name: value})
    assert refused.value.param == f"parameters.{name}"
    assert name in str(refused.value)


def test_an_unknown_parameter_is_refused():
    with pytest.raises(creating.CreateRefused, match="unknown parameter 'warmth'"):
        creating.sampling_parameters({"warmth": 1})


def test_seed_messages_need_a_role_and_text():
    assert creating.seed_messages([{"role": "user", "content": "hi", "images": None}]) == [
        {"role": "user", "content": "hi"}
    ]
    with pytest.raises(creating.CreateRefused):
        creating.seed_messages([{"role": "tool", "content": "x"}])


# --- derived models ----------------------------------------------------------------------


@pytest.fixture
def base(settings, tmp_path, db) -> LLMModel:
    settings.MODELS_DIR = tmp_path
    path = tiny_gguf(tmp_path / "base.gguf")
    model = register_file(path, source=LLMModel.Source.SCAN, name="base-tiny")
    model.default_params = {"temperature": 0.5, "top_k": 10}
    model.system_prompt = "You are the base."
    model.save()
    return model


def test_a_derived_model_loads_as_its_base_with_its_own_defaults(base):
    derived = creating.derive(base, "butler", system="You are the butler.",
                              parameters={"temperature": 0.1})  # fmt: skip
    assert derived.base == base and derived.file_path == ""
    assert resolve("butler:latest") == derived
    assert spec_for(derived) == spec_for(base)  # one engine: same name, same file
    prompt = prompt_for(derived, [{"role": "user", "content": "hi"}])
    request = request_for(derived, prompt, {})
    assert request.model == "base-tiny"
    assert request.params.temperature == 0.1 and request.params.top_k == 10
    assert "You are the butler." in prompt.text
    assert "You are the base." not in prompt.text


def test_two_derived_models_share_one_base_and_a_derived_of_a_derived_too(base):
    one = creating.derive(base, "one", parameters={"seed": 1})
    two = creating.derive(one, "two", system="Two.")
    assert two.base == base
    assert two.default_params == {"seed": 1}
    assert spec_for(one).name == spec_for(two).name == "base-tiny"


def test_seed_messages_come_after_the_system_prompt_and_before_the_conversation(base):
    derived = creating.derive(base, "seeded", messages=[
        {"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "Jeeves."},
    ])  # fmt: skip
    got = with_model_messages(derived, [{"role": "user", "content": "hi"}])
    assert [m["content"] for m in got] == ["You are the base.", "Who are you?", "Jeeves.", "hi"]


def test_a_taken_name_and_a_broken_template_are_refused(base):
    creating.derive(base, "taken")
    with pytest.raises(creating.CreateRefused) as refused:
        creating.derive(base, "taken")
    assert refused.value.status == 409
    with pytest.raises(creating.CreateRefused, match="Jinja"):
        creating.derive(base, "go-template", template="{{ .System }} {{ .Prompt }}")


def test_a_copy_is_a_name_that_keeps_the_first(base):
    creating.add_name(base, "house")
    assert resolve("house") == base
    assert sorted(n.name for n in base.pulled_names.all()) == ["base-tiny:latest", "house:latest"]
    with pytest.raises(creating.CreateRefused):
        creating.add_name(creating.derive(base, "other"), "house")


def test_a_derived_model_is_not_a_copy_of_its_base(base):
    from inference.catalog.importing import copies

    creating.derive(base, "butler")
    assert copies(list(LLMModel.objects.all())) == {}


# --- blobs -------------------------------------------------------------------------------


def _upload(data: bytes, digest: str | None = None):
    digest = digest or f"sha256:{hashlib.sha256(data).hexdigest()}"
    return digest, blobs.receive(digest, io.BytesIO(data).read, len(data))


def test_a_blob_with_its_digest_and_a_gguf_header_is_kept(base, tmp_path):
    data = tiny_gguf(tmp_path / "src" / "other.gguf").read_bytes()
    digest, path = _upload(data)
    assert path.read_bytes() == data and blobs.present(digest)
    assert not list(path.parent.glob(".*.part"))
    # A retry of the same digest starts again and ends the same.
    assert _upload(data)[1] == path


def test_a_wrong_digest_or_no_gguf_leaves_nothing(base, tmp_path):
    data = tiny_gguf(tmp_path / "src" / "other.gguf").read_bytes()
    wrong = "sha256:" + "0" * 64
    with pytest.raises(blobs.BlobRefused, match="discarded"):
        _upload(data, wrong)
    with pytest.raises(blobs.BlobRefused, match="not a GGUF"):
        _upload(b"not a model at all")
    assert not blobs.present(wrong)
    assert not list(blobs.blobs_dir().iterdir())


def test_a_registered_models_bytes_count_as_present(base):
    assert blobs.present(f"sha256:{base.sha256}")
    with pytest.raises(blobs.BlobRefused):
        blobs.digest_hex("md5:abc")


def test_weights_files_stay_one_entry_each_while_derived_models_have_none(base):
    from django.db import IntegrityError, transaction

    creating.derive(base, "a")
    creating.derive(base, "b")  # both without a file: the constraint is for weights only
    with pytest.raises(IntegrityError), transaction.atomic():
        LLMModel.objects.create(name="again", file_path=base.file_path)
