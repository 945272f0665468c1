"""The official ollama client making models on the live appliance: create_blob + create(files),
create(from) with a system prompt and parameters (a derived model sharing its base's engine),
copy, show, delete, push; admin keys only."""

import hashlib
from pathlib import Path

import httpx
import ollama
import pytest

from tests.dashboard.api.server import STARTER
from tests.inference.engine.draft_gguf import write_draft

pytestmark = pytest.mark.model

TAG = f"{STARTER}:latest"
# Longer than the starter template's own default system prompt, so it shows in the token count.
BUTLER = ("You are Jeeves, the butler of this house. You answer briefly and politely, you call "
          "everyone sir or madam, you know where the umbrellas, the spare keys and the good tea "
          "are kept, and you never reveal what the cook puts in the Sunday pudding.")  # fmt: skip
HI = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def admin(appliance) -> ollama.Client:
    return ollama.Client(host=appliance.url, headers=appliance.headers("admin-app"), timeout=120)


@pytest.fixture(scope="module")
def chatter(appliance) -> ollama.Client:
    return ollama.Client(host=appliance.url, headers=appliance.headers("chat-app"), timeout=120)


@pytest.fixture(scope="module", autouse=True)
def leaves_only_the_starter(appliance, admin):
    """Whatever these tests made goes at the end: the other modules see one model."""
    yield
    headers = appliance.headers("admin-app")
    for _ in range(3):  # derived models first, then what they were made of
        for model in admin.list().models:
            if model.model != TAG:
                httpx.request("DELETE", f"{appliance.url}/api/delete", headers=headers,
                              json={"model": model.model})  # fmt: skip
    assert [m.model for m in admin.list().models] == [TAG]


@pytest.fixture(scope="module")
def variant(tmp_path_factory, starter_path) -> Path:
    """The starter model with another general.name: other bytes, the same loadable weights."""
    data = bytearray(Path(starter_path).read_bytes())
    at = data.find(b"Smollm2 135M", 0, 1 << 20)
    assert at > 0
    data[at : at + 7] = b"Tinyhom"
    path = tmp_path_factory.mktemp("variant") / "tinyhome.gguf"
    path.write_bytes(data)
    return path


def chat(client: ollama.Client, model: str) -> ollama.ChatResponse:
    return client.chat(model=model, messages=HI, stream=False,
                       options={"num_predict": 4, "temperature": 0})  # fmt: skip


def loaded(client: ollama.Client) -> list[str]:
    return [m.model for m in client.ps().models]


def status_of(call) -> int:
    with pytest.raises(ollama.ResponseError) as refused:
        call()
    return refused.value.status_code


def test_a_chat_key_may_not_make_models(chatter, variant):
    assert status_of(lambda: chatter.create(model="nope", from_=TAG)) == 403
    assert status_of(lambda: chatter.copy(TAG, "nope")) == 403
    assert status_of(lambda: chatter.create_blob(variant)) in (401, 403)


def test_an_uploaded_blob_becomes_a_model_that_chats(appliance, admin, variant):
    digest = admin.create_blob(variant)
    assert digest == f"sha256:{hashlib.sha256(variant.read_bytes()).hexdigest()}"
    headers = appliance.headers("admin-app")
    assert httpx.head(f"{appliance.url}/api/blobs/{digest}", headers=headers).status_code == 200
    lines = list(admin.create(model="tinyhome", files={"tinyhome.gguf": digest}, stream=True))
    assert lines[0].status == "gathering model components"
    assert lines[-1].status == "success"
    assert "tinyhome:latest" in [m.model for m in admin.list().models]
    answer = chat(admin, "tinyhome")
    assert answer.done and answer.eval_count >= 1
    admin.delete("tinyhome")
    assert "tinyhome:latest" not in [m.model for m in admin.list().models]


def test_a_model_made_of_a_file_can_name_its_draft_model(appliance, admin, variant,
                                                        starter_path, tmp_path):  # fmt: skip
    small = write_draft(tmp_path / "tinydraft.gguf", starter_path)
    admin.create(model="tinydraft", files={"tinydraft.gguf": admin.create_blob(small)})
    digest = admin.create_blob(variant)
    url, headers = f"{appliance.url}/api/create", appliance.headers("admin-app")

    def create(**body):
        return httpx.post(url, headers=headers, json={"stream": False, **body}, timeout=120)

    derived = create(model="butler", **{"from": TAG}, draft="tinydraft")
    assert derived.status_code == 400 and "load setting" in derived.json()["error"]
    unknown = create(model="tinyhome", files={"tinyhome.gguf": digest}, draft="nosuch")
    assert unknown.status_code == 404
    backwards = create(model="tinyhome", files={"tinyhome.gguf": digest}, draft=TAG)
    assert backwards.status_code == 400 and "not smaller" in backwards.json()["error"]
    made = httpx.post(url, headers=headers, timeout=120, json={
        "model": "tinyhome", "files": {"tinyhome.gguf": digest}, "draft": "tinydraft"})
    assert made.status_code == 200 and "using tinydraft as the draft model" in made.text
    assert chat(admin, "tinyhome").done
    admin.delete("tinyhome")
    admin.delete("tinydraft")


def test_a_digest_mismatch_is_refused_and_leaves_no_blob(appliance):
    headers = appliance.headers("admin-app")
    wrong = "sha256:" + "0" * 64
    response = httpx.post(f"{appliance.url}/api/blobs/{wrong}", headers=headers,
                          content=b"GGUF and some bytes")  # fmt: skip
    assert response.status_code == 400
    assert "digest" in response.json()["error"]
    assert httpx.head(f"{appliance.url}/api/blobs/{wrong}", headers=headers).status_code == 404


def test_create_without_an_uploaded_blob_is_refused(admin):
    missing = "sha256:" + "1" * 64
    assert status_of(lambda: admin.create(model="ghost", files={"g.gguf": missing})) == 400


def test_a_derived_model_has_its_own_system_prompt_and_shares_the_bases_engine(appliance, admin):
    parameters = {"temperature": 0, "num_predict": 3, "stop": ["\n\n"]}
    done = admin.create(model="butler", from_=TAG, system=BUTLER, parameters=parameters)
    assert done.status == "success"
    shown = admin.show("butler")
    raw = httpx.post(f"{appliance.url}/api/show", json={"model": "butler"},
                     headers=appliance.headers("admin-app")).json()  # fmt: skip
    assert raw["system"] == BUTLER  # the client's ShowResponse has no `system`; Ollama sends it
    assert f'SYSTEM """{BUTLER}"""' in shown.modelfile
    assert "num_predict" in shown.parameters and "temperature" in shown.parameters
    assert shown.details.parent_model == TAG
    assert shown.modelfile.startswith(f"FROM {TAG}")
    assert "completion" in shown.capabilities and shown.modelinfo["general.architecture"]
    base = chat(admin, TAG)
    butler = admin.chat(model="butler", messages=HI, stream=False)  # its own num_predict
    # The system prompt reached the prompt: more prompt tokens than the base's own for "Hello".
    assert butler.prompt_eval_count > base.prompt_eval_count + 20
    assert butler.eval_count <= 3
    assert loaded(admin) == [TAG]  # one engine for both


def test_two_derived_models_of_one_base_share_one_runner(admin):
    admin.create(model="maid", from_=TAG, system="You are the maid.",
                 messages=[{"role": "user", "content": "Who are you?"},
                           {"role": "assistant", "content": "The maid."}])  # fmt: skip
    admin.create(model="cook", from_="maid", parameters={"top_k": 5})
    assert chat(admin, "maid").done and chat(admin, "cook").done
    assert loaded(admin) == [TAG]
    assert admin.show("cook").details.parent_model == TAG  # made of the maid's base
    assert "MESSAGE user" in admin.show("maid").modelfile


def test_a_copy_answers_and_its_deletion_keeps_the_original(admin):
    assert admin.copy(TAG, "household").status == "success"
    assert chat(admin, "household").done
    assert "household:latest" in [m.model for m in admin.list().models]
    admin.delete("household")
    assert chat(admin, TAG).done


def test_deleting_a_derived_model_keeps_the_base_and_a_used_base_is_not_deleted(appliance, admin):
    admin.create(model="footman", from_=TAG, system="You are the footman.")
    headers = appliance.headers("admin-app")
    response = httpx.request("DELETE", f"{appliance.url}/api/delete", headers=headers,
                             json={"model": STARTER})  # fmt: skip
    assert response.status_code == 409, response.text
    assert "footman" in response.json()["error"]
    admin.delete("footman")
    assert "footman:latest" not in [m.model for m in admin.list().models]
    assert chat(admin, TAG).done  # the base's weights are still there and load


def test_bad_parameters_and_go_templates_are_refused(admin):
    too_hot = lambda: admin.create(model="hot", from_=TAG, parameters={"temperature": 50})  # noqa: E731
    assert status_of(too_hot) == 400
    go = lambda: admin.create(model="go", from_=TAG, template="{{ .System }} {{ .Prompt }}")  # noqa: E731
    assert status_of(go) == 400
    assert status_of(lambda: admin.create(model="x", from_="no-such-model")) == 404


def test_push_is_refused_in_ollamas_error_shape(appliance, admin):
    with pytest.raises(ollama.ResponseError) as refused:
        admin.push(TAG)
    assert refused.value.status_code == 501
    assert "not supported" in refused.value.error


def test_files_with_a_projector_make_a_vision_model_that_show_lists(admin, variant, tmp_path):
    from tests.inference.projector_gguf import write_projector

    projector = write_projector(tmp_path / "mmproj-tinyhome.gguf", variant)
    files = {"tinyhome.gguf": admin.create_blob(variant),
             "mmproj-tinyhome.gguf": admin.create_blob(projector)}  # fmt: skip
    lines = [line.status for line in admin.create(model="tinyeyes", files=files, stream=True)]
    assert "using mmproj-tinyhome.gguf as the vision projector" in lines
    assert lines[-1] == "success"
    shown = admin.show("tinyeyes")
    assert "vision" in shown.capabilities
    assert "clip" in shown.details.families
    assert "vision" not in (admin.show(TAG).capabilities or [])
    assert chat(admin, "tinyeyes").done  # it answers text with its projector loaded
    admin.delete("tinyeyes")
