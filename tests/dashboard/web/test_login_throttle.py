"""Failed sign-ins are limited per account and per client address: past the limit the login
page refuses even the right password, says how long to wait, and lets it in once that is over."""

import pytest
from django.core.cache import cache

from dashboard.web import throttle

pytestmark = pytest.mark.django_db

BOSS = ("boss", "pw-boss-123")  # the admin_user fixture
ALICE = ("alice", "pw-alice-123")  # the member fixture
ATTACKER = "10.0.0.66"


@pytest.fixture(autouse=True)
def limits(settings):
    settings.LOGIN_FAILURES_PER_ACCOUNT = 5
    settings.LOGIN_FAILURES_PER_ADDRESS = 20
    settings.LOGIN_LOCKOUT_MINUTES = 15
    cache.clear()
    yield settings
    cache.clear()


@pytest.fixture
def clock(monkeypatch):
    """The throttle's clock, moved by hand."""

    class Clock:
        now = 1_800_000_000.0

        def __call__(self) -> float:
            return self.now

        def advance(self, minutes: float) -> None:
            self.now += minutes * 60

    fake = Clock()
    monkeypatch.setattr(throttle, "clock", fake)
    return fake


def sign_in(client, username: str, password: str, address: str = ATTACKER, path="/login/"):
    return client.post(path, {"username": username, "password": password}, REMOTE_ADDR=address)


def signed_in(client) -> bool:
    return "_auth_user_id" in client.session


def test_thirty_wrong_passwords_then_the_right_one_is_refused_with_the_wait(
    client, admin_user, clock
):
    answers = [sign_in(client, "boss", f"guess-{i}") for i in range(30)]
    assert [a.status_code for a in answers[:5]] == [200] * 5
    assert all("did not match" in a.text for a in answers[:5])
    assert {a.status_code for a in answers[5:]} == {429}

    right = sign_in(client, *BOSS)
    assert right.status_code == 429 and not signed_in(client)
    assert "Too many failed sign-ins for this account; try again in 15 minutes." in right.text
    assert int(right["Retry-After"]) == 15 * 60


def test_the_page_counts_the_minutes_down(client, admin_user, clock):
    for i in range(5):
        sign_in(client, "boss", f"guess-{i}")
    clock.advance(3)
    refused = sign_in(client, *BOSS)
    assert "Too many failed sign-ins for this account; try again in 12 minutes." in refused.text
    clock.advance(11.5)
    assert "try again in 1 minute." in sign_in(client, *BOSS).text


def test_another_account_from_another_address_still_signs_in(client, admin_user, member, clock):
    for i in range(30):
        sign_in(client, "boss", f"guess-{i}")
    response = sign_in(client, *ALICE, address="10.0.0.7")
    assert response.status_code == 302 and signed_in(client)


def test_after_the_window_the_right_password_works(client, admin_user, clock):
    for i in range(30):
        sign_in(client, "boss", f"guess-{i}")
    clock.advance(14.9)
    assert sign_in(client, *BOSS).status_code == 429
    clock.advance(0.2)
    response = sign_in(client, *BOSS)
    assert response.status_code == 302 and signed_in(client)


def test_a_success_starts_the_accounts_count_again(client, admin_user, clock):
    for _ in range(2):
        for i in range(4):
            assert sign_in(client, "boss", f"guess-{i}").status_code == 200
        assert sign_in(client, *BOSS).status_code == 302
        client.logout()


def test_the_user_names_case_does_not_buy_more_guesses(client, admin_user, clock):
    for name in ("boss", "Boss", "BOSS", " boss", "bOsS"):
        sign_in(client, name, "guess")
    assert sign_in(client, *BOSS).status_code == 429


def test_unknown_accounts_are_counted_like_real_ones(client, db, clock):
    answers = [sign_in(client, "nobody", f"guess-{i}") for i in range(6)]
    assert [a.status_code for a in answers] == [200] * 5 + [429]
    assert "for this account" in answers[-1].text


def test_too_many_failures_from_one_address_refuse_every_account_from_it(client, member, clock):
    for i in range(20):  # one guess each at twenty names: no account reaches its own limit
        assert sign_in(client, f"user-{i}", "guess").status_code == 200
    refused = sign_in(client, *ALICE)
    assert refused.status_code == 429 and not signed_in(client)
    assert "Too many failed sign-ins from this address; try again in 15 minutes." in refused.text
    assert sign_in(client, *ALICE, address="10.0.0.8").status_code == 302


def test_each_guess_is_counted_before_its_password_is_checked(db, clock):
    """So guesses sent in parallel cannot all pass the check before the first is counted."""
    for _ in range(5):
        throttle.begin("boss", ATTACKER)  # under way: not reported yet
    with pytest.raises(throttle.Throttled, match="for this account"):
        throttle.begin("boss", ATTACKER)


def test_the_admin_login_page_counts_against_the_same_limit(client, admin_user, clock):
    for i in range(5):
        sign_in(client, "boss", f"guess-{i}", path="/admin/login/")
    response = sign_in(client, *BOSS, path="/admin/login/")
    assert not signed_in(client)
    assert "Too many failed sign-ins for this account" in response.text
    assert sign_in(client, *BOSS).status_code == 429  # and /login/ agrees


def test_a_broken_cache_lets_sign_ins_through(client, admin_user, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise ConnectionError("the cache is down")

    monkeypatch.setattr(cache, "get_many", broken)
    assert sign_in(client, *BOSS).status_code == 302
    assert "not throttled" in caplog.text
