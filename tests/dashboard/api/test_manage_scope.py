"""The live appliance's Ollama API and the manage scope: loading, unloading and pinning a model
with an empty prompt need a manage (or admin) key, a chat key gets a 403 in Ollama's shape, and
a chat key's keep_alive -1 (Home Assistant's, on every request) does not pin the model beyond
its own keep-alive."""

from datetime import UTC, datetime, timedelta

import ollama
import pytest

from tests.dashboard.api.server import STARTER, read_json

pytestmark = pytest.mark.model

TAG = f"{STARTER}:latest"
SET_KEEP_ALIVE = (
    "from inference.models import LLMModel\n"
    f"LLMModel.objects.filter(name={STARTER!r}).update(keep_alive=%r)\n"
)

# (endpoint, an empty-prompt body): load, load and pin, unload
EMPTY_PROMPTS = [
    ("/api/chat", {"model": STARTER, "messages": []}),
    ("/api/chat", {"model": STARTER, "messages": [], "keep_alive": -1}),
    ("/api/generate", {"model": STARTER, "prompt": "", "keep_alive": "-1"}),
    ("/api/generate", {"model": STARTER, "prompt": "", "keep_alive": 0}),
]
IDS = [f"{path} keep_alive={body.get('keep_alive')}" for path, body in EMPTY_PROMPTS]


def expires_at(http, headers) -> datetime | None:
    """When /api/ps says the starter model unloads; None when it is not loaded."""
    for row in read_json(http.get("/api/ps", headers=headers))["models"]:
        if row["model"] == TAG:
            return datetime.fromisoformat(row["expires_at"].replace("Z", "+00:00"))
    return None


def answer(http, headers, **fields) -> dict:
    body = {"model": STARTER, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}}
    response = http.post("/api/generate", json={**body, **fields}, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture
def loaded(http, admin_headers):
    """The starter model loaded and kept loaded, as the other API tests expect it."""
    response = http.post("/api/generate", json={"model": STARTER, "keep_alive": -1},
                         headers=admin_headers)  # fmt: skip
    assert response.status_code == 200, response.text
    yield
    http.post("/api/generate", json={"model": STARTER, "keep_alive": -1}, headers=admin_headers)


@pytest.fixture
def five_minute_model(appliance, loaded):
    """The starter model's own keep-alive set to five minutes on its page, for one test."""
    appliance.shell(SET_KEEP_ALIVE % "5m")
    yield
    appliance.shell(SET_KEEP_ALIVE % "-1")


@pytest.mark.parametrize(("path", "body"), EMPTY_PROMPTS, ids=IDS)
def test_a_chat_key_may_not_load_or_unload_with_an_empty_prompt(
    http, chat_headers, loaded, path, body
):
    response = http.post(path, json=body, headers=chat_headers)
    assert response.status_code == 403, response.text
    error = read_json(response)["error"]  # Ollama's shape: {"error": "message"}
    assert isinstance(error, str) and "needs an API key with the manage scope" in error
    pinned = datetime.now(UTC) + timedelta(days=365)
    assert expires_at(http, chat_headers) > pinned  # still loaded, still as it was


def test_the_ollama_client_gets_the_403_as_its_response_error(appliance, loaded):
    client = ollama.Client(host=appliance.url, headers=appliance.headers("chat-app"), timeout=60)
    with pytest.raises(ollama.ResponseError) as refused:
        client.generate(model=TAG, prompt="", keep_alive=0)
    assert refused.value.status_code == 403
    assert "manage scope" in refused.value.error


def test_a_manage_key_unloads_loads_and_pins_with_an_empty_prompt(http, manage_headers, loaded):
    unload = http.post("/api/generate", json={"model": STARTER, "prompt": "", "keep_alive": 0},
                       headers=manage_headers)  # fmt: skip
    assert read_json(unload)["done_reason"] == "unload"
    assert expires_at(http, manage_headers) is None
    load = http.post("/api/chat", json={"model": STARTER, "messages": [], "keep_alive": -1,
                                        "stream": False}, headers=manage_headers)  # fmt: skip
    assert read_json(load)["done_reason"] == "load"
    assert expires_at(http, manage_headers) > datetime.now(UTC) + timedelta(days=365)


def test_an_admin_key_may_load_with_an_empty_prompt_too(http, admin_headers, loaded):
    response = http.post("/api/generate", json={"model": STARTER, "keep_alive": "-1"},
                         headers=admin_headers)  # fmt: skip
    assert response.status_code == 200 and read_json(response)["done_reason"] == "load"


def test_a_chat_keys_keep_alive_minus_one_does_not_pin_beyond_the_models_own(
    appliance, http, chat_headers, manage_headers, five_minute_model
):
    # What Home Assistant sends with every chat: keep_alive "-1s" ("keep loaded").
    client = ollama.Client(host=appliance.url, headers=appliance.headers("chat-app"), timeout=120)
    reply = client.chat(model=TAG, messages=[{"role": "user", "content": "Lights on."}],
                        keep_alive="-1s", stream=False, options={"num_predict": 2})  # fmt: skip
    assert reply.done  # answered, not refused, and kept for the model's own five minutes:
    now, expiry = datetime.now(UTC), expires_at(http, chat_headers)
    assert now + timedelta(minutes=4) < expiry <= now + timedelta(minutes=5, seconds=5)

    answer(http, chat_headers, keep_alive="10s")  # shorter than the model's own is kept
    assert expires_at(http, chat_headers) <= datetime.now(UTC) + timedelta(seconds=11)

    answer(http, manage_headers, keep_alive=-1)  # a manage key may pin it
    assert expires_at(http, chat_headers) > datetime.now(UTC) + timedelta(days=365)
