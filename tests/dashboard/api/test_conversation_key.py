"""Open WebUI's X-OpenWebUI-Chat-Id names the conversation for the prefix cache, within the
key's own partition; and unknown paths under /v1/ and /api/ answer JSON 404s in the dialect of
the clients that call them, through the real `openai` and `ollama` clients."""

import httpx
import ollama
import openai
import pytest

from tests.dashboard.api.server import STARTER

CHAT_ID = "X-OpenWebUI-Chat-Id"


def openai_client(appliance, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{appliance.url}/v1", api_key=appliance.keys[key],
                         timeout=120, max_retries=0)  # fmt: skip


def turn(client: openai.OpenAI, system: str, chat_id: str | None) -> dict:
    """One short answer; returns its timings: cache_n, the prompt tokens that came from the
    prefix cache, of them cache_n_resident from a resident sequence slot (warm memory's RAM
    and disk tiers apart)."""
    answer = client.chat.completions.create(
        model=STARTER, max_tokens=2, temperature=0,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "Hi"}],
        extra_headers={CHAT_ID: chat_id} if chat_id else None,
    )  # fmt: skip
    timings = answer.model_extra["timings"]
    assert timings["cache_n"] == answer.usage.prompt_tokens_details.cached_tokens
    return timings


LONG = "You answer questions about the history of the region's railways. " * 12
OTHER = "You are a friendly cook who suggests quick dinners. " * 12


@pytest.mark.model
def test_each_open_webui_chat_keeps_its_own_cached_prefix(appliance):
    """Chat A, then a new chat B, then A again: B takes a slot of its own, so A's prefix is
    still there. Without the header both are one conversation of the key, and B, sharing the
    template's first tokens with it, takes A's slot over (warm memory may then bring A's prefix
    back from RAM, but not from its slot)."""
    appliance.create_keys(["owui-with-ids", "owui-without-ids"])
    with_ids = openai_client(appliance, "owui-with-ids")
    without = openai_client(appliance, "owui-without-ids")

    turn(with_ids, LONG, "chat-a")
    turn(with_ids, OTHER, "chat-b")
    kept = turn(with_ids, LONG, "chat-a")["cache_n_resident"]

    turn(without, LONG, None)
    turn(without, OTHER, None)
    lost = turn(without, LONG, None)["cache_n_resident"]

    assert kept > 100  # A's system prompt was still in its slot
    assert lost < kept / 4  # the contrast: one conversation per key loses its slot


@pytest.mark.model
def test_a_chat_id_never_reaches_another_keys_cache(appliance):
    appliance.create_keys(["owui-first", "owui-second"])
    first = openai_client(appliance, "owui-first")
    second = openai_client(appliance, "owui-second")
    turn(first, LONG, "shared-chat")
    # The same chat id and the same prompt from another key: nothing of the first key's KV.
    assert turn(second, LONG, "shared-chat")["cache_n"] == 0  # from no slot and no tier


@pytest.mark.model
@pytest.mark.parametrize("chat_id", ["x" * 500, "a b c", "../../etc", "<script>"])
def test_a_chat_id_that_is_not_a_plain_id_is_ignored(appliance, chat_headers, http, chat_id):
    response = http.post(
        "/v1/chat/completions", headers={**chat_headers, CHAT_ID: chat_id},
        json={"model": STARTER, "max_tokens": 1,
              "messages": [{"role": "user", "content": "Hi"}]},
    )  # fmt: skip
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path", ["/v1/no-such-thing", "/v1/chat/no/such/path", "/v1/"])
def test_an_unknown_openai_path_is_a_json_404_the_openai_client_reads(appliance, path):
    client = openai_client(appliance, "chat-app")
    with pytest.raises(openai.NotFoundError) as refused:
        client.post(path.removeprefix("/v1"), cast_to=httpx.Response, body={})
    error = refused.value.body
    assert refused.value.status_code == 404
    assert error["message"] == f"there is no endpoint {path}"
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_an_unknown_ollama_path_is_a_json_404_in_ollamas_shape(http, chat_headers, method):
    response = http.request(method, "/api/no-such-thing", headers=chat_headers)
    assert response.status_code == 404
    assert response.headers["Content-Type"] == "application/json"
    assert response.json() == {"error": "there is no endpoint /api/no-such-thing"}


def test_the_ollama_client_reads_an_unknown_paths_404(appliance):
    client = ollama.Client(host=appliance.url, headers=appliance.headers("chat-app"))
    with pytest.raises(ollama.ResponseError) as refused:
        client._request_raw("POST", "/api/no-such-thing", json={})
    assert refused.value.status_code == 404
    assert refused.value.error == "there is no endpoint /api/no-such-thing"
