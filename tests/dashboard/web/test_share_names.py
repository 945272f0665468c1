"""The names the dashboard shows for the engine's shares: keys, Open WebUI's users behind a key,
people; what is unknown is shown as it is, and names are kept rather than asked for again."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dashboard.models import ApiKey
from dashboard.web import share_names as names_module
from dashboard.web.share_names import NAME_TTL_S, kept_names, share_names

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def nothing_kept():
    names_module._kept.clear()
    yield
    names_module._kept.clear()


def test_each_kind_of_share_is_shown_by_its_name(django_user_model):
    key, _ = ApiKey.create("paperless")
    webui, _ = ApiKey.create("open-webui")
    alice = django_user_model.objects.create_user("alice", password="pw-alice-123")
    shares = [f"apikey:{key.pk}", f"apikey:{webui.pk}:user:7f3a-b2", f"user:{alice.pk}"]
    assert share_names(shares) == {
        f"apikey:{key.pk}": "paperless",
        f"apikey:{webui.pk}:user:7f3a-b2": "open-webui · user 7f3a-b2",
        f"user:{alice.pk}": "alice",
    }


def test_what_is_not_known_is_shown_as_it_is(django_user_model):
    key, _ = ApiKey.create("gone")
    gone = key.pk
    key.delete()
    shares = [f"apikey:{gone}", "user:9999", "household:kitchen", "apikey:x", "user:",
              "apikey:" + "9" * 40, "anything else"]  # fmt: skip
    assert share_names(shares) == {share: share for share in shares}


def test_an_open_webui_user_id_is_shown_cut_short():
    key, _ = ApiKey.create("open-webui")
    long_id = "u" * 500
    name = share_names([f"apikey:{key.pk}:user:{long_id}"])[f"apikey:{key.pk}:user:{long_id}"]
    assert name == "open-webui · user " + "u" * 64


def test_names_are_kept_so_a_snapshot_a_few_times_a_second_costs_no_query(django_user_model):
    key, _ = ApiKey.create("paperless")
    bob = django_user_model.objects.create_user("bob", password="pw-bob-12345")
    shares = {f"apikey:{key.pk}", f"user:{bob.pk}"}
    with CaptureQueriesContext(connection) as first:
        share_names(shares, now=100.0)
    assert len(first) == 2  # one for the keys, one for the users
    with CaptureQueriesContext(connection) as again:
        assert share_names(shares, now=110.0)[f"apikey:{key.pk}"] == "paperless"
    assert len(again) == 0
    assert kept_names(shares, now=110.0) == share_names(shares, now=110.0)
    assert kept_names(shares | {"user:12345"}, now=110.0) is None  # one not kept: ask

    # A renamed key shows its new name once the kept one is old.
    key.name = "paperless-ai"
    key.save()
    assert kept_names(shares, now=100.0 + NAME_TTL_S) is None
    assert share_names(shares, now=100.0 + NAME_TTL_S)[f"apikey:{key.pk}"] == "paperless-ai"


def test_no_share_needs_no_query():
    with CaptureQueriesContext(connection) as queries:
        assert share_names([]) == {}
        assert share_names(["household:x"]) == {"household:x": "household:x"}
    assert len(queries) == 0
