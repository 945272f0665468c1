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


def test_staff_revoke_a_key_with_a_post_only(client, admin_user):
    key, _ = ApiKey.create("old-script")
    client.force_login(admin_user)
    assert client.get(f"/api-keys/{key.pk}/revoke/").status_code == 405
    response = client.post(f"/api-keys/{key.pk}/revoke/")
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.revoked


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
