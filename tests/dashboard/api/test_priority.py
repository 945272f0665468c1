"""Who asked, as a generation takes it (dashboard.api.auth.caller_fields): the priority a request
runs at (its key's, or lower when it asks: never higher) and its share in fair-share admission
(its key's, or one of its app's users when Open WebUI names them), the same in every
generation view."""

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient, RequestFactory

from dashboard.api.auth import caller_fields
from dashboard.api.errors import ApiError
from dashboard.models import ApiKey
from inference.engine.host import EngineHost
from inference.serving import client as client_module
from inference.serving.client import EmbeddedClient, set_client
from tests.inference.engine.fakes import FakeRunner, engines_on

pytestmark = pytest.mark.django_db

PRIORITY = "HTTP_X_APPLIANCE_PRIORITY"
USER = "HTTP_X_OPENWEBUI_USER_ID"


def asking(key: ApiKey, **headers):
    request = RequestFactory().post("/v1/chat/completions", **headers)
    request.api_key = key
    return request


@pytest.fixture
def interactive_key():
    return ApiKey.create("open-webui")[0]


@pytest.fixture
def background_key():
    return ApiKey.create("paperless", priority=ApiKey.Priority.BACKGROUND)[0]


def test_a_request_runs_at_its_keys_priority(interactive_key, background_key):
    assert caller_fields(asking(interactive_key))["priority"] == "interactive"
    assert caller_fields(asking(background_key))["priority"] == "background"


def test_a_request_on_a_background_key_cannot_raise_its_priority(background_key):
    request = asking(background_key, **{PRIORITY: "interactive"})
    assert caller_fields(request, asked="interactive")["priority"] == "background"


def test_the_priority_header_lowers_a_requests_priority(interactive_key):
    for value in ("background", " Background "):
        assert caller_fields(asking(interactive_key, **{PRIORITY: value}))["priority"] == (
            "background"
        )
    assert caller_fields(asking(interactive_key, **{PRIORITY: "interactive"}))["priority"] == (
        "interactive"
    )


def test_a_flex_service_tier_lowers_it_as_the_header_does(interactive_key):
    assert caller_fields(asking(interactive_key), asked="background")["priority"] == "background"


def test_a_priority_header_that_is_not_a_priority_is_a_400_naming_it(interactive_key):
    with pytest.raises(ApiError) as refused:
        caller_fields(asking(interactive_key, **{PRIORITY: "urgent"}))
    assert refused.value.status == 400
    assert refused.value.param == "X-Appliance-Priority"


def test_requests_take_their_keys_share(interactive_key):
    fields = caller_fields(asking(interactive_key))
    assert fields["share"] == f"apikey:{interactive_key.pk}"
    assert fields["cache_partition"] == f"apikey:{interactive_key.pk}"


def test_open_webuis_user_header_narrows_the_share_to_one_of_the_apps_users(interactive_key):
    user = "4f1c2a9e-7b1d-4d8e-9a43-0c5e2f1b7d6a"
    fields = caller_fields(asking(interactive_key, **{USER: user}))
    assert fields["share"] == f"apikey:{interactive_key.pk}:user:{user}"
    # Only the share: the cache partition and conversation stay the key's.
    assert fields["cache_partition"] == f"apikey:{interactive_key.pk}"
    assert fields["cache_key"] == f"apikey:{interactive_key.pk}"


@pytest.mark.parametrize("user", ["x" * 65, "a b", "../etc", "<script>", "-leading", "a:b", ""])
def test_a_user_header_that_is_not_a_plain_id_is_ignored(interactive_key, user):
    assert caller_fields(asking(interactive_key, **{USER: user}))["share"] == (
        f"apikey:{interactive_key.pk}"
    )


# --- every generation view -------------------------------------------------------------------


class RecordingClient(EmbeddedClient):
    """The embedded client on fake runners, keeping every request it was asked to stream."""

    def __init__(self):
        runner = FakeRunner(n_ctx=4096, ctx_per_seq=1024)
        super().__init__(EngineHost(engines_on(lambda config: runner)))
        self.requests = []

    def stream(self, request, spec):
        self.requests.append(request)
        return super().stream(request, spec)


@pytest.fixture
def recording():
    previous = client_module._client
    client = RecordingClient()
    set_client(client)
    yield client
    set_client(previous)
    client.host.shutdown()


def _bodies(model: str) -> dict[str, dict]:
    messages = [{"role": "user", "content": "Hi"}]
    return {
        "/v1/chat/completions": {"model": model, "messages": messages, "max_tokens": 2},
        "/v1/completions": {"model": model, "prompt": "Hi", "max_tokens": 2},
        "/api/chat": {"model": model, "messages": messages, "stream": False,
                      "options": {"num_predict": 2}},
        "/api/generate": {"model": model, "prompt": "Hi", "stream": False,
                          "options": {"num_predict": 2}},
    }  # fmt: skip


@pytest.mark.django_db(transaction=True)  # async: the view reads the key from another thread
@pytest.mark.parametrize("path", list(_bodies("m")))
async def test_every_generation_view_passes_who_asked_the_same_way(path, recording, starter_model):
    key, raw = await sync_to_async(ApiKey.create)("open-webui")
    headers = {"Authorization": f"Bearer {raw}", "X-Appliance-Priority": "background",
               "X-OpenWebUI-User-Id": "u-1", "X-OpenWebUI-Chat-Id": "chat-7"}  # fmt: skip
    body = _bodies(starter_model.name)[path]
    response = await AsyncClient().post(path, body, content_type="application/json",
                                        headers=headers)  # fmt: skip
    assert response.status_code == 200, response.content
    (asked,) = recording.requests
    assert asked.priority == "background"
    assert asked.share == f"apikey:{key.pk}:user:u-1"
    assert asked.cache_key == f"apikey:{key.pk}:chat:chat-7"
    assert asked.cache_partition == f"apikey:{key.pk}"


def test_the_longest_ids_the_headers_may_carry_still_make_a_request_the_engine_takes(
    interactive_key,
):
    from inference.engine import GenerationRequest, SamplingParams

    interactive_key.pk = 10**12  # a key id far beyond any box's
    fields = caller_fields(asking(interactive_key, HTTP_X_OPENWEBUI_CHAT_ID="c" * 96,
                                  **{USER: "u" * 64}))  # fmt: skip
    assert fields["cache_key"].endswith(":chat:" + "c" * 96)
    assert fields["share"].endswith(":user:" + "u" * 64)
    GenerationRequest("hi", SamplingParams(), **fields)  # within MAX_ID_CHARS: not refused
    too_long = caller_fields(asking(interactive_key, HTTP_X_OPENWEBUI_CHAT_ID="c" * 97))
    assert too_long["cache_key"] == f"apikey:{interactive_key.pk}"  # ignored, as a bad one is
