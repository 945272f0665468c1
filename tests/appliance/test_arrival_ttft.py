"""A request's clock starts when it reaches the application (the gate's stamp), not when the view
gets to it: time spent before the view (here an artificially slow key check) is in the TTFT the
answer reports, and the server's figure never exceeds what the client itself measured."""

import asyncio
import time

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.core.asgi import get_asgi_application

from appliance.gate import BodyGate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.model]

DELAY = 0.3  # seconds the key check is slowed by


@pytest.fixture
def short_answers(starter_model):
    starter_model.default_params = {"max_tokens": 4}
    starter_model.save()
    return starter_model


async def test_ttft_counts_the_time_before_the_view(short_answers, monkeypatch):
    from dashboard.api import auth
    from dashboard.models import ApiKey

    _, raw = await sync_to_async(ApiKey.create)("ttft-app")
    real = auth.authenticate

    async def slow_authenticate(request, scope):
        await asyncio.sleep(DELAY)
        return await real(request, scope)

    monkeypatch.setattr(auth, "authenticate", slow_authenticate)
    transport = httpx.ASGITransport(app=BodyGate(get_asgi_application()))
    body = {"model": short_answers.name, "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4}  # fmt: skip
    servers, clients = [], []
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        for _ in range(3):
            start = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=body, timeout=120,
                                         headers={"Authorization": f"Bearer {raw}"})  # fmt: skip
            clients.append((time.perf_counter() - start) * 1000)
            assert response.status_code == 200, response.text
            servers.append(response.json()["timings"]["ttft_ms"])
    servers.sort()
    clients.sort()
    server, client_ms = servers[1], clients[1]  # medians
    assert server >= DELAY * 1000, (servers, clients)  # the slow key check is in it
    assert server <= client_ms + 50, (servers, clients)  # the client waited at least as long
