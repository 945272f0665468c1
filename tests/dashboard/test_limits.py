"""What one person or one app may hold at once: chat sockets per user, answers per API key."""

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from dashboard.limits import api_streams
from dashboard.models import ApiKey
from tests.dashboard.web.sockets import open_socket

sockets_and_streams = pytest.mark.django_db(transaction=True)  # async tests: real commits


@sockets_and_streams
async def test_a_user_past_the_socket_cap_is_told_why_and_others_are_not_affected(
    settings, member, outsider
):
    settings.MAX_SOCKETS_PER_USER = 2
    held = [(await open_socket("/ws/chat/", member))[0] for _ in range(2)]

    extra, connected, _ = await open_socket("/ws/chat/", member)
    assert connected  # accepted so the page can show the reason, then closed
    refusal = await extra.receive_json_from(timeout=10)
    assert refusal["type"] == "error" and refusal["code"] == "too_many"
    assert "2 chats open" in refusal["message"]
    assert (await extra.receive_output(timeout=10))["code"] == 4429

    other, connected, _ = await open_socket("/ws/chat/", outsider)
    assert connected and await other.receive_nothing(timeout=0.3)

    await held[0].disconnect()
    again, connected, _ = await open_socket("/ws/chat/", member)
    assert connected and await again.receive_nothing(timeout=0.3)
    for socket in (held[1], other, again):
        await socket.disconnect()


@sockets_and_streams
@pytest.mark.model
async def test_an_app_past_its_stream_cap_gets_a_429_and_the_next_request_after_one_ends_runs(
    settings, starter_model
):
    settings.MAX_STREAMS_PER_KEY = 1
    key, raw = await sync_to_async(ApiKey.create)("home-assistant")
    client = AsyncClient()
    auth = {"Authorization": f"Bearer {raw}"}
    body = {"model": starter_model.name, "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2}  # fmt: skip

    assert api_streams.take(f"apikey:{key.pk}", 1)  # its one answer is running
    try:
        refused = await client.post(
            "/v1/chat/completions", body, content_type="application/json", headers=auth
        )
    finally:
        api_streams.give_back(f"apikey:{key.pk}")
    assert refused.status_code == 429, refused.content
    assert refused["Retry-After"] == "1"
    assert refused.json()["error"]["code"] == "too_many_streams"

    answered = await client.post(
        "/v1/chat/completions", body, content_type="application/json", headers=auth
    )
    assert answered.status_code == 200, answered.content
    assert api_streams.held(f"apikey:{key.pk}") == 0  # given back when the answer ended


@pytest.mark.django_db
def test_keys_of_one_household_share_a_cache_partition_and_others_have_their_own():
    kitchen, _ = ApiKey.create("kitchen-tablet", household="home")
    voice, _ = ApiKey.create("voice", household="home")
    guest, _ = ApiKey.create("guest-script")
    assert kitchen.cache_partition == voice.cache_partition == "household:home"
    assert guest.cache_partition == f"apikey:{guest.pk}"


@pytest.mark.django_db
def test_an_admin_sets_a_household_when_making_a_key(admin_client):
    response = admin_client.post(
        "/api-keys/", {"name": "open-webui", "scope": "chat", "household": "home"}
    )
    assert response.status_code == 200
    assert ApiKey.objects.get(name="open-webui").household == "home"
