"""The /api-keys/ page: staff only, a new key shown once and stored as a hash, revocation."""

import re

import pytest
from django.core.management import CommandError, call_command

from dashboard.models import ApiKey

pytestmark = pytest.mark.django_db


def test_anonymous_visitors_are_sent_to_the_login_page(client):
    response = client.get("/api-keys/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_a_member_who_is_not_staff_gets_a_403(client, member):
    client.force_login(member)
    assert client.get("/api-keys/").status_code == 403
    assert client.post("/api-keys/", {"name": "x", "scope": "admin"}).status_code == 403
    assert not ApiKey.objects.exists()


def test_staff_create_a_key_that_is_shown_once_and_stored_hashed(client, admin_user):
    client.force_login(admin_user)
    response = client.post("/api-keys/", {"name": "home-assistant", "scope": "chat"})
    assert response.status_code == 200
    raw = re.search(r'<code id="new-key">([^<]+)</code>', response.content.decode()).group(1)
    key = ApiKey.objects.get(name="home-assistant")
    assert key.key_hash == ApiKey.hash(raw) and raw.startswith(key.prefix)
    assert raw not in str(ApiKey.objects.values_list())
    listing = client.get("/api-keys/").content.decode()
    assert "home-assistant" in listing and key.prefix in listing
    assert raw not in listing  # shown only in the answer to the form


def test_a_duplicate_name_is_refused(client, admin_user):
    ApiKey.create("nas")
    client.force_login(admin_user)
    response = client.post("/api-keys/", {"name": "nas", "scope": "chat"})
    assert response.status_code == 400
    assert ApiKey.objects.filter(name="nas").count() == 1


def test_staff_revoke_a_key_with_a_post_only_after_confirming(client, admin_user):
    key, _ = ApiKey.create("old-script")
    client.force_login(admin_user)
    assert client.get(f"/api-keys/{key.pk}/revoke/").status_code == 405

    asked = client.post(f"/api-keys/{key.pk}/revoke/")  # the table's Revoke… button
    assert asked.status_code == 200
    page = asked.content.decode()
    assert "Revoke the key old-script?" in page and 'name="confirm" value="yes"' in page
    key.refresh_from_db()
    assert not key.revoked  # nothing happens before the confirmation

    response = client.post(f"/api-keys/{key.pk}/revoke/", {"confirm": "yes"})
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.revoked


def test_a_member_cannot_revoke(client, member):
    key, _ = ApiKey.create("kept")
    client.force_login(member)
    assert client.post(f"/api-keys/{key.pk}/revoke/", {"confirm": "yes"}).status_code == 403
    key.refresh_from_db()
    assert not key.revoked


def test_the_new_key_comes_with_examples_for_this_box_and_a_copy_button(
    client, admin_user, starter_model, settings
):
    settings.ALLOWED_HOSTS = ["nas.local"]  # the name the household reaches the box by
    client.force_login(admin_user)
    response = client.post(
        "/api-keys/", {"name": "ha", "scope": "chat"}, HTTP_HOST="nas.local:8000"
    )
    page = response.content.decode()
    raw = re.search(r'<code id="new-key">([^<]+)</code>', page).group(1)
    assert 'data-copy="new-key"' in page and "js/keys.js" in page
    # Home Assistant's fields, then curl (both dialects) and the two Python clients.
    assert '<code id="ha-url">http://nas.local:8000</code>' in page
    assert f'<code id="ha-key">{raw}</code>' in page
    assert f'<code id="ha-model">{starter_model.name}</code>' in page
    assert "curl http://nas.local:8000/v1/chat/completions" in page
    assert "curl http://nas.local:8000/api/chat" in page
    assert (
        f"OpenAI(base_url=&quot;http://nas.local:8000/v1&quot;, api_key=&quot;{raw}&quot;)" in page
    )
    assert f"Bearer {raw}" in page and "from ollama import Client" in page
    # Without a new key the examples say where the key goes, and hold none.
    listing = client.get("/api-keys/", HTTP_HOST="nas.local:8000").content.decode()
    assert "YOUR_KEY" in listing and raw not in listing


def test_forms_need_the_csrf_token(admin_user):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    assert client.post("/api-keys/", {"name": "x", "scope": "chat"}).status_code == 403


def test_the_command_prints_a_working_key_once(capsys):
    call_command("create_api_key", "backup-box", "--scope", "admin")
    raw = capsys.readouterr().out.strip()
    key = ApiKey.objects.get(name="backup-box")
    assert key.scope == "admin" and key.key_hash == ApiKey.hash(raw)
    with pytest.raises(CommandError):
        call_command("create_api_key", "backup-box")


# --- priority ----------------------------------------------------------------------------------


def test_a_new_key_is_interactive_unless_staff_make_it_background(client, admin_user):
    client.force_login(admin_user)
    client.post("/api-keys/", {"name": "open-webui", "scope": "chat"})
    client.post("/api-keys/", {"name": "paperless", "scope": "chat", "priority": "background"})
    assert ApiKey.objects.get(name="open-webui").priority == "interactive"
    assert ApiKey.objects.get(name="paperless").priority == "background"
    page = client.get("/api-keys/").content.decode()
    assert '<option value="background" selected>background</option>' in page  # paperless's row


def test_staff_change_a_keys_priority_from_its_row(client, admin_user):
    key, _ = ApiKey.create("karakeep")
    client.force_login(admin_user)
    assert client.get(f"/api-keys/{key.pk}/priority/").status_code == 405

    response = client.post(f"/api-keys/{key.pk}/priority/", {"priority": "background"})
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.priority == "background"

    client.post(f"/api-keys/{key.pk}/priority/", {"priority": "urgent"})  # no such priority
    key.refresh_from_db()
    assert key.priority == "background"


def test_a_member_cannot_change_a_keys_priority(client, member):
    key, _ = ApiKey.create("frigate")
    client.force_login(member)
    assert client.post(f"/api-keys/{key.pk}/priority/", {"priority": "background"}).status_code == (
        403
    )
    key.refresh_from_db()
    assert key.priority == "interactive"


def test_the_command_creates_a_background_key(capsys):
    call_command("create_api_key", "tagger", "--priority", "background")
    raw = capsys.readouterr().out.strip()
    key = ApiKey.objects.get(name="tagger")
    assert key.priority == "background" and key.key_hash == ApiKey.hash(raw)
    call_command("create_api_key", "assistant")
    assert ApiKey.objects.get(name="assistant").priority == "interactive"
    with pytest.raises(CommandError):
        call_command("create_api_key", "x", "--priority", "urgent")


def test_the_key_priorities_are_the_engines():
    from inference.engine.generation import PRIORITIES

    assert tuple(ApiKey.Priority.values) == PRIORITIES
