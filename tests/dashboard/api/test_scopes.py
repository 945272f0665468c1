"""API key scopes nest, chat < manage < admin; the command and the keys page make all three; a
chat key's keep_alive can shorten a model's own keep-alive but never lengthen or pin it."""

import pytest
from django.core.management import call_command

from dashboard.api.auth import granted_keep_alive as _granted_keep_alive
from dashboard.api.auth import require_scope
from dashboard.api.errors import ApiError
from dashboard.models import ApiKey
from inference.models import LLMModel

pytestmark = pytest.mark.django_db

CHAT, MANAGE, ADMIN = ApiKey.Scope.CHAT, ApiKey.Scope.MANAGE, ApiKey.Scope.ADMIN


def key(scope: str) -> ApiKey:
    return ApiKey(name=f"{scope}-app", scope=scope)


@pytest.mark.parametrize(
    ("scope", "allowed"),
    [(CHAT, {CHAT}), (MANAGE, {CHAT, MANAGE}), (ADMIN, {CHAT, MANAGE, ADMIN})],
)
def test_each_scope_includes_the_narrower_ones(scope, allowed):
    assert {s for s in ApiKey.Scope.values if key(scope).allows(s)} == allowed


def test_an_unknown_scope_allows_nothing():
    assert not key("root").allows(CHAT)
    assert not key(ADMIN).allows("root")


def test_a_chat_key_is_told_which_scope_it_needs():
    with pytest.raises(ApiError) as refused:
        require_scope(key(CHAT), MANAGE, "loading a model with an empty prompt")
    assert refused.value.status == 403
    assert refused.value.body("ollama") == {
        "error": "loading a model with an empty prompt needs an API key with the manage scope "
        "(or admin); this key has the chat scope"
    }
    require_scope(key(MANAGE), MANAGE)
    require_scope(key(ADMIN), MANAGE)


def test_the_command_makes_a_manage_key(capsys):
    call_command("create_api_key", "ollama-cli", "--scope", "manage")
    raw = capsys.readouterr().out.strip()
    made = ApiKey.objects.get(name="ollama-cli")
    assert made.scope == MANAGE and made.key_hash == ApiKey.hash(raw)


def test_the_keys_page_offers_the_manage_scope(client, admin_user):
    client.force_login(admin_user)
    page = client.get("/api-keys/").text
    assert page.index('value="chat"') < page.index('value="manage"') < page.index('value="admin"')
    assert client.post("/api-keys/", {"name": "ollama-cli", "scope": "manage"}).status_code == 200
    assert ApiKey.objects.get(name="ollama-cli").scope == MANAGE


def model(keep_alive: str) -> LLMModel:
    return LLMModel(name="m", file_path="/models/m.gguf", keep_alive=keep_alive)


# (the model's own keep-alive, what the request asks, what a chat key gets; None: the model's)
CHAT_KEEP_ALIVE = [
    ("5m", None, None),
    ("5m", -1.0, None),  # Home Assistant's "keep loaded": the model's five minutes
    ("5m", 3600.0, None),
    ("5m", 60.0, 60.0),  # shorter is kept
    ("5m", 0.0, 0.0),
    ("-1", -1.0, -1.0),  # the model stays loaded anyway
    ("-1", 0.0, 0.0),
]


@pytest.mark.parametrize(("own", "asked", "granted"), CHAT_KEEP_ALIVE)
def test_a_chat_keys_keep_alive_is_clamped_to_the_models_own(own, asked, granted):
    assert _granted_keep_alive(key(CHAT), model(own), asked) == granted


def test_without_a_keep_alive_of_its_own_the_model_has_the_servers_default(settings):
    settings.DEFAULT_KEEP_ALIVE = "10m"
    assert _granted_keep_alive(key(CHAT), model(""), -1.0) is None
    assert _granted_keep_alive(key(CHAT), model(""), 300.0) == 300.0


@pytest.mark.parametrize("scope", [MANAGE, ADMIN])
def test_manage_and_admin_keys_keep_alive_is_used_as_sent(scope):
    assert _granted_keep_alive(key(scope), model("5m"), -1.0) == -1.0
    assert _granted_keep_alive(key(scope), model("5m"), 3600.0) == 3600.0
