"""The pages: login everywhere, a user's own conversations only, the dashboard for staff."""

import json
import re

import pytest
from django.test import Client

from dashboard.models import Conversation, Message
from inference.history import record_request

pytestmark = pytest.mark.django_db


def chat_data(response) -> dict:
    match = re.search(
        r'<script id="chat-data" type="application/json">(.*?)</script>', response.text, re.S
    )
    assert match, "the page embeds its data for chat.js"
    return json.loads(match.group(1))


@pytest.fixture
def alice(client, member):
    client.force_login(member)
    return client


@pytest.fixture
def boss(client, admin_user):
    client.force_login(admin_user)
    return client


@pytest.mark.parametrize("path", ["/", "/c/1/", "/dashboard/", "/dashboard/requests/"])
def test_every_page_sends_an_anonymous_visitor_to_the_login_page(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"] == f"/login/?next={path}"


def test_the_login_page_renders_its_form(client):
    response = client.get("/login/")
    assert response.status_code == 200
    assert 'name="csrfmiddlewaretoken"' in response.text
    assert 'name="password"' in response.text


def test_logging_in_needs_the_csrf_token(member):
    browser = Client(enforce_csrf_checks=True)
    refused = browser.post("/login/", {"username": "alice", "password": "pw-alice-123"})
    assert refused.status_code == 403

    page = browser.get("/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    accepted = browser.post(
        "/login/", {"username": "alice", "password": "pw-alice-123", "csrfmiddlewaretoken": token}
    )
    assert accepted.status_code == 302
    assert accepted["Location"] == "/"


def test_a_wrong_password_is_refused(client, member):
    response = client.post("/login/", {"username": "alice", "password": "nope"})
    assert response.status_code == 200
    assert "did not match" in response.text


def test_logging_out_is_a_post_and_ends_the_session(alice):
    assert alice.get("/").status_code == 200
    assert alice.post("/logout/").status_code == 302
    assert alice.get("/").status_code == 302


def test_the_chat_page_lists_only_the_users_own_conversations(
    alice, member, outsider, starter_model
):
    Conversation.objects.create(user=member, title="my plans")
    Conversation.objects.create(user=outsider, title="their secrets")
    response = alice.get("/")
    assert response.status_code == 200
    assert "my plans" in response.text
    assert "their secrets" not in response.text
    data = chat_data(response)
    assert data["conversation"] is None
    assert data["models"] == [starter_model.name]
    assert data["model"] == starter_model.name


def test_a_conversation_page_carries_its_messages_and_figures(alice, member):
    conversation = Conversation.objects.create(user=member, title="t", system_prompt="Be brief.")
    Message.objects.create(conversation=conversation, role="user", content="hi <b>there</b>")
    Message.objects.create(
        conversation=conversation, role="assistant", content="<script>alert(1)</script>",
        state="stopped", error="stopped by the user",
        figures={"ttft": 0.1, "prompt_tps": 900.0, "decode_tps": 40.0, "timeline": []},
    )  # fmt: skip
    response = alice.get(f"/c/{conversation.pk}/")
    assert response.status_code == 200
    data = chat_data(response)
    assert data["conversation"]["system_prompt"] == "Be brief."
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert data["messages"][1]["state"] == "stopped"
    assert data["messages"][1]["figures"] == {"ttft": 0.1, "prompt_tps": 900.0, "decode_tps": 40.0}
    # Message text reaches the page only inside the JSON, escaped: never as markup.
    assert "<script>alert(1)</script>" not in response.text
    assert "<b>there</b>" not in response.text


def test_an_answer_left_streaming_by_a_dead_process_shows_as_interrupted(alice, member):
    conversation = Conversation.objects.create(user=member)
    Message.objects.create(
        conversation=conversation, role="assistant", content="half", state="streaming"
    )
    data = chat_data(alice.get(f"/c/{conversation.pk}/"))
    assert data["messages"][0]["state"] == "stopped"
    assert "interrupted" in data["messages"][0]["error"]


def test_someone_elses_conversation_is_a_404(alice, outsider):
    theirs = Conversation.objects.create(user=outsider, title="their secrets")
    response = alice.get(f"/c/{theirs.pk}/")
    assert response.status_code == 404
    assert "their secrets" not in response.text


def test_deleting_a_conversation_takes_a_post_by_its_owner(alice, member, outsider):
    mine = Conversation.objects.create(user=member)
    theirs = Conversation.objects.create(user=outsider)
    assert alice.get(f"/c/{mine.pk}/delete/").status_code == 405
    assert alice.post(f"/c/{theirs.pk}/delete/").status_code == 404
    assert alice.post(f"/c/{mine.pk}/delete/").status_code == 302
    assert list(Conversation.objects.values_list("pk", flat=True)) == [theirs.pk]


def test_the_pages_forbid_inline_scripts(alice):
    policy = alice.get("/")["Content-Security-Policy"]
    assert "script-src 'self'" in policy
    assert "unsafe-inline" not in policy.split("script-src")[1].split(";")[0]
    assert "frame-ancestors 'none'" in policy


def test_the_dashboard_is_forbidden_to_non_staff(alice):
    assert alice.get("/dashboard/").status_code == 403
    assert alice.get("/dashboard/requests/").status_code == 403


def test_the_dashboard_renders_for_staff_with_the_recent_requests(boss):
    record_request(
        request_id="r1", model_name="m", source="chat", client="alice", outcome="stop",
        figures={"ttft": 0.25, "total_time": 1.0,
                 "timeline": [{"phase": "queue", "start": 0.0, "end": 0.01}]},
    )  # fmt: skip
    response = boss.get("/dashboard/")
    assert response.status_code == 200
    assert "Why prompt and output speeds differ" in response.text
    assert 'id="c-prompt"' in response.text and 'id="c-output"' in response.text
    assert "<h2>Runners</h2>" in response.text and 'id="runners"' in response.text
    rows = boss.get("/dashboard/requests/").json()["requests"]
    assert [(r["request_id"], r["ttft"]) for r in rows] == [("r1", 0.25)]
    assert rows[0]["timeline"] == [{"phase": "queue", "start": 0.0, "end": 0.01}]


def test_the_nav_shows_admin_links_to_staff_only(alice, client, admin_user):
    member_page = alice.get("/").text
    assert 'href="/models/"' not in member_page and "Log out" in member_page
    client.force_login(admin_user)
    boss_page = client.get("/").text
    for href in ('href="/dashboard/"', 'href="/models/"', 'href="/api-keys/"', 'href="/admin/"'):
        assert href in boss_page
