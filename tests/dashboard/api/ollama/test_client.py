"""The official ollama package against the live appliance: list, ps, show, chat and generate,
streamed and not, keep_alive, and the call sequence of Home Assistant's Ollama integration."""

import time
from datetime import UTC, datetime, timedelta

import ollama
import pytest

from tests.dashboard.api.server import STARTER

pytestmark = pytest.mark.model

TAG = f"{STARTER}:latest"
DURATIONS = (
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
)


@pytest.fixture
def client(appliance) -> ollama.Client:
    return ollama.Client(host=appliance.url, headers=appliance.headers("chat-app"), timeout=120)


def loaded(client: ollama.Client) -> list[str]:
    return [m.model for m in client.ps().models]


def wait_until(predicate, seconds: float = 30.0) -> bool:
    """Poll a condition the server reaches on its own (not a timing assertion)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def test_it_lists_the_models_in_ollamas_shape(client):
    models = client.list().models
    assert [m.model for m in models] == [TAG]
    model = models[0]
    assert model.size > 0
    assert len(model.digest) == 64  # the sha256 the bootstrap computed
    assert model.details.format == "gguf"
    assert model.details.family == "llama"
    assert model.details.parameter_size.endswith("M")
    assert model.details.quantization_level
    assert model.modified_at is not None


def test_show_describes_the_model(client):
    shown = client.show(TAG)
    assert shown.details.format == "gguf"
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] > 0
    assert "completion" in shown.capabilities
    assert "im_start" in shown.template


def test_version_answers(client, appliance):
    import httpx

    body = httpx.get(f"{appliance.url}/api/version", headers=appliance.headers("chat-app")).json()
    assert body["version"]


def test_it_chats_without_streaming_and_reports_ollamas_durations(client):
    answer = client.chat(
        model=TAG,
        messages=[{"role": "user", "content": "Hi!"}],
        stream=False,
        options={"num_predict": 5, "temperature": 0},
    )
    assert answer.done and answer.done_reason in ("stop", "length")
    assert answer.message.role == "assistant" and answer.message.content
    assert 0 < answer.eval_count <= 5
    assert answer.prompt_eval_count >= 1
    assert answer.total_duration > 0 and answer.prompt_eval_duration > 0
    # Measured separately, never derived from one another: each part fits inside the total.
    assert answer.load_duration + answer.prompt_eval_duration <= answer.total_duration
    assert answer.eval_duration <= answer.total_duration


def test_it_streams_a_chat_as_ndjson_ending_with_done(client):
    parts = list(
        client.chat(
            model=TAG,
            messages=[{"role": "user", "content": "Hello"}],
            stream=True,
            options={"num_predict": 6, "temperature": 0},
        )
    )
    assert all(not p.done for p in parts[:-1])
    last = parts[-1]
    assert last.done and last.done_reason in ("stop", "length")
    for key in DURATIONS:
        assert getattr(last, key) is not None
    text = "".join(p.message.content for p in parts)
    assert text
    assert len([p for p in parts[:-1] if p.message.content]) <= last.eval_count


def test_it_generates_from_a_prompt_with_and_without_the_template(client):
    answer = client.generate(
        model=TAG,
        prompt="Why is the sky blue?",
        system="Be brief.",
        stream=False,
        options={"num_predict": 4, "temperature": 0},
    )
    assert answer.done and answer.response
    raw = list(
        client.generate(
            model=TAG,
            prompt="1, 2, 3, 4,",
            raw=True,
            stream=True,
            options={"num_predict": 4, "temperature": 0, "stop": ["9"]},
        )
    )
    assert raw[-1].done and raw[-1].eval_count <= 4
    assert "".join(p.response for p in raw)


def test_home_assistants_call_sequence_works(client):
    # What the Home Assistant integration does: list at setup, ps, then a streamed chat with
    # its keep_alive ("-1s": keep loaded) and num_ctx option.
    assert TAG in [m.model for m in client.list().models]
    client.ps()
    parts = list(
        client.chat(
            model=TAG,
            messages=[
                {"role": "system", "content": "You are a voice assistant for a house."},
                {"role": "user", "content": "Turn on the lights."},
            ],
            stream=True,
            keep_alive="-1s",
            options={"num_ctx": 8192, "num_predict": 6},
        )
    )
    assert parts[-1].done
    running = {m.model: m for m in client.ps().models}
    assert TAG in running
    model = running[TAG]
    assert model.expires_at > datetime.now(UTC) + timedelta(days=365)  # kept loaded
    # The model was set up with 2048 per sequence; num_ctx 8192 reloaded it with that.
    assert model.size > 0 and model.context_length == 8192
    assert model.details.format == "gguf"


def test_keep_alive_zero_unloads_after_the_answer_and_an_empty_chat_loads(client, appliance):
    answer = client.chat(
        model=TAG,
        messages=[{"role": "user", "content": "Hi"}],
        stream=False,
        keep_alive=0,
        options={"num_predict": 2},
    )
    assert answer.done
    assert wait_until(lambda: TAG not in loaded(client))
    # Loading and unloading with an empty prompt need a key with the manage scope.
    manager = ollama.Client(
        host=appliance.url, headers=appliance.headers("manage-app"), timeout=120
    )
    loading = manager.chat(model=TAG, messages=[], keep_alive=-1)
    assert loading.done and loading.done_reason == "load"
    assert TAG in loaded(client)
    unloading = manager.generate(model=TAG, prompt="", keep_alive=0)
    assert unloading.done_reason == "unload"
    assert TAG not in loaded(client)
    assert manager.generate(model=TAG, prompt="", keep_alive="-1").done_reason == "load"


def test_an_unknown_model_is_a_404(client):
    with pytest.raises(ollama.ResponseError) as error:
        client.chat(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert error.value.status_code == 404
    assert "not found" in error.value.error
