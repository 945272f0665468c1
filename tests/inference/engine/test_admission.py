"""Whose turn it is: the fair-share admission order, on hand-built requests (no scheduler)."""

import pytest

from inference.engine.admission import FairShare
from inference.engine.params import SamplingParams
from inference.engine.request import Request

NOW = 100.0


def request(rid: str, share: str | None, *, at: float = 0.0, tokens: int = 10,
            priority: str = "interactive") -> Request:  # fmt: skip
    return Request(rid, [1] * tokens, SamplingParams(), at, priority=priority, share=share)


def ids(requests: list[Request]) -> list[str]:
    return [r.id for r in requests]


def test_interactive_requests_come_before_any_background_request():
    fair = FairShare()
    waiting = [request("b1", "app", at=1, priority="background"),
               request("b2", "other", at=2, priority="background"),
               request("i1", "app", at=3)]  # fmt: skip
    assert ids(fair.order(waiting, [], NOW)) == ["i1", "b1", "b2"]


def test_a_persons_first_request_is_next_while_another_share_has_30_waiting():
    fair = FairShare()
    fair.charge("apikey:3", 50_000, NOW)  # the app has been served a lot
    backlog = [request(f"a{i}", "apikey:3", at=i, tokens=800) for i in range(30)]
    person = request("p", "user:5", at=31)
    running = [request("r", "apikey:3")]
    assert fair.order([*backlog, person], running, NOW)[0] is person


def test_a_first_request_is_at_most_one_turn_behind_another_shares_backlog():
    fair = FairShare()
    fair.charge("user:5", 9_000, NOW)  # the person was served more than the app, recently
    fair.charge("apikey:3", 100, NOW)
    backlog = [request(f"a{i}", "apikey:3", at=i, tokens=800) for i in range(30)]
    person = request("p", "user:5", at=31)
    assert fair.order([*backlog, person], [], NOW).index(person) == 1


def test_a_share_with_work_running_waits_for_its_turn_by_the_tokens_it_was_served():
    fair = FairShare()
    fair.charge("user:5", 9_000, NOW)
    fair.charge("apikey:3", 100, NOW)
    backlog = [request(f"a{i}", "apikey:3", at=i, tokens=800) for i in range(30)]
    person = request("p", "user:5", at=31)
    running = [request("r", "user:5")]
    # 100 + 800 k < 9000 for k = 0..11: twelve of the app's requests come first.
    assert fair.order([*backlog, person], running, NOW).index(person) == 12


def test_the_share_served_fewer_tokens_gets_more_turns_whatever_its_requests_sizes():
    fair = FairShare()
    big = [request(f"big{i}", "a", at=i, tokens=400) for i in range(4)]
    small = [request(f"small{i}", "b", at=10 + i, tokens=100) for i in range(8)]
    order = ids(fair.order([*big, *small], [], NOW))
    # Tags in prompt tokens: a at 0, 400, 800, 1200; b at 0, 100, ..., 700.
    assert order[:7] == ["big0", "small0", "small1", "small2", "small3", "big1", "small4"]


def test_within_a_share_requests_keep_their_arrival_order():
    fair = FairShare()
    waiting = [request(f"r{i}", "app", at=i, tokens=100 - i) for i in range(5)]
    assert ids(fair.order(waiting, [], NOW)) == ["r0", "r1", "r2", "r3", "r4"]


def test_requests_without_a_share_are_one_anonymous_share():
    fair = FairShare()
    fair.charge(None, 5_000, NOW)
    anonymous = [request(f"n{i}", None, at=i) for i in range(3)]
    person = request("p", "user:5", at=9)
    running = [request("r", None)]
    assert ids(fair.order([*anonymous, person], running, NOW)) == ["p", "n0", "n1", "n2"]


def test_usage_halves_every_half_life_and_is_forgotten_when_it_is_nothing():
    fair = FairShare(half_life=10.0)
    fair.charge("app", 1000, 0.0)
    assert fair.usage("app", 10.0) == pytest.approx(500)
    assert fair.usage("app", 30.0) == pytest.approx(125)
    fair.charge("app", 100, 30.0)
    assert fair.usage("app", 30.0) == pytest.approx(225)
    fair.forget(500.0)
    assert fair.usage("app", 500.0) == 0.0 and not fair._usage
